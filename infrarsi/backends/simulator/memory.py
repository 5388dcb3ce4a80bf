"""Peak memory per pipeline stage: model states per ZeRO stage, activations, overheads.

Model states (mixed precision, Adam): bf16 weights (2 B/param), fp32 gradients (4), fp32
master weights and two moments (12); ZeRO-1 shards the 12, ZeRO-2 also the gradients,
ZeRO-3 (FSDP) everything, over data x context parallel ranks (expert weights over the
ranks left after expert parallelism). fp8 adds a 1 B/param fp8 weight cache.

Activations per layer and micro-batch follow Korthikanti et al. (2022) for a Llama block with
flash attention (no s^2 term) and sequence parallelism, so every stored tensor is divided by
tp: ``T/tp * (12h + 4 kv_dim + 6 ffn)`` bytes for T tokens. Selective checkpointing keeps
the matmul inputs and recomputes the attention core and SwiGLU; full checkpointing keeps
only each layer's input plus one layer in flight. fp8 stores the linear inputs in 1 byte.
Under 1F1B the first stage holds ``min(pp, grad_acc)`` micro-batches in flight (times
``1 + (pp-1)/(pp v)`` when interleaved), so activation memory does not shrink with pp; the
last stage holds the logits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from infrarsi.backends.simulator._plan import Plan
from infrarsi.backends.simulator.params import SimParams

__all__ = ["MemoryBreakdown", "stage_memory", "peak_memory"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU of one pipeline stage."""

    states: float
    activations: float
    logits: float
    transient: float
    framework: float

    @property
    def total(self) -> float:
        return self.states + self.activations + self.logits + self.transient + self.framework


def _states_bytes(n_params: float, shard: int, zero: int, fp8: bool) -> float:
    weights = 2.0 / (shard if zero >= 3 else 1)
    grads = 4.0 / (shard if zero >= 2 else 1)
    optim = 12.0 / (shard if zero >= 1 else 1)
    cache = 1.0 if fp8 else 0.0
    return n_params * (weights + grads + optim + cache)


def _layer_activation_bytes(p: Plan, tokens: float) -> float:
    m = p.model
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    if m.is_moe:  # routed tokens through top_k experts (capacity-bounded) plus shared experts
        routed = p.capacity_factor * m.top_k * (2 * h + 6 * m.expert_ffn_hidden_size)
        f_bytes = routed + m.num_shared_experts * 6 * m.expert_ffn_hidden_size + 4 * m.num_experts
    else:
        f_bytes = 6 * f
    full = 12 * h + 4 * kv + f_bytes
    if p.ac == "full":
        return tokens * 2 * h / p.tp
    if p.ac == "selective":  # drop q/k/v, flash output, SwiGLU intermediate
        full -= 4 * h + 4 * kv + f_bytes / 3
    if p.fp8:  # linear inputs (qkv, o, up/gate, down) stored in one byte
        full -= 3 * h + f_bytes / 6
    return tokens * full / p.tp


def _stage_params(p: Plan, stage: int) -> tuple[float, float]:
    """(dense params, expert params) held by one GPU of ``stage``."""
    m = p.model
    layers = p.layers_per_stage
    moe_layers = p.moe_layers_per_stage
    dense = layers * m.attn_params + (layers - moe_layers) * m.dense_mlp_params
    dense += moe_layers * m.shared_mlp_params
    emb = m.vocab_size * m.hidden_size
    if stage == 0:
        dense += emb
    if stage == p.pp - 1 and (not m.tied_embeddings or p.pp > 1):
        dense += emb
    experts = moe_layers * m.num_experts * m.expert_params / p.ep
    return dense / p.tp, experts / p.tp


def stage_memory(p: Plan, stage: int, params: SimParams) -> MemoryBreakdown:
    m = p.model
    dense, experts = _stage_params(p, stage)
    states = _states_bytes(dense, p.shard_degree, p.zero, p.fp8)
    states += _states_bytes(experts, p.expert_shard_degree, p.zero, p.fp8)
    # micro-batches in flight on this stage under 1F1B (interleaving adds a fraction)
    inflight = min(p.pp - stage, p.grad_acc)
    if p.v > 1:
        inflight *= 1 + (p.pp - 1) / (p.pp * p.v)
    per_layer = _layer_activation_bytes(p, p.tokens_mb)
    acts = per_layer * p.layers_per_stage * inflight
    if p.ac == "full":  # one layer's full activations while it is recomputed
        acts += _layer_activation_bytes(dataclasses.replace(p, ac="none"), p.tokens_mb)
    acts *= params.activation_scale
    logits = 0.0
    if stage == p.pp - 1:
        logits = p.tokens_mb * m.vocab_size / p.tp * params.logits_bytes_per_elem
    transient = 0.0
    if p.zero >= 3:  # gathered weights of the current and the prefetched layer
        transient += 2 * 2.0 * (m.attn_params + max(m.dense_mlp_params, m.expert_params)) / p.tp
    elif p.shard_degree > 1:
        transient += 2 * p.bucket_bytes
    dynamic = acts + logits + transient
    return MemoryBreakdown(
        states=states,
        activations=acts,
        logits=logits,
        transient=transient + params.fragmentation * dynamic,
        framework=params.framework_bytes,
    )


def peak_memory(p: Plan, params: SimParams) -> list[float]:
    """Peak bytes of one GPU in each pipeline stage (index = stage)."""
    return [stage_memory(p, s, params).total for s in range(p.pp)]
