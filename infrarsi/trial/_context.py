"""Keys that make experience transferable: what was trained, on what, with which software."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any


def _from_dict(cls, d: dict[str, Any]):
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class WorkloadSignature:
    """The shape of the work: enough to find similar workloads and to encode features.

    ``global_batch_size`` is in sequences; tokens per optimizer step is
    ``global_batch_size * seq_len``.
    """

    model_family: str  # "dense" or "moe"
    num_params: int
    num_layers: int
    hidden_size: int
    num_heads: int
    seq_len: int
    global_batch_size: int
    num_experts: int = 0
    top_k: int = 0
    vocab_size: int = 0
    name: str = ""

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def vector(self) -> list[float]:
        """Numeric features (log scale where sizes span orders of magnitude)."""
        return [
            1.0 if self.model_family == "moe" else 0.0,
            math.log10(max(self.num_params, 1)),
            float(self.num_layers),
            math.log2(max(self.hidden_size, 1)),
            math.log2(max(self.num_heads, 1)),
            math.log2(max(self.seq_len, 1)),
            math.log2(max(self.global_batch_size, 1)),
            math.log2(self.num_experts + 1),
            float(self.top_k),
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkloadSignature:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class HardwareFingerprint:
    """Where the work ran. ``memory_bytes`` is per device (the OOM capacity)."""

    device_name: str  # "cpu", "H100-80GB", ...
    memory_bytes: int
    devices_per_node: int
    num_nodes: int = 1
    interconnect: str = "none"  # "nvlink", "infiniband", "ethernet", "loopback", ...
    peak_flops: float = 0.0  # per device, the precision used for MFU (bf16 unless stated)

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes

    def vector(self) -> list[float]:
        return [
            math.log2(max(self.memory_bytes, 1)),
            math.log2(max(self.num_devices, 1)),
            math.log2(max(self.num_nodes, 1)),
            math.log10(max(self.peak_flops, 1.0)),
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HardwareFingerprint:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class SoftwareVersions:
    torch: str = ""
    cuda: str = ""
    nccl: str = ""
    ray: str = ""
    python: str = ""

    @classmethod
    def current(cls) -> SoftwareVersions:
        import platform

        import ray
        import torch

        nccl = ""
        if torch.cuda.is_available():
            try:
                nccl = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # noqa: BLE001 - NCCL absent on some builds
                nccl = ""
        return cls(
            torch=torch.__version__,
            cuda=torch.version.cuda or "",
            nccl=nccl,
            ray=ray.__version__,
            python=platform.python_version(),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
