"""The search's observation log: what was tried, what may be tried again, and when to stop.

An observation is ``{"record": TrialRecord.to_dict(), "origin": str}``, kept as plain dicts so
the engine's state survives a driver restart as JSON. Everything here is a function of the log
(and the space), so a restored search decides as the original would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from infrarsi.search._policy import (
    BROKEN_AFTER,
    BROKEN_AFTER_SUSPECTS,
    CLUSTER_FAULT_TRIES,
    CLUSTER_FAULT_VALUES,
    LIGHTEST_PROBES,
    SLOW_STOP_FACTOR,
)
from infrarsi.space import Config, SearchSpace, config_key
from infrarsi.trial import HardwareFingerprint, TrialRecord, TrialStatus

Observation = dict[str, Any]


def records(observations: Sequence[Observation]) -> list[TrialRecord]:
    return [TrialRecord.from_dict(o["record"]) for o in observations]


def best(recs: Sequence[TrialRecord], objective) -> tuple[TrialRecord, float] | None:
    """The record with the highest finite objective, or None."""
    scored = [(r, objective(r)) for r in recs]
    scored = [(r, v) for r, v in scored if v is not None and math.isfinite(v)]
    return max(scored, key=lambda rv: rv[1]) if scored else None


def tries(space: SearchSpace, observations: Sequence[Observation]) -> dict[str, tuple[int, int]]:
    """Config key -> (trials the cluster lost, other trials), from the raw observations."""
    out: dict[str, tuple[int, int]] = {}
    for o in observations:
        rec = o["record"]
        key = config_key(space.normalize(rec["config"], check=False))
        lost = (rec["status"] == TrialStatus.ERROR.value
                and rec.get("error_kind") in CLUSTER_FAULT_VALUES)
        n_lost, n_other = out.get(key, (0, 0))
        out[key] = (n_lost + lost, n_other + (not lost))
    return out


def measured_keys(space: SearchSpace, observations: Sequence[Observation]) -> set[str]:
    """Configs never to propose again: every one tried, except those whose trials the
    cluster lost (see CLUSTER_FAULTS) fewer than CLUSTER_FAULT_TRIES times."""
    return {k for k, (lost, other) in tries(space, observations).items()
            if other or lost >= CLUSTER_FAULT_TRIES}


def lost_keys(space: SearchSpace, observations: Sequence[Observation]) -> set[str]:
    """Configs whose trials so far were all lost by the cluster (a new trial is a retry)."""
    return {k for k, (_, other) in tries(space, observations).items() if not other}


def slow_stop_s(recs: Sequence[TrialRecord]) -> float | None:
    """The step time past which a new trial's outcome is certain, or None before any ok."""
    steps = [r.step_time_s for r in recs if r.ok and r.step_time_s]
    return SLOW_STOP_FACTOR * min(steps) if steps else None


def suspect_settings(space: SearchSpace, baseline: Config | None,
                     recs: Sequence[TrialRecord]) -> set[tuple[str, Any]]:
    """Non-baseline knob settings shared by every errored trial (two or more) and by no ok
    trial: the likely cause of the crashes (a patch that breaks under bf16, a compile mode
    this stack cannot compile), so the search steers around them instead of giving up."""
    errs = [r for r in recs if r.status is TrialStatus.ERROR]
    if len(errs) < 2:
        return set()
    base = baseline or space.defaults()
    common: set[tuple[str, Any]] | None = None
    for r in errs:
        c = space.normalize(r.config, check=False)
        mine = {(k, v) for k, v in c.items() if v != base.get(k)}
        common = mine if common is None else common & mine
    seen_ok = {(k, v) for r in recs if r.ok for k, v in r.config.items()}
    return (common or set()) - seen_ok


def _fmt_config(config: Config) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items()))


def stop_reason(space: SearchSpace, baseline: Config | None, hardware: HardwareFingerprint,
                own: Sequence[TrialRecord], lightest_probes: Sequence[str]) -> str | None:
    """Why the search should stop after these trials, or None: nothing fits the device (the
    lightest probes ran out of memory too), or every trial crashed and no shared setting
    explains it (the workload looks broken, not slow)."""
    if len(lightest_probes) == LIGHTEST_PROBES and not any(r.ok for r in own):
        probe = [r for r in own
                 if config_key(space.normalize(r.config, check=False)) in lightest_probes]
        if len(probe) == LIGHTEST_PROBES and all(r.status is TrialStatus.OOM for r in probe):
            cap = hardware.memory_bytes
            cap_txt = f" ({cap / 2**30:.1f} GiB per device)" if cap else ""
            return (
                f"out of memory everywhere: all {len(own)} trials ran out of memory, including "
                f"the lightest configs the memory model and the physics of the knobs point to, e.g. "
                f"({_fmt_config(probe[-1].config)}), so no config searched fits the "
                f"device{cap_txt}. Add memory savers to the search "
                "space (activation checkpointing, sharded optimizer state, more devices for "
                "tensor/pipeline parallelism) or a smaller micro-batch range.")
    all_failed = len(own) >= BROKEN_AFTER and all(r.status is TrialStatus.ERROR for r in own)
    # crashes that share a setting are that setting's fault: steer around it first
    if all_failed and (len(own) >= BROKEN_AFTER_SUSPECTS
                       or not suspect_settings(space, baseline, own)):
        kinds = sorted({r.error_kind.value for r in own if r.error_kind})
        return (f"the first {len(own)} trials all failed ({', '.join(kinds)}): the workload looks "
                f"broken, not slow. Last error: {own[-1].error_message[:300]}")
    return None
