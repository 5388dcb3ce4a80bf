"""Model catalog: Llama-style dense transformers and MoE transformers (Mixtral, fine-grained).

Shapes follow the published configs. ``llama-80b`` is the 80-layer, 8192-wide model of the
Ultra-Scale Playbook benchmark (the Llama-3-70B shape; the playbook labels it 80B). The
fine-grained MoE is shaped like DeepSeek-V2-Lite (64 routed experts, top-6, 2 shared experts,
first layer dense) with standard multi-head attention in place of MLA.
"""

from __future__ import annotations

from dataclasses import dataclass

from infrarsi.errors import IllegalConfigError

__all__ = ["ModelShape", "MODELS", "model"]


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer with SwiGLU MLPs and grouped-query attention."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int  # dense MLP width (dense layers of a MoE too)
    vocab_size: int
    tied_embeddings: bool = False
    num_experts: int = 0
    top_k: int = 0
    expert_ffn_hidden_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0  # leading layers with a dense MLP in a MoE

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_dim(self) -> int:
        return self.hidden_size // self.num_heads * self.num_kv_heads

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    # ---- parameter counts (per layer unless stated) ----------------------------------
    @property
    def attn_params(self) -> int:
        h = self.hidden_size
        return 2 * h * h + 2 * h * self.kv_dim + 2 * h  # q, o, k, v, two norms

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.ffn_hidden_size

    @property
    def expert_params(self) -> int:
        """One routed expert."""
        return 3 * self.hidden_size * self.expert_ffn_hidden_size

    @property
    def shared_mlp_params(self) -> int:
        """Shared experts plus router of one MoE layer (replicated like dense weights)."""
        return self.num_shared_experts * self.expert_params + self.hidden_size * self.num_experts

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def num_params(self) -> int:
        dense = self.num_layers - self.num_moe_layers
        return (
            self.num_layers * self.attn_params
            + dense * self.dense_mlp_params
            + self.num_moe_layers * (self.shared_mlp_params + self.num_experts * self.expert_params)
            + self.embedding_params
        )

    @property
    def num_active_params(self) -> int:
        routed = self.num_moe_layers * (self.num_experts - self.top_k) * self.expert_params
        return self.num_params - routed

    def model_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, MFU convention: 6 N_active + 12 L h s (no recompute)."""
        return 6.0 * self.num_active_params + 12.0 * self.num_layers * self.hidden_size * seq_len


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128_256, tied_embeddings=True),
        ModelShape("llama-3.2-3b", 28, 3072, 24, 8, 8192, 128_256, tied_embeddings=True),
        ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128_256),
        ModelShape("llama-3-70b", 80, 8192, 64, 8, 28672, 128_256),
        ModelShape("llama-80b", 80, 8192, 64, 8, 28672, 128_256),
        ModelShape("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32_000, num_experts=8, top_k=2,
                   expert_ffn_hidden_size=14336),
        ModelShape("finegrained-moe-16b", 27, 2048, 16, 16, 10944, 102_400, num_experts=64,
                   top_k=6, expert_ffn_hidden_size=1408, num_shared_experts=2,
                   num_dense_layers=1),
    )
}


def model(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        raise IllegalConfigError(
            f"unknown model {name!r}; the catalog has {', '.join(MODELS)}"
        ) from None
