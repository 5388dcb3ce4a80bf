"""Sequential peer strategies as Tune Searchers: a generator yields configs, receives results.

* :class:`DeepSpeedAutotunerSearcher` — DeepSpeed's autotuner (deepspeed/autotuning/autotuner.py,
  ``tune`` / ``tune_space`` / ``get_min_max_micro_batch_size`` / ``run_tuning_micro_batch_sizes``)
  mapped onto a table's knobs: ZeRO stages in increasing order; per stage the user's micro-batch
  (else the smallest) must run, then the largest micro-batch is probed and a binary search finds
  the largest that fits, stopping early when throughput plateaus (< 5 % gain,
  ``METRIC_PERCENT_DIFF_CONST``); then an evenly spread list of 3 micro-batches between min and max
  is run and smaller ones below the max are tried while they gain >= 5 %. A later stage is tuned
  only if its largest fitting micro-batch is not below the previous stage's. DeepSpeed does not
  tune model parallelism: tp, pp and every other knob stay at the baseline. Differences, forced
  by a table: DeepSpeed's memory-based estimate of the max micro-batch is unknown, so the largest
  measured one is probed; a micro-batch the table never measured counts as "does not run" but
  costs no trial; a config already run is not run again (its result is reused).
* :class:`GreedyClimberSearcher` — one incumbent, one edit at a time (how a coding agent edits):
  from the baseline, try the one-knob edits in random order (ordinal knobs: the nearest legal
  value above and below; others: every legal value) and accept the first that improves; stop at a
  local optimum.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from typing import Any

from ray.tune.search import Searcher

from infrarsi.bench._view import SpaceView
from infrarsi.space import Config

__all__ = ["DeepSpeedAutotunerSearcher", "GreedyClimberSearcher", "ScriptedSearcher"]

Script = Generator[Config, "float | None", None]
PLATEAU = 0.05  # DeepSpeed's METRIC_PERCENT_DIFF_CONST


class ScriptedSearcher(Searcher):
    """One trial at a time. ``script()`` yields a legal config and gets back its objective
    (None when the trial failed). Keeps each trial's last result itself, because Tune calls
    ``on_trial_complete(error=True)`` without one when a trial raises."""

    def __init__(self, view: SpaceView, *, metric: str = "objective", seed: int = 0) -> None:
        super().__init__(metric=metric, mode=view.mode)
        self.view = view
        self.rng = random.Random(seed)
        self._gen: Script | None = None
        self._next: Config | str | None = None
        self._pending: str | None = None
        self._last: dict[str, dict] = {}
        self._seen: dict[str, float | None] = {}

    def script(self) -> Script:  # pragma: no cover - abstract
        raise NotImplementedError

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the strategy defines its own space; metric and mode come from the view

    def suggest(self, trial_id: str):
        if self._pending is not None:
            return None
        if self._gen is None:
            self._gen = self.script()
            self._advance(None, first=True)
        if self._next == Searcher.FINISHED:
            return Searcher.FINISHED
        self._pending = trial_id
        return dict(self._next)

    def _advance(self, value: float | None, *, first: bool = False) -> None:
        try:
            self._next = next(self._gen) if first else self._gen.send(value)
        except StopIteration:
            self._next = Searcher.FINISHED

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._last[trial_id] = result

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        result = result or self._last.pop(trial_id, None)
        value = None
        if result and not error and result.get("status", "ok") == "ok":
            value = result.get(self.metric)
        if trial_id == self._pending:
            self._seen[self.view.key(self._next)] = value
            self._pending = None
            self._advance(value)

    def run(self, config: Config | None) -> Script:
        """Yield ``config`` unless it is illegal (None) or already run; return its objective."""
        if config is None:
            return None
        key = self.view.key(config)
        if key in self._seen:
            return self._seen[key]
        value = yield config
        return value


class DeepSpeedAutotunerSearcher(ScriptedSearcher):
    def __init__(self, view: SpaceView, *, stage_knob: str = "zero_stage",
                 mbs_knob: str = "micro_batch_size", num_tuning_mbs: int = 3, **kw) -> None:
        super().__init__(view, **kw)
        names = view.space.names
        self.stage_knob = stage_knob if stage_knob in names else None
        self.mbs_knob = mbs_knob if mbs_knob in names else None
        self.num_tuning_mbs = num_tuning_mbs
        self.base = view.baseline()

    def _config(self, stage: Any, mbs: Any) -> Config | None:
        fixed = {k: self.base[k] for k in self.view.searched}
        if self.stage_knob:
            fixed[self.stage_knob] = stage
        if self.mbs_knob:
            fixed[self.mbs_knob] = mbs
        return self.view.resolve(fixed, self.rng)

    def _mbs_values(self, stage: Any) -> list[Any]:
        if not self.mbs_knob:
            return [None]
        return [m for m in self.view.domain(self.mbs_knob) if self._config(stage, m) is not None]

    def script(self) -> Script:
        stages = list(self.view.domain(self.stage_knob)) if self.stage_knob else [None]
        mbs = max_mbs = 0
        best = 0.0
        for i, stage in enumerate(stages):
            got = yield from self._tune_stage(stage, max_mbs, mbs, best)
            if got[1] is not None and (i == 0 or _gt(got[1], mbs)):
                max_mbs, mbs, best = got

    def _tune_stage(self, stage, prev_max, prev_best_mbs, prev_best) -> Script:
        values = self._mbs_values(stage)
        if not values:
            return 0, None, 0.0
        lo, hi = yield from self._min_max(stage, values, prev_max)
        if hi is None or (prev_max and _lt(hi, prev_max)):
            return 0, None, 0.0
        tuning = _spread(values, lo, hi, self.num_tuning_mbs)
        records: dict[Any, float] = {}
        for m in tuning:
            v = yield from self.run(self._config(stage, m))
            if v is not None:
                records[m] = v
        below = [m for m in values if (len(tuning) < 2 or _gt(m, tuning[-2])) and _lt(m, hi)]
        ref = records.get(hi, 0.0)
        for m in reversed(below):
            v = yield from self.run(self._config(stage, m))
            if v is None or not self._gain(v, ref, PLATEAU):
                break
            records[m], ref = v, v
        for m, v in self._stage_results(stage, values).items():
            records.setdefault(m, v)
        if not records:
            return hi, None, 0.0
        best_mbs = max(records, key=lambda m: records[m] if self.view.maximize else -records[m])
        return hi, best_mbs, records[best_mbs]

    def _stage_results(self, stage, values) -> dict[Any, float]:
        out = {}
        for m in values:
            c = self._config(stage, m)
            v = self._seen.get(self.view.key(c)) if c else None
            if v is not None:
                out[m] = v
        return out

    def _min_max(self, stage, values, prev_max) -> Script:
        """DeepSpeed's get_min_max_micro_batch_size on the measured micro-batch values."""
        if prev_max:
            start = [prev_max] if prev_max in values else []
        else:
            user = self.base.get(self.mbs_knob) if self.mbs_knob else None
            start = [m for m in dict.fromkeys([user, values[0]]) if m in values]
        lo = None
        for m in start:
            if (yield from self.run(self._config(stage, m))) is not None:
                lo = m
                break
            if prev_max:
                break
        if lo is None:
            return None, None
        v_max = yield from self.run(self._config(stage, values[-1]))
        if v_max is not None:
            return lo, values[-1]
        low, high = values.index(lo), len(values) - 2
        prev = self._seen.get(self.view.key(self._config(stage, lo)))
        while low < high:
            mid = (low + high) // 2
            if mid == low:
                mid = low + 1  # index search: the next value up (DeepSpeed's mid == low break on ints)
            v = yield from self.run(self._config(stage, values[mid]))
            if v is None:
                high = mid - 1
                continue
            low = mid
            if prev and not self._gain(v, prev, PLATEAU):
                break  # "performance plateaus"
            prev = v
        return lo, values[low]

    def _gain(self, v: float, ref: float, frac: float) -> bool:
        if not ref:
            return True
        return v > ref * (1 + frac) if self.view.maximize else v < ref * (1 - frac)


