"""A background heartbeat for one open trial, so a dead driver's trial can be closed later."""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


class TrialHeartbeat:
    """``with TrialHeartbeat(bank, run_id, trial_id, config, every_s=10): ...``

    Opens the trial row on enter and touches it every ``every_s`` seconds until exit. The
    caller still records the finished trial with ``record_trial``. On the next start, a driver
    calls ``bank.close_stale_trials(run_id, older_than_s=3 * every_s)``.
    """

    def __init__(self, bank: Any, run_id: str, trial_id: str, config: dict[str, Any],
                 every_s: float = 10.0, origin: str = "search", backend: str = "") -> None:
        self.bank, self.run_id, self.trial_id = bank, run_id, trial_id
        self.config, self.every_s, self.origin, self.backend = config, every_s, origin, backend
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> TrialHeartbeat:
        self.bank.open_trial(self.run_id, self.trial_id, self.config, self.origin,
                             backend=self.backend)
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self.trial_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.bank.heartbeat(self.run_id, self.trial_id)
            except Exception as e:  # noqa: BLE001 - a missed beat must not kill the trial
                log.warning("bank heartbeat for trial %s failed: %s", self.trial_id, e)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every_s + 5)
