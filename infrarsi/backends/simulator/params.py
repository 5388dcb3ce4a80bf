"""The simulator's global constants: efficiencies, overheads and memory factors.

A handful of them are fitted against measured runs (``scripts/sim_fidelity.py --fit``) and
stored with their provenance in ``calibration.yaml`` beside this module; the rest are
physically motivated defaults. :func:`load_params` reads the YAML (strictly: an unknown key is
an error) on top of the defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infrarsi.errors import ConfigError

__all__ = ["SimParams", "CALIBRATION_PATH", "load_params", "save_params", "FITTED_TIME", "FITTED_MEMORY"]

CALIBRATION_PATH = Path(__file__).with_name("calibration.yaml")


@dataclass(frozen=True)
class SimParams:
    """Global constants of the analytical model (one set for every GPU and model)."""

    # compute: matmul efficiency = eff_max * m/(m+m0) * w/(w+w0) for an (m x w) GEMM slab
    matmul_eff_max: float = 0.75
    matmul_rows_half: float = 512.0  # m0: rows (tokens) at which efficiency halves
    matmul_width_half: float = 256.0  # w0: sharded width at which efficiency halves
    attention_eff: float = 0.55  # flash-attention core, fraction of peak
    fp8_gemm_gain: float = 0.72  # fp8 efficiency relative to bf16 (against a 2x peak)
    elementwise_passes: float = 24.0  # HBM passes over (h + ffn) per token per layer, fwd+bwd
    compile_elementwise_factor: float = 0.6  # torch.compile fuses elementwise kernels
    layer_overhead_s: float = 3e-4  # launch/framework time per layer per micro-batch (f+b)
    compile_overhead_factor: float = 0.5
    microbatch_overhead_s: float = 5e-3  # per micro-batch per stage: scheduling, data, sync
    p2p_overhead_s: float = 1e-3  # per pipeline send/recv beyond its alpha-beta cost
    # communication: effective fraction of the link bandwidth collectives reach
    intra_bw_eff: float = 0.75
    inter_bw_eff: float = 0.7
    inter_congestion: float = 0.15  # collective slow-down = nodes ** this (fabric congestion)
    grad_reduce_bytes: float = 4.0  # gradients reduced in fp32
    dp_overlap_frac: float = 0.85  # share of the backward window DP comm can hide in
    tp_overlap_frac: float = 0.25  # async TP when overlap_communication is on
    # MoE
    grouped_gemm_eff: float = 0.6  # grouped expert GEMMs relative to a dense GEMM of that shape
    router_skew_cv: float = 0.35  # coefficient of variation of per-expert load
    # memory
    activation_scale: float = 1.0
    logits_bytes_per_elem: float = 8.0  # bf16 logits + fp32 upcast + grad, per vocab entry
    framework_bytes: float = 3.0 * 2**30  # CUDA context, NCCL buffers, allocator slack
    fragmentation: float = 0.08  # share of dynamic memory lost to fragmentation
    # a short trial's cost
    startup_s: float = 45.0
    compile_s: float = 90.0
    warmup_steps: int = 3
    measured_steps: int = 5
    noise_trial_cv: float = 0.01
    noise_step_cv: float = 0.015
    # A shared machine (``infrarsi.backends.simulator.noise.fit_noise`` fits these from real A/A
    # trials): a slow load level over consecutive trials (AR(1), log-SD ``noise_drift_cv``,
    # lag-1 correlation ``noise_drift_rho``) and stalled steps (a step stalls with probability
    # ``noise_stall_prob`` and takes ``noise_stall_factor`` times as long). Off by default.
    noise_drift_cv: float = 0.0
    noise_drift_rho: float = 0.9
    noise_stall_prob: float = 0.0
    noise_stall_factor: float = 2.0

    def replace(self, **changes: Any) -> SimParams:
        return dataclasses.replace(self, **changes)


# the constants scripts/sim_fidelity.py --fit estimates (the rest stay at their defaults)
FITTED_TIME = (
    "matmul_eff_max",
    "matmul_rows_half",
    "matmul_width_half",
    "layer_overhead_s",
    "microbatch_overhead_s",
    "p2p_overhead_s",
    "intra_bw_eff",
    "inter_bw_eff",
    "inter_congestion",
)
FITTED_MEMORY = ("activation_scale", "logits_bytes_per_elem", "framework_bytes", "fragmentation")


def load_params(path: Path | None = None) -> SimParams:
    """Defaults overlaid with the ``params`` mapping of the calibration YAML (if present)."""
    path = CALIBRATION_PATH if path is None else Path(path)
    if not path.is_file():
        return SimParams()
    data = yaml.safe_load(path.read_text()) or {}
    values = data.get("params", {})
    names = {f.name: f for f in dataclasses.fields(SimParams)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError(
            f"{path}: params: unknown key(s) {unknown}; allowed: {', '.join(sorted(names))}"
        )
    return SimParams(**{k: type(getattr(SimParams(), k))(v) for k, v in values.items()})


def save_params(params: SimParams, provenance: dict[str, Any], path: Path | None = None) -> Path:
    """Write the fitted constants and where they came from (atomically)."""
    path = CALIBRATION_PATH if path is None else Path(path)
    fitted = {k: getattr(params, k) for k in FITTED_TIME + FITTED_MEMORY}
    body = {"provenance": provenance, "params": {k: float(v) for k, v in fitted.items()}}
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(
        "# Written by scripts/sim_fidelity.py --fit; edit by re-running it, not by hand.\n"
        + yaml.safe_dump(body, sort_keys=False)
    )
    tmp.replace(path)
    return path
