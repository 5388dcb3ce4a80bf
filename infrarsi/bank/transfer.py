"""Transfer experience across hardware: device A's trials become seeds and priors for device B.

What carries over and how:

* **Rank and relative effects** carry over: if config X was 1.3x faster than Y on A, it is
  predicted 1.3x faster on B.
* **Absolute step times** are rescaled by ``time_scale(A, B)``: a roofline-style blend of the
  peak FLOP/s ratio (weight ``COMPUTE_WEIGHT``) and the memory-bandwidth ratio (the rest),
  from ``HardwareFingerprint.peak_flops`` or, if unset, the small ``DEVICE_CATALOG``. When
  configs were measured on both devices, the scale is refined towards the geometric mean of
  their measured time ratios (weight n/(n+1) for n shared configs).
* **Memory** carries over as bytes per device (same workload, same per-device layout) and is
  expressed relative to B's capacity: ``peak_bytes_A / capacity_B``. An OOM on A is a lower
  bound ``capacity_A / capacity_B`` (>= 1 means predicted OOM on B as well).

The result is plain data: a list of :class:`Seed` tuples whose first four fields are
``(config, predicted relative speed, predicted memory fraction, source)``.

Records from another *search space* (another table, another knob set) enter a search through
:func:`project_records`: they are projected, not dropped. A knob the target space lacks stays in
the record's config as context (the physics columns read it: a ZeRO-1 run's memory estimate
is a ZeRO-1 estimate whether or not the target searches ZeRO); a knob the target has and the
record lacks ran at the target's default; a numeric value outside the target's domain is
encoded on the same log2/linear column (a slope extrapolates). Only a categorical value the
target's columns cannot place (its one-hot would read as the default) drops the record, and the
projection says how many and why.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from infrarsi.space import SearchSpace, config_key
from infrarsi.trial import HardwareFingerprint, TrialRecord, TrialStatus, WorkloadSignature

__all__ = ["COMPUTE_WEIGHT", "DEVICE_CATALOG", "Projection", "Seed", "device_specs",
           "project_records", "time_scale", "transfer", "transfer_records"]

COMPUTE_WEIGHT = 0.7

# Per-device peak dense bf16 FLOP/s and HBM bandwidth (bytes/s), vendor data sheets.
DEVICE_CATALOG: dict[str, tuple[float, float]] = {
    "h200": (989e12, 4.8e12),
    "h100-pcie": (756e12, 2.0e12),
    "h100": (989e12, 3.35e12),
    "a100-40gb": (312e12, 1.555e12),
    "a100": (312e12, 2.039e12),
    "l40s": (362e12, 0.864e12),
    "l4": (121e12, 0.3e12),
    "a10g": (125e12, 0.6e12),
    "v100": (125e12, 0.9e12),
    "mi300x": (1307e12, 5.3e12),
    "mi250x": (383e12, 3.2e12),
}


class Seed(NamedTuple):
    """One transferred config. ``predicted_relative_speed``: 1.0 for the predicted fastest
    config that fits in memory, 0.0 for a predicted OOM; ``predicted_memory_fraction`` of B's capacity (a lower bound when
    ``memory_is_lower_bound``)."""

    config: dict[str, Any]
    predicted_relative_speed: float
    predicted_memory_fraction: float | None
    source: str
    predicted_step_time_s: float | None = None
    memory_is_lower_bound: bool = False


def device_specs(hw: HardwareFingerprint) -> tuple[float | None, float | None]:
    """(peak FLOP/s, memory bandwidth) of one device; None where unknown."""
    name = hw.device_name.lower()
    flops, bw = None, None
    for key in sorted(DEVICE_CATALOG, key=len, reverse=True):
        if name.startswith(key) or key in name:
            flops, bw = DEVICE_CATALOG[key]
            break
    if hw.peak_flops > 0:
        flops = hw.peak_flops
    return flops, bw


def time_scale(src: HardwareFingerprint, dst: HardwareFingerprint,
               shared: Iterable[tuple[float, float]] = ()) -> float:
    """Multiplier from a step time on ``src`` to one on ``dst``.

    ``shared``: (time on src, time on dst) of configs measured on both, which refine the
    analytic ratio.
    """
    (fs, bs), (fd, bd) = device_specs(src), device_specs(dst)
    analytic = 1.0
    if fs and fd:
        if bs and bd:
            analytic = (fs / fd) ** COMPUTE_WEIGHT * (bs / bd) ** (1 - COMPUTE_WEIGHT)
        else:
            analytic = fs / fd
    ratios = [math.log(d / s) for s, d in shared if s > 0 and d > 0]
    if not ratios:
        return analytic
    w = len(ratios) / (len(ratios) + 1)
    return math.exp(w * sum(ratios) / len(ratios) + (1 - w) * math.log(analytic))


def transfer_records(
    sources: Sequence[tuple[HardwareFingerprint, Sequence[TrialRecord]]],
    target: HardwareFingerprint,
    target_records: Sequence[TrialRecord] = (),
) -> list[Seed]:
    """Seeds for ``target`` from trials on other hardware (nearest hardware first wins a
    config measured on several). ``target_records`` (already measured on the target) refine
    the time scale and are not returned."""
    measured = {config_key(r.config): r.step_time_s for r in target_records
                if r.status is TrialStatus.OK and r.step_time_s}
    best: dict[str, tuple[dict[str, Any], float | None, float | None, bool, str]] = {}
    for hw, records in sources:
        ok = {config_key(r.config): r.step_time_s for r in records
              if r.status is TrialStatus.OK and r.step_time_s}
        shared = [(ok[k], measured[k]) for k in ok.keys() & measured.keys()]
        scale = time_scale(hw, target, shared)
        for r in records:
            key = config_key(r.config)
            if key in best or key in measured or r.status not in (TrialStatus.OK, TrialStatus.OOM):
                continue
            source = f"{hw.device_name} x{hw.num_devices} ({r.backend}, trial {r.trial_id})"
            if r.status is TrialStatus.OOM:
                bound = r.memory_censor_bytes or hw.memory_bytes
                best[key] = (r.config, None, bound / target.memory_bytes, True, source + " OOM")
            elif r.step_time_s:
                peak = r.peak_memory_max_bytes
                frac = peak / target.memory_bytes if peak else None
                best[key] = (r.config, r.step_time_s * scale, frac, False, source)
    times = [b[1] for b in best.values() if b[1] is not None and (b[2] is None or b[2] < 1.0)]
    fastest = min(times) if times else None
    seeds = []
    for config, t, frac, lower, source in best.values():
        oom = frac is not None and frac >= 1.0
        speed = 0.0 if (t is None or oom or fastest is None) else fastest / t
        seeds.append(Seed(config, speed, frac, source, t, lower))
    return sorted(seeds, key=lambda s: (-s.predicted_relative_speed,
                                       s.predicted_step_time_s is None,
                                       s.predicted_step_time_s or 0.0))


def transfer(bank: Any, workload: WorkloadSignature, target: HardwareFingerprint,
             k: int | None = None) -> list[Seed]:
    """Seeds for running ``workload`` on ``target`` from the bank's experience of the same
    workload on other hardware (nearest hardware first), refined by trials already on target.
    """
    groups = bank.same_workload_other_hardware(workload)
    here = [recs for hw, recs in groups if hw == target]
    others = [(hw, recs) for hw, recs in groups if hw != target]
    others.sort(key=lambda g: _hw_distance(g[0], target))
    seeds = transfer_records(others, target, here[0] if here else ())
    return seeds[:k] if k is not None else seeds


def _hw_distance(a: HardwareFingerprint, b: HardwareFingerprint) -> float:
    from infrarsi.bank._codec import HARDWARE_WEIGHTS, weighted

    va, vb = weighted(a.vector(), HARDWARE_WEIGHTS), weighted(b.vector(), HARDWARE_WEIGHTS)
    return math.dist(va, vb) + (a.device_name != b.device_name)


@dataclass
class Projection:
    """What :func:`project_records` kept of some records for one search space, and why not
    the rest. ``sources``: records used per "workload on device" group; ``dropped``: reason ->
    count; ``context_knobs``: knobs the records carry that the space lacks (read as context);
    ``defaulted_knobs``: knobs of the space the records lack (read at the space's default);
    ``extrapolated``: records with a numeric value outside the space's domain."""

    records: list[TrialRecord] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    context_knobs: tuple[str, ...] = ()
    defaulted_knobs: tuple[str, ...] = ()
    extrapolated: int = 0

    @property
    def n_dropped(self) -> int:
        return sum(self.dropped.values())

    def summary(self, max_sources: int = 3) -> str:
        """One progress line: how many records, from where, what was projected, why dropped."""
        n = len(self.records)
        if not n and not self.dropped:
            return "experience: none"
        top = sorted(self.sources.items(), key=lambda kv: -kv[1])
        where = ", ".join(f"{k} ({v})" for k, v in top[:max_sources])
        if len(top) > max_sources:
            where += f" and {len(top) - max_sources} more"
        parts = [f"experience: using {n} of {n + self.n_dropped} records"
                 + (f" from {len(top)} workload/hardware groups: {where}" if n else "")]
        if self.context_knobs:
            parts.append(f"knobs this space lacks kept as context: {', '.join(self.context_knobs)}")
        if self.defaulted_knobs:
            parts.append(f"read at this space's default: {', '.join(self.defaulted_knobs)}")
        if self.extrapolated:
            parts.append(f"{self.extrapolated} with values outside this space's domain "
                         "(encoded on the same scale)")
        if self.dropped:
            parts.append("dropped " + "; ".join(f"{c}: {r}" for r, c in self.dropped.items()))
        return "; ".join(parts)


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _placeable(knob: Any, value: Any) -> bool:
    """Whether ``value`` (outside ``knob``'s domain) still has a place on its encoded column:
    a number on a numeric knob's log2/linear scale, any truth value on a bool knob."""
    if knob.kind == "bool":
        return isinstance(value, (bool, int))
    if knob.kind == "ordinal" and all(_numeric(v) for v in knob.values) and _numeric(value):
        return value > 0 or not all(v > 0 for v in knob.values)
    return False


def project_records(space: SearchSpace, records: Sequence[TrialRecord]) -> Projection:
    """Project ``records`` (any space, any hardware) onto ``space`` (see the module docstring)."""
    out = Projection()
    sources: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    context: set[str] = set()
    defaulted: set[str] = set()
    names = set(space.names)
    for r in records:
        reason = None
        outside = False
        for name, value in r.config.items():
            if name not in names:
                context.add(name)
                continue
            knob = space.knob(name)
            if value in knob.values:
                continue
            if _placeable(knob, value):
                outside = True
                continue
            reason = (f"{name}={value!r} is not a value of this space's {knob.kind} knob "
                      f"{list(knob.values)}")
            break
        if reason is not None:
            dropped[reason] += 1
            continue
        defaulted.update(names - set(r.config))
        out.extrapolated += outside
        out.records.append(r)
        sources[f"{r.workload.name or 'unnamed workload'} on {r.hardware.device_name}"] += 1
    out.sources, out.dropped = dict(sources), dict(dropped)
    out.context_knobs, out.defaulted_knobs = tuple(sorted(context)), tuple(sorted(defaulted))
    return out
