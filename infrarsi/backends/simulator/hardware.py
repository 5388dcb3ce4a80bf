"""Hardware catalog: GPUs (peak FLOP/s, HBM, links) and clusters built from them.

Figures are vendor datasheet numbers for the SXM parts (dense, no sparsity). Bandwidths are
per GPU and per direction: ``nvlink_bw`` inside a node, ``inter_node_bw`` through the GPU's
share of the node's NICs (8 x 400 Gb/s InfiniBand/RoCE rails on H100/H200/B200 nodes,
8 x 200 Gb/s HDR on A100 nodes; AMD's Infinity Fabric on MI300X). ``memory_bytes`` is what ``nvidia-smi`` reports as total,
the capacity an allocation hits before CUDA OOM.
"""

from __future__ import annotations

from dataclasses import dataclass

from infrarsi.errors import IllegalConfigError
from infrarsi.trial import HardwareFingerprint

__all__ = ["GPU", "GPUS", "Cluster", "gpu"]

MiB = 2**20


@dataclass(frozen=True)
class GPU:
    """One accelerator model. FLOP/s are dense peaks; fp8 is 0 where the part has no fp8."""

    name: str
    bf16_flops: float
    fp8_flops: float
    memory_bytes: int
    hbm_bw: float  # bytes/s
    nvlink_bw: float  # bytes/s per GPU per direction
    inter_node_bw: float  # bytes/s per GPU per direction
    nvlink_latency_s: float = 8e-6
    inter_node_latency_s: float = 20e-6
    intra_link: str = "nvlink"  # the node's GPU-to-GPU fabric, as the fingerprint names it

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_flops > 0


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("A100-40GB", 312e12, 0.0, 40_960 * MiB, 1.555e12, 300e9, 25e9),
        GPU("A100-80GB", 312e12, 0.0, 81_920 * MiB, 2.039e12, 300e9, 25e9),
        GPU("H100-80GB", 989e12, 1979e12, 81_559 * MiB, 3.35e12, 450e9, 50e9),
        GPU("H200-141GB", 989e12, 1979e12, 143_771 * MiB, 4.8e12, 450e9, 50e9),
        GPU("B200-180GB", 2250e12, 4500e12, 183_359 * MiB, 8.0e12, 900e9, 50e9),
        # AMD Instinct MI300X OAM: 1307.4 TFLOP/s dense bf16, 2614.9 fp8, 192 GB HBM3 at
        # 5.3 TB/s; 7 Infinity Fabric links of 64 GB/s per direction to its 7 peers (448 GB/s);
        # 8 x 400 Gb/s NICs per node as on H100 nodes
        GPU("MI300X-192GB", 1307e12, 2615e12, 196_608 * MiB, 5.3e12, 448e9, 50e9,
            intra_link="xgmi"),
    )
}


def gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise IllegalConfigError(
            f"unknown GPU {name!r}; the catalog has {', '.join(GPUS)}"
        ) from None


@dataclass(frozen=True)
class Cluster:
    """``num_nodes`` nodes of ``gpus_per_node`` identical GPUs."""

    gpu: GPU
    num_nodes: int = 1
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise IllegalConfigError(
                f"cluster needs num_nodes >= 1 and gpus_per_node >= 1, got {self.num_nodes} "
                f"and {self.gpus_per_node}"
            )

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def fingerprint(self) -> HardwareFingerprint:
        return HardwareFingerprint(
            device_name=self.gpu.name,
            memory_bytes=self.gpu.memory_bytes,
            devices_per_node=self.gpus_per_node,
            num_nodes=self.num_nodes,
            interconnect=(f"{self.gpu.intra_link}+infiniband" if self.num_nodes > 1
                          else self.gpu.intra_link),
            peak_flops=self.gpu.bf16_flops,
        )
