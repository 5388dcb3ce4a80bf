"""Entry point of the reference workspace (its interface is frozen by the task contract).

``build_model(shape, parallel)`` returns a ``torch.nn.Module`` whose
``forward(tokens[B, T] long) -> (logits[B, T, V], aux_loss scalar)``. It exposes
``model.layers`` (an ``nn.ModuleList`` of decoder blocks, which the harness may wrap for
activation checkpointing and FSDP) and, for MoE, ``model.expert_parameters()`` (the parameters
this expert-parallel rank owns).

Parallel layouts (``infrarsi.harness.tensor_parallel`` and ``pipeline``) ask two things more:
attention splits a fused projection with ``chunk`` and reshapes heads from its local width
(``self.num_heads``, ``reshape(B, T, -1)``), so tensor parallelism can shard heads; and
``forward`` is the children before ``layers``, the blocks (each returning ``(x, aux)``) and the
children after, in order, so pipeline parallelism can cut it into stages.

``shape``: vocab_size, hidden_size, num_layers, num_heads, ffn_hidden_size, num_experts, top_k,
aux_loss_weight, seq_len, family. ``parallel``: rank, world_size, expert_parallel_degree, group
(a process group or None).
"""

from __future__ import annotations

from torch import nn

from .models.dense import build_dense
from .models.moe import build_moe


def build_model(shape: dict, parallel: dict) -> nn.Module:
    if shape.get("family", "dense") == "moe":
        return build_moe(shape, parallel)
    return build_dense(shape)
