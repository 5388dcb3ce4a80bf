"""A config resolved into the quantities the memory and time models read."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infrarsi.backends.simulator.hardware import Cluster
from infrarsi.backends.simulator.models import ModelShape

# knob names (the real launch names) and their defaults
DEFAULTS: dict[str, Any] = {
    "data_parallel_degree": 1,
    "tensor_parallel_degree": 1,
    "pipeline_parallel_degree": 1,
    "pipeline_schedule": "1f1b",
    "num_virtual_pipeline_stages": 2,
    "context_parallel_degree": 1,
    "expert_parallel_degree": 1,
    "micro_batch_size": 1,
    "zero_stage": 0,
    "activation_checkpointing": "none",
    "precision": "bf16",
    "overlap_communication": True,
    "bucket_size_mb": 25,
    "compile": "off",
    "moe_dispatch": "all_to_all",
}


@dataclass(frozen=True)
class Plan:
    model: ModelShape
    cluster: Cluster
    seq_len: int
    capacity_factor: float
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    mbs: int
    grad_acc: int
    v: int  # virtual stages per pipeline rank (1 = plain 1F1B)
    zero: int
    ac: str
    fp8: bool
    overlap: bool
    bucket_bytes: float
    compile: bool
    dispatch: str

    @property
    def tokens_mb(self) -> float:
        """Tokens of one micro-batch on one GPU (context parallel splits the sequence)."""
        return self.mbs * self.seq_len / self.cp

    @property
    def layers_per_stage(self) -> int:
        return math.ceil(self.model.num_layers / self.pp)

    @property
    def moe_layers_per_stage(self) -> float:
        return self.model.num_moe_layers / self.pp

    @property
    def shard_degree(self) -> int:
        """Ranks ZeRO shards dense states over (data x context parallel)."""
        return self.dp * self.cp

    @property
    def expert_shard_degree(self) -> int:
        return max(self.dp * self.cp // self.ep, 1)

    # ---- which groups leave the node (placement order tp, cp, dp, pp; ep inside dp*cp)
    def spans_nodes(self, inner: int, size: int) -> bool:
        return size > 1 and inner * size > self.cluster.gpus_per_node

    def nodes_in_group(self, inner: int, size: int) -> int:
        return min(size, max(1, math.ceil(inner * size / self.cluster.gpus_per_node)))


def make_plan(
    config: Mapping[str, Any],
    model: ModelShape,
    cluster: Cluster,
    *,
    seq_len: int,
    global_batch_size: int | None = None,
    grad_acc: int | None = None,
    capacity_factor: float = 1.25,
) -> Plan:
    """Resolve ``config`` (knob names, missing ones at defaults); grad_acc is derived from the
    global batch unless given explicitly (a measured table row may carry its own)."""
    c = {**DEFAULTS, **config}
    dp, mbs = int(c["data_parallel_degree"]), int(c["micro_batch_size"])
    if grad_acc is None:
        assert global_batch_size is not None, "give global_batch_size or grad_acc"
        grad_acc = max(global_batch_size // (dp * mbs), 1)
    pp = int(c["pipeline_parallel_degree"])
    interleaved = pp > 1 and c["pipeline_schedule"] == "interleaved_1f1b"
    return Plan(
        model=model,
        cluster=cluster,
        seq_len=seq_len,
        capacity_factor=capacity_factor,
        dp=dp,
        tp=int(c["tensor_parallel_degree"]),
        pp=pp,
        cp=int(c["context_parallel_degree"]),
        ep=int(c["expert_parallel_degree"]) if model.is_moe else 1,
        mbs=mbs,
        grad_acc=int(grad_acc),
        v=int(c["num_virtual_pipeline_stages"]) if interleaved else 1,
        zero=int(c["zero_stage"]),
        ac=str(c["activation_checkpointing"]),
        fp8=c["precision"] == "fp8",
        overlap=bool(c["overlap_communication"]),
        bucket_bytes=float(c["bucket_size_mb"]) * 2**20,
        compile=c["compile"] != "off",
        dispatch=str(c["moe_dispatch"]),
    )
