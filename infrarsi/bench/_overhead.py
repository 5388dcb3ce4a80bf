"""Ray Tune's own cost per Tuner and per trial, and the check that both engines agree."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from infrarsi.backends.base import Backend
from infrarsi.bench._engines import Trajectory
from infrarsi.bench._runner import ensure_ray, run_search
from infrarsi.space import config_key

__all__ = ["same_trajectory", "tune_overhead"]


def _signature(t: Trajectory) -> list[tuple[str, str, Any]]:
    return [(config_key(r.config), r.status.value, r.extra.get("objective")) for r in t.records]


def same_trajectory(a: Trajectory, b: Trajectory) -> bool:
    """Same configs, outcomes and measured objectives, in the same order."""
    return _signature(a) == _signature(b)


def tune_overhead(backend: Backend, searchers: Sequence[str], *, budgets: tuple[int, int] = (4, 12),
                  seed: int = 0) -> dict[str, Any]:
    """Run each searcher through Tune and inline at two budgets. Per-trial overhead is the slope
    of (Tune wall - inline wall) over the budget, per-Tuner overhead the intercept."""
    ensure_ray()
    rows, per_trial, per_tuner = [], [], []
    for name in searchers:
        walls = []
        for budget in budgets:
            tuned = run_search(name, backend, budget=budget, seed=seed, engine="tune")
            inline = run_search(name, backend, budget=budget, seed=seed, engine="inline")
            same = same_trajectory(tuned, inline)
            n = len(tuned.records)
            walls.append((n, tuned.wall_s - inline.wall_s))
            rows.append({"searcher": name, "budget": budget, "trials": n, "identical": same,
                         "tune_wall_s": tuned.wall_s, "inline_wall_s": inline.wall_s})
        (n1, w1), (n2, w2) = walls
        if n2 > n1:
            slope = (w2 - w1) / (n2 - n1)
            per_trial.append(slope)
            per_tuner.append(w1 - slope * n1)
    return {
        "runs": rows,
        "all_identical": all(r["identical"] for r in rows),
        "per_trial_s": statistics.median(per_trial) if per_trial else None,
        "per_tuner_s": statistics.median(per_tuner) if per_tuner else None,
    }
