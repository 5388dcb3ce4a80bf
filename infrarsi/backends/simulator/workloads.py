"""Simulated workloads: a model on a cluster with the locked work per step.

The four built-ins follow the shape of the InfraRSI paper's workloads. Each baseline is an
unoptimized but legal first run of the kind users start from: FSDP (ZeRO-3) over every GPU,
full activation checkpointing, micro-batch 1, bf16, eager mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infrarsi.backends.simulator.hardware import Cluster, gpu
from infrarsi.backends.simulator.models import ModelShape, model
from infrarsi.errors import IllegalConfigError

__all__ = ["SimWorkload", "BUILTIN_WORKLOADS"]


@dataclass(frozen=True)
class SimWorkload:
    """What is trained (model, sequence length, global batch), where, and the user's config.

    ``capacity_factor`` (MoE) is part of the contract: it changes which tokens are dropped,
    so it is locked, not searched. ``restrict`` narrows knob domains (knob -> values).
    """

    name: str
    model: str
    gpu: str
    num_nodes: int
    seq_len: int
    global_batch_size: int
    gpus_per_node: int = 8
    capacity_factor: float = 1.25
    baseline: dict[str, Any] = field(default_factory=dict)
    restrict: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.global_batch_size < 1:
            raise IllegalConfigError(
                f"workload {self.name!r}: seq_len and global_batch_size must be positive"
            )

    @property
    def shape(self) -> ModelShape:
        return model(self.model)

    @property
    def cluster(self) -> Cluster:
        return Cluster(gpu(self.gpu), self.num_nodes, self.gpus_per_node)


def _first_run(dp: int, **more: Any) -> dict[str, Any]:
    return {
        **more,
        "data_parallel_degree": dp,
        "zero_stage": 3,
        "activation_checkpointing": "full",
        "micro_batch_size": 1,
    }


# keep the legal sets enumerable (tens of thousands): drop the rarely useful corners
_DENSE_MULTI = {"context_parallel_degree": (1, 2), "micro_batch_size": (1, 2, 4, 8)}
_MOE_SINGLE = {"context_parallel_degree": (1, 2), "micro_batch_size": (1, 2, 4, 8)}
_MULTI = {"context_parallel_degree": (1,), "micro_batch_size": (1, 2, 4),
          "pipeline_parallel_degree": (1, 2, 4), "expert_parallel_degree": (1, 2, 4, 8)}

BUILTIN_WORKLOADS: dict[str, SimWorkload] = {
    w.name: w
    for w in (
        SimWorkload("dense-single-node", "llama-3.1-8b", "H100-80GB", 1, 4096, 256,
                    baseline=_first_run(8)),
        SimWorkload("dense-multi-node", "llama-3-70b", "H100-80GB", 4, 4096, 256,
                    baseline=_first_run(32), restrict=_DENSE_MULTI),
        SimWorkload("moe-single-node", "finegrained-moe-16b", "H200-141GB", 1, 4096, 256,
                    baseline=_first_run(8, expert_parallel_degree=8), restrict=_MOE_SINGLE),
        SimWorkload("moe-multi-node", "mixtral-8x7b", "H200-141GB", 4, 4096, 256,
                    baseline=_first_run(32, expert_parallel_degree=8), restrict=_MULTI),
    )
}
