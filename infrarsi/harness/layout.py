"""A trial's parallel layout: how its ranks split into pipeline, data and tensor parallel groups.

The job's ``num_workers`` ranks form a device mesh ``(pp, dp, tp)`` (``init_device_mesh``, the
torchtitan order: tensor-parallel ranks adjacent, so they share a node; pipeline stages
outermost). ``dp = num_workers / (tensor_parallel_degree * pipeline_parallel_degree)`` is
derived, never a knob, so the locked global batch is split over ``dp`` ranks only: tensor and
pipeline ranks of one data-parallel replica see the same rows.

Context parallelism is not offered: torch's ``context_parallel`` replaces
``scaled_dot_product_attention`` with ring attention, and the reference attention (and much
research code) computes its scores by hand, which ring attention cannot reach; on CPU the ring
kernels (flash / efficient SDPA) do not exist either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infrarsi.errors import IllegalConfigError

__all__ = ["Layout", "build_mesh"]

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


@dataclass(frozen=True)
class Layout:
    """The parallel layout of one trial (read from its knobs and the job's world size)."""

    world: int
    tp: int = 1
    pp: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    virtual_stages: int = 1

    def __post_init__(self) -> None:
        if self.world % (self.tp * self.pp):
            raise IllegalConfigError(
                f"tensor_parallel_degree {self.tp} x pipeline_parallel_degree {self.pp} does not "
                f"divide the {self.world} ranks of this job; pick degrees whose product divides "
                "num_workers"
            )
        if self.schedule not in PIPELINE_SCHEDULES:
            raise IllegalConfigError(
                f"pipeline_schedule {self.schedule!r} must be one of {list(PIPELINE_SCHEDULES)}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], world: int) -> Layout:
        pp = int(config.get("pipeline_parallel_degree", 1))
        schedule = str(config.get("pipeline_schedule", "1f1b"))
        vpp = int(config.get("num_virtual_pipeline_stages", 2)) if (
            pp > 1 and schedule == "interleaved_1f1b") else 1
        return cls(world=world, tp=int(config.get("tensor_parallel_degree", 1)), pp=pp,
                   sequence_parallel=bool(config.get("sequence_parallel", False)),
                   schedule=schedule, virtual_stages=vpp)

    @property
    def dp(self) -> int:
        """Data-parallel replicas: the ranks the global batch is split over."""
        return self.world // (self.tp * self.pp)

    @property
    def model_parallel(self) -> bool:
        return self.tp > 1 or self.pp > 1


def build_mesh(layout: Layout, device_type: str):
    """The ``(pp, dp, tp)`` DeviceMesh over every rank of the job (size-1 dims included, so
    ``mesh["dp"]`` and friends always exist)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (layout.pp, layout.dp, layout.tp),
                            mesh_dim_names=("pp", "dp", "tp"))
