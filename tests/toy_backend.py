"""A small, fast, deterministic-physics backend for search tests (a real Backend, not a mock).

Memory per device grows with the micro-batch and shrinks with checkpointing and bf16; above
24 GiB a trial is an OOM censored at capacity. Throughput grows with the micro-batch, bf16 is
faster, checkpointing costs 20%. The best legal config needs a memory saver (checkpointing) to
fit, which is what pairing is for.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from infrarsi.backends.base import Backend
from infrarsi.space import Knob, SearchSpace
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
    clearly_slower,
)

GIB = 2**30
CAPACITY = 24 * GIB


class ToyBackend(Backend):
    name = "toy"

    def __init__(self, seed: int = 0, noise: float = 0.01, broken: bool = False) -> None:
        self._space = SearchSpace((
            Knob("micro_batch_size", (1, 2, 4, 8, 16), 1, "ordinal"),
            Knob("activation_checkpointing", ("none", "full"), "none"),
            Knob("precision", ("fp32", "bf16"), "fp32"),
            Knob("bucket_cap_mb", (5, 25, 100), 25, "ordinal"),
        ))
        self._wl = WorkloadSignature("dense", 10**9, 16, 2048, 16, 2048, 64, name="toy")
        self._hw = HardwareFingerprint("toy-gpu", CAPACITY, 8, peak_flops=1e15)
        self.rng = random.Random(seed)
        self.noise = noise
        self.broken = broken
        self.calls = 0

    @property
    def space(self) -> SearchSpace:
        return self._space

    @property
    def workload(self) -> WorkloadSignature:
        return self._wl

    @property
    def hardware(self) -> HardwareFingerprint:
        return self._hw

    @staticmethod
    def memory(c: Mapping[str, Any]) -> float:
        act = c["micro_batch_size"] * 3 * GIB
        act *= 0.35 if c["activation_checkpointing"] == "full" else 1.0
        act *= 0.6 if c["precision"] == "bf16" else 1.0
        return 2 * GIB + act

    @staticmethod
    def throughput(c: Mapping[str, Any]) -> float:
        t = 1000.0 * c["micro_batch_size"] ** 0.6
        t *= 0.8 if c["activation_checkpointing"] == "full" else 1.0
        t *= 1.5 if c["precision"] == "bf16" else 1.0
        t *= {5: 0.97, 25: 1.0, 100: 0.99}[c["bucket_cap_mb"]]
        return t

    def best_objective(self) -> float:
        return max(self.throughput(c) for c in self._space.enumerate()
                   if self.memory(c) <= CAPACITY)

    def execute(self, config: Mapping[str, Any], *, trial_id: str | None = None,
                stop_slower_than_s: float | None = None) -> TrialRecord:
        c = self._space.normalize(config)
        self.calls += 1
        common = dict(trial_id=trial_id or f"toy{self.calls}", config=c, backend=self.name,
                      workload=self._wl, hardware=self._hw, memory_capacity_bytes=CAPACITY,
                      tokens_per_step=self._wl.tokens_per_step, device_seconds=8 * 60.0)
        if self.broken:
            return TrialRecord(status=TrialStatus.ERROR, error_kind=ErrorKind.CRASH,
                               error_message="ImportError: the workload is broken", **common)
        if self.memory(c) > CAPACITY:
            return TrialRecord(status=TrialStatus.OOM, memory_censor_bytes=CAPACITY, **common)
        tok_s = self.throughput(c) * (1 + self.rng.gauss(0, self.noise))
        step = self._wl.tokens_per_step / tok_s
        steps = [step * (1 + self.rng.gauss(0, self.noise)) for _ in range(5)]
        if clearly_slower(steps[:2], stop_slower_than_s):  # as the harness does
            steps = steps[:2]
            common["extra"] = {"stopped_early": {"measured_steps": 2,
                                                 "slower_than_s": stop_slower_than_s}}
        return TrialRecord(status=TrialStatus.OK, step_times_s=steps,
                           peak_memory_bytes=(int(self.memory(c)),), **common)
