"""The vocabulary of trial outcomes and the immutable record every backend returns."""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from infrarsi.trial._context import HardwareFingerprint, WorkloadSignature

# A trial told to stop once clearly slower (``stop_slower_than_s``) decides once, after this
# many measured steps: its record then says ``extra["stopped_early"]``.
EARLY_STOP_CHECK_STEPS = 2


def clearly_slower(step_times_s, slower_than_s: float | None) -> bool:
    """The early-stop rule every backend applies to its first measured steps: all of them
    slower than the hint (the fastest, not the median: one stray slow step never stops a trial)."""
    return bool(slower_than_s) and len(step_times_s) > 0 and min(step_times_s) > slower_than_s


class TrialStatus(str, enum.Enum):
    """How a trial ended.

    ``OK``: it ran its measured steps. ``OOM``: its peak memory exceeded the device capacity
    (a right-censored memory observation, never discarded). ``ERROR``: it failed for another
    reason, see :class:`ErrorKind`. ``REJECTED``: it ran but broke an invariant of the contract
    (loss drift, changed work per step, tampered timing), so its timing is worthless.
    """

    OK = "ok"
    OOM = "oom"
    ERROR = "error"
    REJECTED = "rejected"


class ErrorKind(str, enum.Enum):
    """Why an ``ERROR`` trial failed."""

    TIMEOUT = "timeout"  # the trial ran past its time limit (a hang, a deadlocked collective)
    COMPILE = "compile"  # torch.compile (or another build step) failed
    COMMUNICATION = "communication"  # a collective failed: NCCL/gloo error, peer gone
    WORKER_LOST = "worker_lost"  # a worker process or node died under the trial
    PATCH = "patch"  # the trial's source patch did not apply or import
    CRASH = "crash"  # any other exception in the training code
    INTERRUPTED = "interrupted"  # the driver died while the trial was open


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial. Immutable; round-trips through :meth:`to_dict`/:meth:`from_dict`.

    Memory follows the GPU's contract even where it is emulated: an ``OOM`` trial carries
    ``peak_memory_bytes=None`` and ``memory_censor_bytes`` = the capacity it exceeded, because
    a real device only tells us that the peak was above capacity.

    ``step_times_s`` are the harness's measured steps (warm-up excluded), one optimizer step
    each, as seen on rank 0 after a cross-rank barrier. ``device_seconds`` is the trial's cost:
    wall time from submission to end times the devices it held, failures included.
    """

    trial_id: str
    config: dict[str, Any]
    status: TrialStatus
    backend: str
    workload: WorkloadSignature
    hardware: HardwareFingerprint
    error_kind: ErrorKind | None = None
    error_message: str = ""
    step_times_s: tuple[float, ...] = ()
    peak_memory_bytes: tuple[int, ...] | None = None
    memory_capacity_bytes: int | None = None
    memory_censor_bytes: int | None = None
    loss_trace: tuple[float, ...] = ()
    phase_times_s: dict[str, float] = field(default_factory=dict)
    tokens_per_step: int | None = None
    device_seconds: float = 0.0
    wall_seconds: float = 0.0
    startup_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", TrialStatus(self.status))
        if self.error_kind is not None:
            object.__setattr__(self, "error_kind", ErrorKind(self.error_kind))
        object.__setattr__(self, "step_times_s", tuple(float(t) for t in self.step_times_s))
        object.__setattr__(self, "loss_trace", tuple(float(v) for v in self.loss_trace))
        if self.peak_memory_bytes is not None:
            object.__setattr__(self, "peak_memory_bytes", tuple(int(b) for b in self.peak_memory_bytes))
        assert self.status is not TrialStatus.OOM or self.peak_memory_bytes is None, (
            "an OOM trial must not carry its true peak (a GPU never reports it)"
        )
        assert (self.status is TrialStatus.ERROR) == (self.error_kind is not None), (
            "error_kind is set exactly when status is ERROR"
        )

    # ---- derived figures -------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.status is TrialStatus.OK

    @property
    def step_time_s(self) -> float | None:
        """Median measured step time (robust to a stray slow step), or None if none measured."""
        return statistics.median(self.step_times_s) if self.step_times_s else None

    @property
    def tokens_per_s(self) -> float | None:
        t = self.step_time_s
        if t is None or not self.tokens_per_step:
            return None
        return self.tokens_per_step / t

    @property
    def peak_memory_max_bytes(self) -> int | None:
        return max(self.peak_memory_bytes) if self.peak_memory_bytes else None

    @property
    def memory_observation(self) -> tuple[float, bool] | None:
        """(bytes, observed) for the memory model: observed peak, or censored at capacity."""
        if self.status is TrialStatus.OOM and self.memory_censor_bytes:
            return float(self.memory_censor_bytes), False
        peak = self.peak_memory_max_bytes
        return (float(peak), True) if peak else None

    # ---- serialization ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        d["error_kind"] = self.error_kind.value if self.error_kind else None
        d["step_times_s"] = list(self.step_times_s)
        d["loss_trace"] = [v if math.isfinite(v) else None for v in self.loss_trace]
        d["peak_memory_bytes"] = list(self.peak_memory_bytes) if self.peak_memory_bytes else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialRecord:
        d = dict(d)
        d["workload"] = WorkloadSignature.from_dict(d["workload"])
        d["hardware"] = HardwareFingerprint.from_dict(d["hardware"])
        d["loss_trace"] = [math.nan if v is None else v for v in d.get("loss_trace") or ()]
        return cls(**d)

    def summary(self) -> str:
        """One line a person reads in a log."""
        parts = [f"trial {self.trial_id}: {self.status.value}"]
        if self.error_kind:
            parts[0] += f" ({self.error_kind.value})"
        if self.step_time_s is not None:
            parts.append(f"step {self.step_time_s * 1e3:.1f} ms")
        if self.tokens_per_s:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s")
        if self.peak_memory_max_bytes:
            parts.append(f"peak {self.peak_memory_max_bytes / 2**20:,.0f} MiB")
        elif self.status is TrialStatus.OOM and self.memory_censor_bytes:
            parts.append(f"peak > {self.memory_censor_bytes / 2**20:,.0f} MiB (censored)")
        if self.loss_trace:
            parts.append(f"loss {self.loss_trace[-1]:.4f}")
        parts.append(f"cost {self.device_seconds:.1f} device-s")
        if self.error_message and not self.ok:
            parts.append(self.error_message.splitlines()[0][:160])
        return ", ".join(parts)
