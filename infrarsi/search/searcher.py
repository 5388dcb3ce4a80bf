"""InfraRSISearcher: the search engine behind Ray Tune's ``Searcher`` protocol.

Use it like any Tune search algorithm (see ``scripts/example_tuner.py``): the trainable runs one
trial on a backend and reports ``{"objective": ..., "record": record.to_dict()}``. The searcher
reads the record (status, censored memory, cost) rather than only the metric, so an OOM trial
teaches the memory model instead of vanishing.

Ray calls ``on_trial_complete(trial_id, error=True)`` with no result when a trial crashed, so
the last result of each trial is kept from ``on_trial_result``; a trial with nothing reported
is recorded as a crash of its config, never dropped.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from infrarsi.search.engine import SearchEngine
from infrarsi.space import Config
from infrarsi.trial import ErrorKind, TrialRecord, TrialStatus

RECORD_KEY = "record"
# With ``early_stop=True`` a suggested config carries the engine's early-stop hint under this
# key; a trainable takes it out with :func:`split_stop_hint` before running the config.
STOP_HINT_KEY = "_infrarsi_stop_slower_than_s"
# Origin of a baseline re-measured during the search (InfraRSISearcher(sentinel=...)).
SENTINEL_ORIGIN = "sentinel:baseline"


def split_stop_hint(config: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """``(config without the hint, stop_slower_than_s or None)`` for ``Backend.execute``."""
    config = dict(config)
    return config, config.pop(STOP_HINT_KEY, None)


def record_from_result(result: dict[str, Any] | None) -> TrialRecord | None:
    """The TrialRecord a trainable put in its result (a dict or its JSON), if any.

    Tune flattens nested dicts in results before a searcher sees them (``record/config/...``),
    so a record reported as a dict arrives flattened and is rebuilt here.
    """
    if not result:
        return None
    if RECORD_KEY not in result:
        prefix = RECORD_KEY + "/"
        flat = {k[len(prefix):]: v for k, v in result.items() if k.startswith(prefix)}
        return TrialRecord.from_dict(_unflatten(flat)) if flat else None
    raw = result[RECORD_KEY]
    return TrialRecord.from_dict(json.loads(raw) if isinstance(raw, str) else raw)


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *head, last = key.split("/")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    return out


class InfraRSISearcher(Searcher):
    """A Tune ``Searcher`` over a :class:`SearchEngine`.

    ``on_suggest`` (optional) is called with ``(trial_id, config, origin)`` before a trial
    starts (the run stage opens the trial's heartbeat row in the bank there).
    ``on_record`` (optional) is called with ``(trial_id, record, origin, suggestion)`` for
    every finished trial: the run stage writes the bank row and the progress line there.
    ``state_path`` (optional) is rewritten atomically after every trial, so a killed driver
    can resume from it.
    ``early_stop=True`` adds the engine's early-stop hint to each suggested config (under
    ``STOP_HINT_KEY``; the trainable passes it on, see :func:`split_stop_hint`), so a trial
    clearly slower than the best so far stops after a few measured steps.
    ``retry`` (optional): ``(config, origin)`` pairs suggested before the engine's own, each
    once (a resumed run's trials the killed driver had in flight); their origin gains
    ``:resumed``.
    ``sentinel`` (optional, the baseline config) is re-measured as a *sentinel* trial (origin
    ``sentinel:baseline``) ``sentinel_first`` times before the search's first trial and then
    once every ``sentinel_every`` search trials, so speedups are read against a recent baseline
    on a machine whose load changes; sentinels are not search trials (the engine does not
    count them against the budget) but reach ``on_record`` like the others. ``search_trials``
    (optional) caps the search trials this driver suggests.
    """

    def __init__(self, engine: SearchEngine, *, metric: str = "objective", mode: str = "max",
                 state_path: str | os.PathLike | None = None, on_record=None,
                 on_suggest=None, early_stop: bool = False,
                 retry: list[tuple[dict[str, Any], str]] | None = None,
                 sentinel: Config | None = None, sentinel_every: int = 0,
                 sentinel_first: int = 0, search_trials: int | None = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self.early_stop = early_stop
        self.engine = engine
        self.state_path = Path(state_path) if state_path else None
        self.on_record = on_record
        self.on_suggest = on_suggest
        self._live: dict[str, dict[str, Any]] = {}  # trial_id -> suggestion summary
        self._last: dict[str, dict[str, Any]] = {}  # trial_id -> last result reported
        self.halted: str | None = None  # see halt()
        self.retry = list(retry or [])
        self.sentinel = dict(sentinel) if sentinel is not None else None
        self.sentinel_every = int(sentinel_every)
        self.sentinel_first = int(sentinel_first)
        self.sentinels = 0  # sentinel trials suggested by this driver
        self._searched = 0  # search trials suggested by this driver
        self.search_trials = search_trials  # at most this many (Tune's num_samples counts
        # sentinels too, so it cannot be the limit)

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        return True

    def halt(self, reason: str) -> None:
        """Suggest no more trials in this driver (e.g. the contract broke mid-run).

        Unlike the engine's ``stop_reason`` it is not part of the saved state: a resumed run
        whose cause is fixed goes on searching."""
        self.halted = reason

    def suggest(self, trial_id: str) -> Config | str | None:
        if self.halted:
            return Searcher.FINISHED
        if self.search_trials is not None and self._searched >= self.search_trials:
            return Searcher.FINISHED
        if self.retry:
            self._searched += 1
            return self._suggest_retry(trial_id)
        if self._sentinel_due():
            self.sentinels += 1
            self._live[trial_id] = {"config": self.sentinel, "origin": SENTINEL_ORIGIN,
                                    "predicted": None, "pairing": None, "started": time.time()}
            if self.on_suggest is not None:
                self.on_suggest(trial_id, self.sentinel, SENTINEL_ORIGIN)
            return dict(self.sentinel)
        sug = self.engine.suggest(trial_id)
        if sug is None:
            return Searcher.FINISHED
        self._searched += 1
        self._live[trial_id] = {"config": sug.config, "origin": sug.origin,
                                "predicted": sug.predicted, "pairing": sug.pairing,
                                "started": time.time()}
        if self.on_suggest is not None:
            self.on_suggest(trial_id, sug.config, sug.origin)
        if self.early_stop and sug.stop_slower_than_s:
            return {**sug.config, STOP_HINT_KEY: sug.stop_slower_than_s}
        return dict(sug.config)

    def _suggest_retry(self, trial_id: str) -> Config:
        """The next interrupted trial's config, as it was (the engine sees it as pending)."""
        config, origin = self.retry.pop(0)
        origin = origin if origin.endswith(":resumed") else f"{origin}:resumed"
        self.engine.pending[trial_id] = dict(config)
        self._live[trial_id] = {"config": dict(config), "origin": origin, "predicted": {},
                                "pairing": None, "started": time.time()}
        if self.on_suggest is not None:
            self.on_suggest(trial_id, dict(config), origin)
        return dict(config)

    def _sentinel_due(self) -> bool:
        if self.sentinel is None:
            return False
        if self.sentinels < self.sentinel_first:
            return True
        eng = self.engine
        cap = eng.budget if self.search_trials is None else self.search_trials
        room = (self._searched < cap and len(eng.observations) + len(eng.pending) < eng.budget
                and not eng.stop_reason)
        later = self.sentinels - self.sentinel_first
        return bool(self.sentinel_every and room
                    and self._searched >= (later + 1) * self.sentinel_every)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self._last[trial_id] = result

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        live = self._live.pop(trial_id, None)
        last = self._last.pop(trial_id, None)
        record = record_from_result(result) or record_from_result(last)
        if record is None and live is not None:
            record = self._crashed(trial_id, live["config"], last)
        if record is None:
            return  # not ours (e.g. a trial restored from another searcher)
        origin = live["origin"] if live else "restored"
        if origin != SENTINEL_ORIGIN:
            self.engine.observe(record, origin, trial_id=trial_id)
        if self.on_record is not None:
            self.on_record(trial_id, record, origin, live)
        if self.state_path is not None:
            self.save(str(self.state_path))

    def _crashed(self, trial_id: str, config: Config, last: dict | None) -> TrialRecord:
        return TrialRecord(
            trial_id=trial_id, config=config, status=TrialStatus.ERROR, backend="tune",
            workload=self.engine.workload, hardware=self.engine.hardware,
            error_kind=ErrorKind.CRASH,
            error_message="the trial process failed before reporting a result",
            device_seconds=float((last or {}).get("device_seconds", 0.0)),
        )

    # ---- pickling ------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its search algorithm into tuner.pkl when a run starts. The callbacks
        # close over the run session (bank engine, locks) and cannot be pickled; a restored
        # searcher gets fresh callbacks from its owner, and our own resume path is save/restore.
        state = dict(self.__dict__)
        state["on_record"] = state["on_suggest"] = None
        return state

    # ---- state survives a driver restart ----------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {"engine": self.engine.state_dict(), "live": self._live}

    def set_state(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        self._live = dict(state.get("live", {}))

    def save(self, checkpoint_path: str) -> None:
        path = Path(checkpoint_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.get_state(), default=str))
        os.replace(tmp, path)

    def restore(self, checkpoint_path: str) -> None:
        self.set_state(json.loads(Path(checkpoint_path).read_text()))
