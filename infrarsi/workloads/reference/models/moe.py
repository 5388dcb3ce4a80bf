"""A Mixture-of-Experts decoder: top-k router, SwiGLU experts, load-balancing loss.

Dropless top-k routing (no capacity factor, Mixtral style) with a Switch-style load-balancing
loss computed per sequence and averaged over the batch, so the loss does not depend on how the
batch is split into micro-batches or ranks.

Expert parallelism: with ``expert_parallel_degree == world_size > 1`` each rank keeps
``num_experts / world_size`` experts; routed tokens go to the owning rank and come back with the
differentiable ``all_to_all_single``. Every rank first builds and initializes all experts with
the same seed, then keeps its slice, so initialization does not depend on the EP degree.

Like much research MoE code it dispatches with a Python loop over experts and syncs with the
host inside the step (``nonzero``, ``tolist``, ``.item()`` for routing statistics).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .layers import Block, DecoderLM, SwiGLU


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group):
    from torch.distributed.nn.functional import all_to_all_single

    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return all_to_all_single(out, x, out_splits, in_splits, group=group)


class MoEMLP(nn.Module):
    def __init__(self, shape: dict) -> None:
        super().__init__()
        h, f = shape["hidden_size"], shape["ffn_hidden_size"]
        self.num_experts = shape["num_experts"]
        self.top_k = shape["top_k"]
        self.router = nn.Linear(h, self.num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(h, f) for _ in range(self.num_experts))
        self.ep_rank, self.ep_size, self.group = 0, 1, None
        self.first_expert = 0
        self.tokens_per_expert: list[int] = []

    def shard_experts(self, rank: int, size: int, group) -> None:
        """Keep only this rank's slice of the (already initialized) experts."""
        per = self.num_experts // size
        self.ep_rank, self.ep_size, self.group = rank, size, group
        self.first_expert = rank * per
        self.experts = nn.ModuleList(list(self.experts)[rank * per:(rank + 1) * per])

    def _aux_loss(self, probs: torch.Tensor, topk_idx: torch.Tensor) -> torch.Tensor:
        # probs [B, T, E], topk_idx [B, T, k]: per-sequence Switch loss, mean over sequences.
        assigned = F.one_hot(topk_idx, self.num_experts).sum(2).float()  # [B, T, E]
        frac_tokens = assigned.mean(1) / self.top_k  # [B, E]
        frac_probs = probs.mean(1)  # [B, E]
        return self.num_experts * (frac_tokens * frac_probs).sum(-1).mean()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, H = x.shape
        logits = self.router(x).float()
        probs = logits.softmax(-1)
        topk_w, topk_idx = probs.topk(self.top_k, dim=-1)
        topk_w = topk_w / topk_w.sum(-1, keepdim=True)
        aux = self._aux_loss(probs, topk_idx)

        flat_x = x.reshape(B * T, H)
        flat_e = topk_idx.reshape(-1)  # [N*k]
        flat_w = topk_w.reshape(-1, 1)
        flat_tok = torch.arange(B * T, device=x.device).repeat_interleave(self.top_k)
        order = torch.argsort(flat_e, stable=True)
        counts = torch.bincount(flat_e, minlength=self.num_experts)
        self.tokens_per_expert = counts.tolist()  # routing statistics (host sync)

        routed = flat_x[flat_tok[order]]
        if self.ep_size > 1:
            out = self._dispatch_ep(routed, counts)
        else:
            out = self._run_experts(routed, flat_e[order] - self.first_expert)
        out = out * flat_w[order].to(out.dtype)
        y = torch.zeros_like(flat_x, dtype=out.dtype).index_add(0, flat_tok[order], out)
        return y.view(B, T, H).to(x.dtype), aux

    def _run_experts(self, routed: torch.Tensor, local_e: torch.Tensor) -> torch.Tensor:
        # One expert at a time; every expert runs (also on zero tokens) so all of its
        # parameters get a gradient.
        outputs, positions = [], []
        for j, expert in enumerate(self.experts):
            idx = (local_e == j).nonzero().squeeze(-1)
            outputs.append(expert(routed[idx]))
            positions.append(idx)
        out = torch.cat(outputs)
        result = torch.empty_like(out)
        return result.index_copy(0, torch.cat(positions), out)

    def _dispatch_ep(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        W, per = self.ep_size, self.num_experts // self.ep_size
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)  # [W * per] for my experts
        send_splits = counts.view(W, per).sum(1).tolist()
        recv_splits = recv_counts.view(W, per).sum(1).tolist()
        received = _all_to_all(routed, recv_splits, send_splits, self.group)
        local_e = torch.repeat_interleave(
            torch.arange(per, device=routed.device).repeat(W), recv_counts
        )
        out = self._run_experts(received, local_e)
        return _all_to_all(out, send_splits, recv_splits, self.group)


class MoELM(DecoderLM):
    def expert_parameters(self) -> list[nn.Parameter]:
        """Parameters owned by this expert-parallel rank (all experts when EP is off)."""
        return [p for blk in self.layers for p in blk.mlp.experts.parameters()]


def build_moe(shape: dict, parallel: dict) -> MoELM:
    h = shape["hidden_size"]
    blocks = [Block(h, shape["num_heads"], MoEMLP(shape)) for _ in range(shape["num_layers"])]
    model = MoELM(shape, blocks)
    ep = int(parallel.get("expert_parallel_degree", 1))
    if ep > 1:
        if ep != parallel["world_size"]:
            raise ValueError(
                f"expert_parallel_degree {ep} must equal world_size {parallel['world_size']}"
            )
        for blk in model.layers:
            blk.mlp.shard_experts(parallel["rank"], ep, parallel.get("group"))
    return model