def _gt(a, b) -> bool:
    return a is not None and b is not None and a > b


def _lt(a, b) -> bool:
    return a is not None and b is not None and a < b


def _spread(values: list, lo, hi, n: int) -> list:
    """Up to ``n`` values evenly spread from ``lo`` to ``hi`` (both included)."""
    span = values[values.index(lo): values.index(hi) + 1]
    if len(span) <= n:
        return span
    idx = sorted({round(i * (len(span) - 1) / (n - 1)) for i in range(n)})
    return [span[i] for i in idx]


class GreedyClimberSearcher(ScriptedSearcher):
    def script(self) -> Script:
        inc = self.view.resolve(self.view.baseline(), self.rng) or self.view.legal_configs()[0]
        best = yield from self.run(inc)
        while True:
            edits = self._edits(inc)
            self.rng.shuffle(edits)
            for c in edits:
                v = yield from self.run(c)
                if self.view.better(v, best):
                    inc, best = c, v
                    break
            else:
                return

    def _edits(self, inc: Config) -> list[Config]:
        out: dict[str, Config] = {}
        for name in self.view.searched:
            others = {k: inc[k] for k in self.view.searched if k != name}
            values = [v for v in self.view.domain(name)
                      if v != inc[name] and self.view.resolve({**others, name: v}) is not None]
            if self.view.space.knob(name).kind == "ordinal":
                lower = [v for v in values if v < inc[name]]
                upper = [v for v in values if v > inc[name]]
                values = lower[-1:] + upper[:1]
            for v in values:
                c = self.view.resolve({**others, name: v}, self.rng)
                if c is not None and self.view.key(c) not in self._seen:
                    out.setdefault(self.view.key(c), c)
        return list(out.values())
