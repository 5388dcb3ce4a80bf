"""The benchmark grid: workloads x searchers (x experience) x budgets x seeds.

Experience is leave-one-workload-out: a searcher that declares ``uses_experience`` is run twice
per cell, once with the records of every *other* workload of the same table and once with none;
the workload being searched is never in its experience. Peers are run once, without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray import tune
from ray.tune.search import Searcher

from infrarsi.backends.base import Backend
from infrarsi.bench._engines import CONFIG_KEY, Trajectory, run_inline, run_tune
from infrarsi.bench._guard import LegalityGuard
from infrarsi.bench._peers import SEARCHERS
from infrarsi.bench._view import SpaceView
from infrarsi.trial import TrialRecord

__all__ = ["BenchRun", "ensure_ray", "run_bench", "run_search"]

ENGINES = {"tune": run_tune, "inline": run_inline}


@dataclass
class BenchRun:
    """One search of one workload: the cell's keys and what happened."""

    workload: str
    searcher: str
    experience: bool
    budget: int
    seed: int
    best_in_space: float | None
    maximize: bool = True
    trajectory: Trajectory = field(repr=False, default_factory=Trajectory)


def ensure_ray(num_cpus: int = 2) -> None:
    """One local Ray instance for the whole benchmark (quiet, no dashboard)."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if not ray.is_initialized():
        from infrarsi.backends.ray_train._priority import with_trial_priority

        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR", configure_logging=True, runtime_env=with_trial_priority())


def build_search_alg(name: str, backend: Backend, *, budget: int, seed: int,
                     experience: list[TrialRecord] | None):
    """The registered searcher for ``name``, wrapped in the legality guard when it suggests
    per-knob samples, and the param space Tune needs for it."""
    factory = SEARCHERS[name]
    alg = factory(backend.space, backend, budget, seed, experience)
    param_space: dict[str, Any] = {}
    view = SpaceView(backend)
    if isinstance(alg, Searcher):
        alg = LegalityGuard(alg, view, seed=seed)
    else:  # a variant generator: one categorical over the legal configs
        param_space = {CONFIG_KEY: tune.choice([view.key(c) for c in view.legal_configs()])}
    return alg, param_space, getattr(factory, "oom_as_error", False), view.mode


def run_search(name: str, backend: Backend, *, budget: int, seed: int, engine: str = "inline",
               experience: list[TrialRecord] | None = None) -> Trajectory:
    alg, param_space, oom_as_error, mode = build_search_alg(
        name, backend, budget=budget, seed=seed, experience=experience)
    return ENGINES[engine](alg, backend, budget=budget, seed=seed, mode=mode,
                           oom_as_error=oom_as_error, param_space=param_space)


def _experience_by_workload(backends: Sequence[Backend]) -> Callable[[int], list[TrialRecord]]:
    own = [list(b.records()) if hasattr(b, "records") else [] for b in backends]

    def others(i: int) -> list[TrialRecord]:
        return [r for j, recs in enumerate(own) if j != i for r in recs]

    return others


def run_bench(backends: Sequence[Backend], *, searchers: Iterable[str], budgets: Iterable[int],
              seeds: Iterable[int], engine: str = "inline",
              progress: Callable[[str], None] | None = None,
              experience: Callable[[int, Backend], list[TrialRecord]] | None = None,
              ) -> list[BenchRun]:
    """Every cell of the grid. ``backends`` are the workloads of one table (or simulator).

    ``experience(i, backend)``: the records the ``+exp`` rows of workload ``i`` start from
    (another table, a bank); default, the records of the table's other workloads."""
    if engine == "tune":
        ensure_ray()
    names, budgets, seeds = list(searchers), list(budgets), list(seeds)
    unknown = [n for n in names if n not in SEARCHERS]
    if unknown:
        raise KeyError(f"unknown searcher(s) {unknown}; registered: {sorted(SEARCHERS)}")
    loo = _experience_by_workload(backends)
    experience_for = (lambda i: experience(i, backends[i])) if experience else loo
    runs: list[BenchRun] = []
    for i, backend in enumerate(backends):
        t0 = time.perf_counter()
        best = getattr(backend, "best_objective", lambda: None)()
        maximize = SpaceView(backend).maximize
        wname = getattr(backend, "workload_name", backend.workload.name)
        for name in names:
            variants = [False, True] if getattr(SEARCHERS[name], "uses_experience", False) else [False]
            for with_exp in variants:
                exp = experience_for(i) if with_exp else None
                aware = getattr(SEARCHERS[name], "budget_aware", True)
                for seed in seeds:
                    full = None if aware else run_search(
                        name, backend, budget=max(budgets), seed=seed, engine=engine,
                        experience=exp)
                    for budget in budgets:
                        traj = full.prefix(budget) if full is not None else run_search(
                            name, backend, budget=budget, seed=seed, engine=engine,
                            experience=exp)
                        runs.append(BenchRun(wname, name, with_exp, budget, seed, best,
                                             maximize, traj))
        if progress:
            progress(f"{wname}: {time.perf_counter() - t0:.1f}s")
    return runs
