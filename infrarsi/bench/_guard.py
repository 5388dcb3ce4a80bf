"""Keeps a per-knob sampler on configs that can run, without charging it for the ones that cannot.

The rule (stated in the benchmark report): a peer samples each *searched* knob from its legal
values. When the combination has no legal completion (for a table: it was never measured), the
sample is answered as *not run*: the wrapped searcher hears ``on_trial_complete(error=True)``
(what Tune tells it when a trial fails at launch) with the result ``{"status": "not_run"}``, no trial and no device time is spent, and it
is asked again. After ``max_not_run`` refusals in a row the guard runs a uniformly drawn legal
config instead and does not report it to the wrapped searcher (counted as a fallback).
"""

from __future__ import annotations

import random

from ray.tune.search import Searcher

from infrarsi.bench._view import SpaceView

__all__ = ["NOT_RUN", "LegalityGuard"]

NOT_RUN = {"status": "not_run"}  # the result a not-run sample completes with (error=True)


class LegalityGuard(Searcher):
    """Wraps a Tune ``Searcher`` (like Tune's ``ConcurrencyLimiter``) for a finite legal set."""

    def __init__(self, searcher: Searcher, view: SpaceView, *, seed: int = 0,
                 max_not_run: int = 100) -> None:
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.view = view
        self.max_not_run = max_not_run
        self._rng = random.Random(seed)
        self._inner_id: dict[str, str | None] = {}
        self.not_run = 0
        self.fallbacks = 0
        self.log: list[tuple[int, int]] = []  # (not_run, fallbacks) so far, per suggested trial

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        ok = self.searcher.set_search_properties(metric, mode, config, **spec)
        self._metric, self._mode = self.searcher.metric or metric, self.searcher.mode or mode
        return ok

    def suggest(self, trial_id: str):
        for attempt in range(self.max_not_run):
            inner_id = trial_id if attempt == 0 else f"{trial_id}~notrun{attempt}"
            config = self.searcher.suggest(inner_id)
            if config is None or config == Searcher.FINISHED:
                return config
            full = self.view.resolve(config, self._rng)
            if full is not None:
                self._inner_id[trial_id] = inner_id
                self.log.append((self.not_run, self.fallbacks))
                return full
            self.not_run += 1
            self.searcher.on_trial_complete(inner_id, dict(NOT_RUN), error=True)
        self.fallbacks += 1
        self._inner_id[trial_id] = None
        self.log.append((self.not_run, self.fallbacks))
        return dict(self._rng.choice(self.view.legal_configs()))

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        inner = self._inner_id.get(trial_id)
        if inner is not None:
            self.searcher.on_trial_result(inner, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        inner = self._inner_id.pop(trial_id, None)
        if inner is not None:
            self.searcher.on_trial_complete(inner, result, error=error)

    def get_state(self) -> dict:
        return {"not_run": self.not_run, "fallbacks": self.fallbacks}

    def set_state(self, state: dict) -> None:
        self.not_run, self.fallbacks = state["not_run"], state["fallbacks"]
