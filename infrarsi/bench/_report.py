"""Figures of a benchmark: per run, per (workload, searcher, budget) cell, and overall; JSON.

Per run: the best objective found as a fraction of the best in the space (for a table: its best
measured ok row; 0 when the search found no config that ran), the share of trials that were OOM
or failed, the device-time spent on them, and the trials needed to reach 95 % of the best.
Geometric means floor a fraction at ``FLOOR`` (1 %) so that a search that found nothing counts
as a large loss instead of zeroing the mean; how many runs found nothing is reported beside it,
and so is the geometric mean over the runs that found something.
Workloads with no ok row at all have no "best" and are left out of every figure (listed).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from infrarsi.bench._runner import BenchRun

__all__ = ["FLOOR", "RunMetrics", "format_report", "load_metrics", "metrics", "summarize",
           "to_json"]

FLOOR = 0.01
REACH = 0.95


@dataclass(frozen=True)
class RunMetrics:
    workload: str
    searcher: str
    experience: bool
    budget: int
    seed: int
    trials: int
    failed: int
    fail_share: float
    device_s: float
    device_s_failed: float
    best_found: float | None
    fraction: float | None
    trials_to_95: int | None
    not_run: int
    fallbacks: int
    wall_s: float


def metrics(run: BenchRun) -> RunMetrics:
    recs = run.trajectory.records
    best_in = run.best_in_space
    # a simulator scores a found config by its noise-free value ("true_objective")
    objs = [r.extra.get("true_objective", r.extra.get("objective", r.tokens_per_s)) if r.ok
            else None for r in recs]
    found = [o for o in objs if o is not None]
    maximize = run.maximize
    best_found = (max(found) if maximize else min(found)) if found else None
    fraction = None
    if best_in:
        fraction = 0.0 if best_found is None else (best_found / best_in if maximize
                                                   else best_in / best_found)
    to95 = None
    if best_in:
        for i, o in enumerate(objs, 1):
            if o is not None and (o >= REACH * best_in if maximize else o <= best_in / REACH):
                to95 = i
                break
    failed = [r for r in recs if not r.ok]
    return RunMetrics(
        run.workload, run.searcher, run.experience, run.budget, run.seed, len(recs), len(failed),
        len(failed) / len(recs) if recs else 0.0, sum(r.device_seconds for r in recs),
        sum(r.device_seconds for r in failed), best_found, fraction, to95,
        run.trajectory.not_run, run.trajectory.fallbacks, run.trajectory.wall_s)


def _geo(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(x, FLOOR)) for x in xs)) if xs else float("nan")


def _cell(ms: Sequence[RunMetrics]) -> dict[str, Any]:
    fr = [m.fraction for m in ms if m.fraction is not None]
    reached = [m.trials_to_95 for m in ms if m.trials_to_95 is not None]
    return {
        "runs": len(ms),
        "geomean_fraction": _geo(fr),
        "geomean_fraction_found": _geo([f for f in fr if f > 0]),
        "mean_fraction": statistics.fmean(fr) if fr else float("nan"),
        "found_nothing": sum(1 for m in ms if m.best_found is None),
        "mean_trials": statistics.fmean(m.trials for m in ms),
        "mean_fail_share": statistics.fmean(m.fail_share for m in ms),
        "mean_device_h_failed": statistics.fmean(m.device_s_failed for m in ms) / 3600,
        "mean_device_h": statistics.fmean(m.device_s for m in ms) / 3600,
        "reached_95_share": len(reached) / len(ms) if ms else float("nan"),
        "median_trials_to_95": statistics.median(reached) if reached else None,
        "mean_not_run": statistics.fmean(m.not_run for m in ms),
        "fallbacks": sum(m.fallbacks for m in ms),
    }


def _label(m: RunMetrics) -> str:
    return f"{m.searcher}+exp" if m.experience else m.searcher


def summarize(ms: Sequence[RunMetrics]) -> dict[str, Any]:
    """Cells per workload and overall, keyed by budget then searcher label."""
    scored = [m for m in ms if m.fraction is not None]
    per_wl: dict = defaultdict(lambda: defaultdict(dict))
    groups: dict = defaultdict(list)
    for m in scored:
        groups[(m.workload, m.budget, _label(m))].append(m)
    for (wl, budget, label), g in groups.items():
        per_wl[wl][budget][label] = _cell(g)
    overall: dict = defaultdict(dict)
    og: dict = defaultdict(list)
    for m in scored:
        og[(m.budget, _label(m))].append(m)
    for (budget, label), g in og.items():
        overall[budget][label] = _cell(g)
    return {
        "overall": {str(b): v for b, v in sorted(overall.items())},
        "per_workload": {wl: {str(b): v for b, v in sorted(d.items())} for wl, d in per_wl.items()},
        "unscored_workloads": sorted({m.workload for m in ms if m.fraction is None}),
    }


def _row(label: str, c: dict[str, Any]) -> str:
    t95 = "-" if c["median_trials_to_95"] is None else f"{c['median_trials_to_95']:.0f}"
    return (f"  {label:<26} {c['geomean_fraction']:>6.3f} {c['geomean_fraction_found']:>6.3f} "
            f"{c['mean_fraction']:>6.3f} "
            f"{c['found_nothing']:>4d} {c['mean_fail_share']:>6.1%} {c['mean_device_h_failed']:>8.2f} "
            f"{c['reached_95_share']:>6.0%} {t95:>5} {c['mean_trials']:>6.1f} {c['mean_not_run']:>7.1f} "
            f"{c['fallbacks'] / c['runs']:>6.2f}")


_HEADER = (f"  {'searcher':<26} {'geo':>6} {'geo>0':>6} {'mean':>6} {'none':>4} {'fail':>6} {'fail dev-h':>8} "
           f"{'≥95%':>6} {'t95':>5} {'trials':>6} {'not-run':>7} {'fallbk':>6}")


def format_report(summary: dict[str, Any], *, per_workload: bool = True) -> str:
    lines = []
    if per_workload:
        for wl, budgets in summary["per_workload"].items():
            for b, cells in budgets.items():
                lines.append(f"{wl}  budget {b}")
                lines.append(_HEADER)
                lines += [_row(label, c) for label, c in sorted(cells.items())]
        lines.append("")
    for b, cells in summary["overall"].items():
        lines.append(f"OVERALL  budget {b}  ({next(iter(cells.values()))['runs']} runs per searcher)")
        lines.append(_HEADER)
        lines += [_row(label, c) for label, c in sorted(cells.items(),
                                                      key=lambda kv: -kv[1]["geomean_fraction"])]
    if summary["unscored_workloads"]:
        lines.append(f"not scored (no ok row in the space): {', '.join(summary['unscored_workloads'])}")
    lines.append(
        "geo/mean: best found / best in space (geo-mean floors at 1%); geo>0: geo-mean over runs "
        "that found a config that ran; none: runs that found none; fail: share of trials OOM or failed; fail dev-h: device-hours spent on "
        "them per run; ≥95%: runs reaching 95% of best; t95: median trials to get there; "
        "not-run: unmeasured samples refused per run (free); fallbk: random fallbacks per run")
    lines.append(
        "rule: per-knob samplers draw the searched knobs from their measured values; a combination "
        "never measured is answered 'not run' (an errored trial to the searcher, no budget, no "
        "device time), retried up to 100 times, then a uniformly drawn measured config is run "
        "(fallback). Random search draws uniformly from the measured configs.")
    return "\n".join(lines)


def to_json(ms: Sequence[RunMetrics], runs: Sequence[BenchRun], summary: dict[str, Any],
            meta: dict[str, Any]) -> str:
    traj = [[{"config": r.config, "status": r.status.value,
              "objective": r.extra.get("objective"), "device_seconds": r.device_seconds}
             for r in run.trajectory.records] for run in runs]
    rows = [{**asdict(m), "trajectory": t} for m, t in zip(ms, traj, strict=True)]
    return json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=1, default=str)


def load_metrics(text: str) -> tuple[list[RunMetrics], dict[str, Any]]:
    """The per-run metrics and meta of a JSON written by :func:`to_json` (to re-summarize or
    compare an earlier run with the current report code)."""
    data = json.loads(text)
    names = set(RunMetrics.__dataclass_fields__)
    return [RunMetrics(**{k: v for k, v in r.items() if k in names}) for r in data["runs"]], data["meta"]
