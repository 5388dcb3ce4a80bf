"""The baseline's phase profile and memory, summarized over repeats and ranks.

Each baseline trial carries, in ``record.extra["profile"]["per_rank"]``, what the harness
measured on one extra profiled step (``infrarsi.harness.profile``): seconds per phase,
communication in total and overlapped, and the memory breakdown. Here those become fractions of
the step (averaged over repeats and ranks, summing to 1) and a per-rank table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infrarsi.harness.profile import PHASES
from infrarsi.trial import TrialRecord

__all__ = ["PHASES", "fractions", "summarize_profile"]

SOURCE = ("torch.profiler on one extra, unmeasured step per baseline trial (after the measured "
          "steps), infrarsi::<phase> labels in the harness step loop")
_MEM_KEYS = ("params", "grads", "optimizer_state", "ddp_buckets", "activations_and_other")


def fractions(phases_s: dict[str, float]) -> dict[str, float]:
    """Phase seconds as fractions of their sum (the step: the harness makes them disjoint)."""
    total = sum(v for v in phases_s.values() if v > 0)
    if total <= 0:
        return {}
    return {k: max(v, 0.0) / total for k, v in phases_s.items()}


def _mean(dicts: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = list(dict.fromkeys(k for d in dicts for k in d))
    return {k: sum(d.get(k, 0.0) for d in dicts) / len(dicts) for k in keys} if dicts else {}


def summarize_profile(records: Sequence[TrialRecord]) -> dict[str, Any]:
    """The payload's ``profile``: ``fractions``, ``phases_s``, ``step_s``, ``per_rank``,
    ``communication``, ``memory_bytes`` (rank 0), ``peak_memory_bytes`` (per rank),
    ``host_syncs``, ``source``, ``timeline`` and ``missing`` (parts that could not be taken)."""
    per_rank: dict[int, list[dict[str, Any]]] = {}
    errors: list[str] = []
    for rec in records:
        ranks = ((rec.extra or {}).get("profile") or {}).get("per_rank") or []
        if not ranks:
            errors.append(f"trial {rec.trial_id}: no profile came back")
        for r, prof in enumerate(ranks):
            if prof and "phases_s" in prof:
                per_rank.setdefault(r, []).append(prof)
            else:
                errors.append(f"trial {rec.trial_id} rank {r}: {(prof or {}).get('error', 'no profile')}")
    out: dict[str, Any] = {"source": SOURCE, "missing": []}
    peaks = [rec.peak_memory_bytes for rec in records if rec.peak_memory_bytes]
    if peaks:
        out["peak_memory_bytes"] = [max(p[i] for p in peaks) for i in range(min(map(len, peaks)))]
    if not per_rank:
        out["missing"] = ["phase profile", "communication overlap", "memory breakdown"]
        out["errors"] = errors
        return out
    everything = [p for ps in per_rank.values() for p in ps]
    phases = _mean([p["phases_s"] for p in everything])
    comm_total = sum(p.get("comm_total_s", 0.0) for p in everything) / len(everything)
    comm_over = sum(p.get("comm_overlapped_s", 0.0) for p in everything) / len(everything)
    out.update({
        "fractions": fractions(phases),
        "phases_s": phases,
        "step_s": sum(p["step_s"] for p in everything) / len(everything),
        "timeline": everything[0].get("timeline", ""),
        "per_rank": [{"rank": r, "fractions": fractions(_mean([p["phases_s"] for p in ps])),
                      "step_s": sum(p["step_s"] for p in ps) / len(ps), "samples": len(ps)}
                     for r, ps in sorted(per_rank.items())],
        "communication": {
            "total_s": comm_total,
            "exposed_s": phases.get("communication", 0.0),
            "overlapped_s": comm_over,
            "overlapped_fraction": comm_over / comm_total if comm_total > 0 else None,
        },
        "host_syncs": _mean([p.get("sync_ops", {}) for p in everything]),
    })
    mem = [p.get("memory_bytes") for p in per_rank.get(0, []) if p.get("memory_bytes")]
    if mem:
        out["memory_bytes"] = {k: mem[-1].get(k) for k in (*_MEM_KEYS, "peak")}
        if mem[-1].get("peak") is None:
            out["missing"].append("activation memory (no peak measured)")
    else:
        out["missing"].append("memory breakdown")
    if errors:
        out["errors"] = errors
    if len(per_rank) < max(len((r.extra or {}).get("profile", {}).get("per_rank") or []) for r in records):
        out["missing"].append("some ranks' profiles")
    return out
