"""The live state of a running trial, written by the harness and read by the run's view.

A trial's rank 0 writes one small JSON file (atomically, at each phase change and each step)::

    {"phase": "building" | "warm-up" | "measuring" | "loss reference" | "metering memory",
     "step": k, "of": n, "t": time.time()}

Where: the path in the trial payload's ``progress_path``, which the backend takes from
``$INFRARSI_PROGRESS_FILE`` in the process that builds the payload (the Tune trial process,
or the driver during verification). The run stage sets it to ``RUN/live/<trial_id>.json``.
On a cluster whose nodes do not share the run folder the write fails and is ignored: the view
then shows the trial as running, without the step.

This module imports nothing of the package: the harness runs it in every worker.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PROGRESS_ENV = "INFRARSI_PROGRESS_FILE"
LIVE_DIR = "live"


def live_path(run_dir: str | os.PathLike, trial_id: str) -> Path:
    return Path(run_dir) / LIVE_DIR / f"{trial_id}.json"


def write_state(path: str | os.PathLike | None, phase: str, step: int = 0, of: int = 0) -> None:
    """Write the trial's state to ``path`` (no-op without one; never raises)."""
    if not path:
        return
    try:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"phase": phase, "step": step, "of": of, "t": time.time()}))
        os.replace(tmp, p)
    except OSError:
        pass  # a view that cannot be updated must never fail a trial


def read_state(path: str | os.PathLike) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


class LiveState:
    """What the harness loop updates: ``set`` only stores a tuple; a daemon thread writes it
    to ``path`` every ``every_s`` when it changed (no file I/O on the training loop). With no
    path it does nothing at all."""

    def __init__(self, path: str | os.PathLike | None, every_s: float = 0.5) -> None:
        import threading

        self.path = path
        self._state: tuple[str, int, int] | None = None
        self._stop = threading.Event()
        self._thread = None
        if path:
            self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True,
                                            name="infrarsi-live")
            self._thread.start()

    def set(self, phase: str, step: int = 0, of: int = 0) -> None:
        if self.path:
            self._state = (phase, step, of)

    def _run(self, every_s: float) -> None:
        written = None
        while True:
            stop = self._stop.wait(every_s)
            state = self._state
            if state is not None and state != written:
                write_state(self.path, *state)
                written = state
            if stop:
                return

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2.0)
            self._thread = None
