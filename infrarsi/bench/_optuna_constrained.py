"""Optuna TPE with OOM reported as a constraint violation (Optuna's ``constraints_func``).

Ray Tune's ``OptunaSearch`` cannot attach a constraint to a trial and turns an errored trial
into a FAIL that TPE ignores, so this Searcher drives an Optuna study with ask/tell itself, the
way Optuna documents constrained optimization (``Trial.set_constraint``; the sampler-level
``constraints_func`` before Optuna 5): a trial that ran out of memory or crashed is told as
COMPLETE with the worst value and constraint ``oom`` = 1.0 (infeasible); one that ran is told its
objective with constraint 0.0. A sample that cannot run (the guard's *not run*: a combination
the table never measured) is infeasible too (constraint ``not_run`` = 1.0) — that is the point
of telling TPE constraints; the plain OptunaSearch peer sees it as an errored trial instead.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher

__all__ = ["OptunaConstrainedSearch"]

_CONSTRAINT = "constraint"


_NAMES = ("oom", "not_run")
_HAS_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")


def _constraints(trial: optuna.trial.FrozenTrial) -> tuple[float, ...]:
    return tuple(float(trial.user_attrs.get(f"{_CONSTRAINT}_{n}", 0.0)) for n in _NAMES)


def _set(trial: optuna.trial.Trial, oom: float, not_run: float) -> None:
    for name, value in zip(_NAMES, (oom, not_run), strict=True):
        if _HAS_SET_CONSTRAINT:
            trial.set_constraint(name, value)
        else:
            trial.set_user_attr(f"{_CONSTRAINT}_{name}", value)


class OptunaConstrainedSearch(Searcher):
    def __init__(self, domains: dict[str, tuple[Any, ...]], *, metric: str = "objective",
                 mode: str = "max", seed: int = 0, worst: float = 0.0) -> None:
        super().__init__(metric=metric, mode=mode)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if _HAS_SET_CONSTRAINT:
            sampler = optuna.samplers.TPESampler(seed=seed)
        else:
            sampler = optuna.samplers.TPESampler(seed=seed, constraints_func=_constraints)
        direction = "maximize" if mode == "max" else "minimize"
        self.study = optuna.create_study(direction=direction, sampler=sampler)
        self.distributions = {k: CategoricalDistribution(list(v)) for k, v in domains.items()}
        self.worst = worst
        self._trials: dict[str, optuna.trial.Trial] = {}
        self._last: dict[str, dict] = {}

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str):
        trial = self.study.ask(self.distributions)
        self._trials[trial_id] = trial
        return dict(trial.params)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._last[trial_id] = result

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        trial = self._trials.pop(trial_id, None)
        if trial is None:
            return
        result = result or self._last.pop(trial_id, None)
        status = (result or {}).get("status")
        if status == "ok" and not error:
            _set(trial, 0.0, 0.0)
            self.study.tell(trial, float(result[self.metric]))
        elif status in ("oom", "error"):
            _set(trial, 1.0, 0.0)
            self.study.tell(trial, self.worst)
        elif status == "not_run":
            _set(trial, 0.0, 1.0)
            self.study.tell(trial, self.worst)
        else:  # crashed without a result (a bug in the trial body, not a measurement)
            self.study.tell(trial, state=TrialState.FAIL)
