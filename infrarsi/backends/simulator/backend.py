"""SimulatorBackend: the analytical GPU-cluster model behind the Backend seam.

``execute`` turns a legal config into a TrialRecord the way a short real trial would end:
ok (a few noisy measured steps, per-stage peak memory, phase times), oom (peak censored at
the capacity, no step times) or error (compile, for the known failing combinations in
:data:`COMPILE_FAILURES`). Its cost in device-seconds counts startup, compilation, warm-up
and measured steps on every device. :meth:`simulate` gives the noiseless truth (for tests
and for computing the best config of a space, never for a searcher).
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infrarsi.backends.base import Backend
from infrarsi.backends.simulator._plan import make_plan
from infrarsi.backends.simulator.memory import peak_memory
from infrarsi.backends.simulator.params import SimParams, load_params
from infrarsi.backends.simulator.space import SimulatorSpace, build_space
from infrarsi.backends.simulator.timing import step_phases
from infrarsi.backends.simulator.workloads import BUILTIN_WORKLOADS, SimWorkload
from infrarsi.errors import IllegalConfigError
from infrarsi.space import Config, config_key
from infrarsi.trial import (
    EARLY_STOP_CHECK_STEPS,
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
    clearly_slower,
)

__all__ = ["SimulatorBackend", "SimOutcome", "COMPILE_FAILURES"]

# (description, predicate) of settings that fail at torch.compile time
COMPILE_FAILURES: tuple[tuple[str, Callable[[Mapping[str, Any]], bool]], ...] = (
    ("torch.compile: float8 linears inside selective activation checkpointing fail to trace",
     lambda c: c["compile"] != "off" and c["precision"] == "fp8"
     and c["activation_checkpointing"] == "selective"),
    ("torch.compile: DeepEP dispatch kernels are opaque custom ops and break the graph",
     lambda c: c["compile"] != "off" and c.get("moe_dispatch") == "deepep"
     and c.get("expert_parallel_degree", 1) > 1),
    ("torch.compile: ring attention under FSDP recompiles past the cache limit",
     lambda c: c["compile"] != "off" and c["context_parallel_degree"] > 1
     and c["zero_stage"] == 3),
)


@dataclass(frozen=True)
class SimOutcome:
    """The noiseless result of one config (what the simulator knows, a GPU would not)."""

    status: TrialStatus
    error_kind: ErrorKind | None
    message: str
    step_time_s: float | None
    phases: dict[str, float] = field(default_factory=dict)
    peak_bytes: tuple[int, ...] = ()
    capacity_bytes: int = 0
    grad_accumulation_steps: int = 1


class SimulatorBackend(Backend):
    """An analytical model of training ``workload`` on its cluster; seeded noise."""

    name = "simulator"

    def __init__(self, workload: SimWorkload, *, seed: int = 0, params: SimParams | None = None):
        self._wl = workload
        self._model = workload.shape
        self._cluster = workload.cluster
        self.seed = int(seed)
        self.params = params if params is not None else load_params()
        self._space = build_space(self._model, self._cluster, seq_len=workload.seq_len,
                                  global_batch_size=workload.global_batch_size,
                                  baseline=workload.baseline, restrict=workload.restrict)
        self._runs: Counter[str] = Counter()
        self._noise_tag: str | None = None  # see reseed
        self._drift = [0.0, 0]  # the machine's load level and trials drawn (shared by copies)

    def with_measured_steps(self, steps: int) -> SimulatorBackend:
        """The same simulated cluster whose trials measure ``steps`` steps (shared noise state)."""
        other = copy.copy(self)
        other.params = self.params.replace(measured_steps=int(steps))
        return other

    def _drift_level(self) -> float:
        """The next trial's log load factor: AR(1) over the trials in the order they run."""
        p, d = self.params, self._drift
        rng = self._rng(f"drift|{self._noise_tag}", d[1])
        d[0] = p.noise_drift_rho * d[0] + math.sqrt(1 - p.noise_drift_rho**2) * rng.normal(
            0.0, p.noise_drift_cv)
        d[1] += 1
        return d[0]

    def reseed(self, seed: int | None) -> None:
        """Draw the next trials' noise from ``seed`` alone (with the config), not from how many
        times each config ran before: a benchmark reseeds before every trial, so a search's
        measurements do not depend on which searches ran on this backend earlier. ``None``
        restores the default (noise by the config's run count)."""
        self._noise_tag = None if seed is None else f"trial-seed={int(seed)}"

    # ---- construction -----------------------------------------------------------------
    @classmethod
    def builtin(cls, name: str, *, seed: int = 0, params: SimParams | None = None) -> SimulatorBackend:
        """One of :meth:`builtin_names` (dense/MoE, single/multi-node)."""
        try:
            wl = BUILTIN_WORKLOADS[name]
        except KeyError:
            raise IllegalConfigError(
                f"unknown simulator workload {name!r}; built-ins: {', '.join(BUILTIN_WORKLOADS)}"
            ) from None
        return cls(wl, seed=seed, params=params)

    @staticmethod
    def builtin_names() -> tuple[str, ...]:
        return tuple(BUILTIN_WORKLOADS)

    # ---- the seam -----------------------------------------------------------------------
    @property
    def space(self) -> SimulatorSpace:
        return self._space

    @property
    def workload(self) -> WorkloadSignature:
        m, w = self._model, self._wl
        return WorkloadSignature(
            model_family="moe" if m.is_moe else "dense", num_params=m.num_params,
            num_layers=m.num_layers, hidden_size=m.hidden_size, num_heads=m.num_heads,
            seq_len=w.seq_len, global_batch_size=w.global_batch_size, num_experts=m.num_experts,
            top_k=m.top_k, vocab_size=m.vocab_size, name=w.name,
        )

    @property
    def hardware(self) -> HardwareFingerprint:
        return self._cluster.fingerprint()

    @property
    def sim_workload(self) -> SimWorkload:
        return self._wl

    def check_config(self, config: Mapping[str, Any]) -> Config:
        """The normalized config, or IllegalConfigError naming the field and the fix."""
        tp = config.get("tensor_parallel_degree", 1)
        gpn = self._cluster.gpus_per_node
        if isinstance(tp, int) and tp > gpn:
            raise IllegalConfigError(
                f"tensor_parallel_degree={tp} exceeds the {gpn} GPUs of one "
                f"{self._cluster.gpu.name} node: tensor parallelism must stay inside a node; "
                "use pipeline_parallel_degree to span nodes"
            )
        return self._space.normalize(config, check=True)

    def simulate(self, config: Mapping[str, Any]) -> SimOutcome:
        c = self.check_config(config)
        w, cap = self._wl, self._cluster.gpu.memory_bytes
        plan = make_plan(c, self._model, self._cluster, seq_len=w.seq_len,
                         global_batch_size=w.global_batch_size, capacity_factor=w.capacity_factor)
        phases = step_phases(plan, self.params)
        peaks = tuple(int(b) for b in peak_memory(plan, self.params))
        for msg, fails in COMPILE_FAILURES:
            if fails(c):
                return SimOutcome(TrialStatus.ERROR, ErrorKind.COMPILE, msg, None, phases, peaks,
                                  cap, plan.grad_acc)
        if max(peaks) > cap:
            msg = (f"CUDA out of memory: tried to exceed {cap / 2**30:.1f} GiB on "
                   f"{self._cluster.gpu.name}")
            return SimOutcome(TrialStatus.OOM, None, msg, None, phases, peaks, cap, plan.grad_acc)
        return SimOutcome(TrialStatus.OK, None, "", phases["total"], phases, peaks, cap,
                          plan.grad_acc)

    def execute(self, config: Mapping[str, Any], *, trial_id: str | None = None,
                stop_slower_than_s: float | None = None) -> TrialRecord:
        c = self.check_config(config)
        out = self.simulate(c)
        key = config_key(c)
        self._runs[key] += 1
        rng = (self._rng(key, self._runs[key]) if self._noise_tag is None
               else self._rng(f"{key}|{self._noise_tag}", 0))
        p, n = self.params, self._cluster.num_devices
        startup = p.startup_s * rng.lognormal(0.0, 0.1) + (p.compile_s if c["compile"] != "off" else 0.0)
        common = dict(
            trial_id=trial_id or f"sim-{self.seed}-{len(self._runs)}-{sum(self._runs.values())}",
            config=dict(c), backend=self.name, workload=self.workload, hardware=self.hardware,
            memory_capacity_bytes=out.capacity_bytes, tokens_per_step=self._tokens_per_step,
            startup_seconds=startup,
            extra={"grad_accumulation_steps": out.grad_accumulation_steps},
        )
        if out.status is TrialStatus.ERROR:
            return TrialRecord(status=out.status, error_kind=out.error_kind,
                               error_message=out.message, device_seconds=startup * n,
                               wall_seconds=startup, **common)
        if out.status is TrialStatus.OOM:
            wall = startup + 0.5 * out.phases["total"]  # dies inside the first step
            return TrialRecord(status=out.status, error_message=out.message,
                               memory_censor_bytes=out.capacity_bytes, device_seconds=wall * n,
                               wall_seconds=wall, **common)
        trial_factor = rng.lognormal(0.0, p.noise_trial_cv)
        if p.noise_drift_cv > 0:
            trial_factor *= math.exp(self._drift_level())
        steps = out.step_time_s * trial_factor * rng.lognormal(0.0, p.noise_step_cv, p.measured_steps)
        if p.noise_stall_prob > 0:
            steps = np.where(rng.random(p.measured_steps) < p.noise_stall_prob,
                             steps * p.noise_stall_factor, steps)
        check = EARLY_STOP_CHECK_STEPS  # the harness's early stop, simulated the same way
        if len(steps) > check and clearly_slower(steps[:check], stop_slower_than_s):
            steps = steps[:check]
            common["extra"]["stopped_early"] = {"measured_steps": check,
                                                "slower_than_s": float(stop_slower_than_s)}
        wall = startup + out.step_time_s * trial_factor * p.warmup_steps + float(steps.sum())
        phases = {k: v * trial_factor for k, v in out.phases.items() if k != "total"}
        common["extra"]["mfu"] = self._mfu(float(np.median(steps)))
        # the noise-free throughput: what a benchmark scores a found config by (never a
        # searcher's input: searchers see the noisy measured steps like on a real cluster)
        common["extra"]["true_objective"] = self._tokens_per_step / out.step_time_s
        return TrialRecord(status=TrialStatus.OK, step_times_s=tuple(map(float, steps)),
                           peak_memory_bytes=out.peak_bytes, phase_times_s=phases,
                           device_seconds=wall * n, wall_seconds=wall, **common)

    def baseline_config(self) -> Config:
        return self._space.defaults()

    # ---- for benchmarks -------------------------------------------------------------------
    @property
    def workload_name(self) -> str:
        return self._wl.name

    def best_objective(self) -> float | None:
        """The best noise-free tokens/s over every legal config (enumerated once, cached)."""
        if not hasattr(self, "_best"):
            best = None
            for c in self._space.enumerate():
                out = self.simulate(c)
                if out.status is TrialStatus.OK:
                    v = self._tokens_per_step / out.step_time_s
                    best = v if best is None or v > best else best
            self._best = best
        return self._best

    def records(self, n: int = 200) -> list[TrialRecord]:
        """Experience for other workloads' searches: ``n`` legal configs (a seeded sample) run
        as trials, failures and OOMs included, as a bank would hold them."""
        if not hasattr(self, "_records"):
            sample = self._space.sample(n, random.Random(f"experience|{self._wl.name}|{self.seed}"))
            saved, self._records = self._noise_tag, []
            try:  # each record's noise by its index alone: the same whatever ran before
                for i, c in enumerate(sample):
                    self._noise_tag = f"experience-{i}"
                    self._records.append(self.execute(c, trial_id=f"exp-{self._wl.name}-{i}"))
            finally:
                self._noise_tag = saved
        return self._records

    # ---- helpers ------------------------------------------------------------------------
    @property
    def _tokens_per_step(self) -> int:
        return self._wl.global_batch_size * self._wl.seq_len

    def _mfu(self, step_s: float) -> float:
        flops = self._model.model_flops_per_token(self._wl.seq_len) * self._tokens_per_step
        return flops / step_s / (self._cluster.num_devices * self._cluster.gpu.bf16_flops)

    def _rng(self, key: str, run: int) -> np.random.Generator:
        """Noise depends on (seed, config, how many times this config ran): reproducible."""
        digest = hashlib.sha256(f"{self.seed}|{key}|{run}".encode()).digest()
        return np.random.default_rng(int.from_bytes(digest[:8], "little"))
