"""The searcher registry: each entry builds a Ray Tune search algorithm, run as its users run it.

A factory is called as ``factory(space, backend, budget, seed, experience)`` and returns a Tune
``SearchAlgorithm`` (usually a ``Searcher``). ``experience`` is ``None`` or the records of the
*other* workloads of the same table (leave-one-workload-out); peers ignore it, as their users do.
Add a searcher with one line::

    SEARCHERS["infrarsi"] = make_infrarsi_searcher

Optional attributes on the factory (set them with :func:`register_searcher`):
``uses_experience`` (the runner then runs it with and without experience, as two rows) and
``oom_as_error`` (the trainable raises on a failed trial, so Tune reports it as an errored trial
with no result: how a user of a generic tuner sees an OOM) and ``budget_aware`` (default True;
False lets the runner take budgets 10 and 15 as prefixes of one budget-25 run, which is exact for
a searcher that never reads its budget).
Searchers that return configs of *searched* knobs are wrapped in the
:class:`~infrarsi.bench._guard.LegalityGuard` by the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray import tune
from ray.tune.search import SearchAlgorithm
from ray.tune.search.basic_variant import BasicVariantGenerator

from infrarsi.backends.base import Backend
from infrarsi.bench._optuna_constrained import OptunaConstrainedSearch
from infrarsi.bench._scripted import DeepSpeedAutotunerSearcher, GreedyClimberSearcher
from infrarsi.bench._view import SpaceView
from infrarsi.space import SearchSpace
from infrarsi.trial import TrialRecord

__all__ = ["METRIC", "SEARCHERS", "SearcherFactory", "register_searcher"]

METRIC = "objective"
SearcherFactory = Callable[
    [SearchSpace, Backend, int, int, "list[TrialRecord] | None"], SearchAlgorithm]
SEARCHERS: dict[str, SearcherFactory] = {}


def register_searcher(name: str, *, uses_experience: bool = False, oom_as_error: bool = False,
                      budget_aware: bool = True):
    """Decorator: add a factory to :data:`SEARCHERS` with its flags."""

    def deco(factory: SearcherFactory) -> SearcherFactory:
        factory.uses_experience = uses_experience
        factory.oom_as_error = oom_as_error
        factory.budget_aware = budget_aware
        SEARCHERS[name] = factory
        return factory

    return deco


def _tune_domains(view: SpaceView) -> dict[str, Any]:
    """The param space a user writes: a categorical choice per searched knob."""
    return {k: tune.choice(list(view.domain(k))) for k in view.searched}


@register_searcher("random", budget_aware=False)
def make_random(space, backend, budget, seed, experience=None):
    """Tune's default variant generator. Its param space (set by the runner) is one categorical
    over the legal configs, so each sample is a uniform draw from them (what rejection sampling
    of per-knob values would give, without the rejections)."""
    return BasicVariantGenerator(random_state=seed, max_concurrent=1)


@register_searcher("optuna_tpe", oom_as_error=True, budget_aware=False)
def make_optuna(space, backend, budget, seed, experience=None):
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created" line per search
    view = SpaceView(backend)
    space = OptunaSearch.convert_search_space(_tune_domains(view))  # as Tune would from param_space
    return OptunaSearch(space=space, metric=METRIC, mode=view.mode, seed=seed)


@register_searcher("optuna_tpe_constrained", budget_aware=False)
def make_optuna_constrained(space, backend, budget, seed, experience=None):
    view = SpaceView(backend)
    domains = {k: view.domain(k) for k in view.searched}
    worst = 0.0 if view.maximize else float("inf")
    return OptunaConstrainedSearch(domains, metric=METRIC, mode=view.mode, seed=seed, worst=worst)


@register_searcher("hyperopt", oom_as_error=True, budget_aware=False)
def make_hyperopt(space, backend, budget, seed, experience=None):
    from ray.tune.search.hyperopt import HyperOptSearch

    view = SpaceView(backend)
    space = HyperOptSearch.convert_search_space(_tune_domains(view))
    return HyperOptSearch(space=space, metric=METRIC, mode=view.mode, random_state_seed=seed)


@register_searcher("deepspeed_autotuner", budget_aware=False)
def make_deepspeed(space, backend, budget, seed, experience=None):
    return DeepSpeedAutotunerSearcher(SpaceView(backend), metric=METRIC, seed=seed)


@register_searcher("greedy_one_knob", budget_aware=False)
def make_greedy(space, backend, budget, seed, experience=None):
    return GreedyClimberSearcher(SpaceView(backend), metric=METRIC, seed=seed)
