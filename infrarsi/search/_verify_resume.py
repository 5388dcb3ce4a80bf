"""Verification that survives a killed driver: finished pairs are kept, the rest re-measured.

``verify_candidate`` names its trials ``<tag>-A<i>`` (baseline) and ``<tag>-B<i>`` (candidate).
A bank row is immutable once finished, so a resumed driver cannot measure those names again.
This wrapper sits between ``verify_candidate`` and the backend:

* the *logical* id ``verify0-A3`` becomes the trial id ``verify0-A3`` on the run's first driver
  and ``verify0-A3-r<attempt>`` on a later one (a re-measurement is a new trial id, as the bank
  requires);
* a pair whose two trials both finished (in any earlier attempt) is *replayed* from the bank:
  the verdict's pairs are continued, not restarted. A half pair is measured again as a whole,
  because a pair is only paired when its two trials ran back to back;
* every trial it runs gets a heartbeat row first, so a kill mid-trial leaves an open row that
  the next start closes as interrupted with the device time it had used.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from infrarsi.trial import ErrorKind, TrialRecord

_ID = re.compile(r"^(?P<logical>verify\d+-[AB]\d+)(?:-r(?P<attempt>\d+))?$")


def logical_id(trial_id: str) -> str | None:
    """``verify0-A3`` for ``verify0-A3`` and ``verify0-A3-r2``; None for other trial ids."""
    m = _ID.match(trial_id)
    return m.group("logical") if m else None


def attempt_id(logical: str, attempt: int) -> str:
    return logical if attempt <= 1 else f"{logical}-r{attempt}"


class ResumableVerification:
    """A backend for ``verify_candidate``: replays finished pairs, runs the rest under new ids.

    ``done``: the run's finished verification trials (any attempt); interrupted ones are not
    measurements and are ignored. ``open_trial(trial_id, config, origin)`` opens the
    heartbeat row of a trial about to run.
    """

    def __init__(self, backend: Any, done: Iterable[TrialRecord], *, attempt: int,
                 open_trial: Callable[[str, dict, str], None] | None = None,
                 record: Callable[[TrialRecord, str], None] | None = None,
                 live_dir: Path | None = None) -> None:
        self.backend = backend
        self.record = record  # writes a trial to the bank as soon as it finished
        self.attempt = attempt
        self.open_trial = open_trial
        self.live_dir = live_dir  # run folder: each trial's live state goes under it
        self.replayed_ids: set[str] = set()
        self._running: tuple[str, int, str, dict, float] | None = None
        self._n = 0
        self.finished: dict[tuple[str, int], TrialRecord] = {}
        for rec in done:
            m = _ID.match(rec.trial_id)
            if m and rec.error_kind is not ErrorKind.INTERRUPTED:
                self.finished[(m.group("logical"), int(m.group("attempt") or 1))] = rec
        self.replayed = 0

    def _pair_attempt(self, a: str, b: str) -> int | None:
        """The first attempt in which both trials of the pair (a, b) finished, if any."""
        both = [n for (k, n) in self.finished if k == a and (b, n) in self.finished]
        return min(both) if both else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def execute(self, config: Mapping[str, Any], *, trial_id: str | None = None,
                **kwargs: Any) -> TrialRecord:
        key = logical_id(trial_id or "")
        if key is None:  # not a verification trial: nothing to replay
            return self.backend.execute(config, trial_id=trial_id, **kwargs)
        side = "A" if "-A" in key else "B"
        partner = key.replace(f"-{side}", "-B" if side == "A" else "-A", 1)
        self._n += 1
        n = self._pair_attempt(key, partner)
        if n is not None:
            self.replayed += 1
            rec = self.finished[(key, n)]
            self.replayed_ids.add(rec.trial_id)
            return rec
        real = attempt_id(key, self.attempt)
        origin = "verify:baseline" if side == "A" else "verify:candidate"
        if self.open_trial is not None:
            self.open_trial(real, dict(config), origin)
        if self.live_dir is None:
            out = self.backend.execute(config, trial_id=real, **kwargs)
        else:
            out = self._execute_live(config, real, origin, **kwargs)
        if self.record is not None:
            # at once, not after the pair: a kill during the candidate must not leave the
            # finished baseline trial open (closed as interrupted, charged until the kill)
            self.record(out, origin)
        return out

    def _execute_live(self, config: Mapping[str, Any], real: str, origin: str,
                      **kwargs: Any) -> TrialRecord:
        from infrarsi.live import PROGRESS_ENV, live_path, write_state

        path = str(live_path(self.live_dir, real))
        write_state(path, "starting")
        old = os.environ.get(PROGRESS_ENV)
        os.environ[PROGRESS_ENV] = path  # read when the backend builds the payload
        self._running = (real, self._n, origin, dict(config), time.time())
        try:
            return self.backend.execute(config, trial_id=real, **kwargs)
        finally:
            self._running = None
            Path(path).unlink(missing_ok=True)
            if old is None:
                os.environ.pop(PROGRESS_ENV, None)
            else:
                os.environ[PROGRESS_ENV] = old

    def running(self) -> list[tuple[str, int, str, dict, float]]:
        """The trial in flight, for the live view (``(trial_id, n, origin, config, t0)``)."""
        return [self._running] if self._running else []
