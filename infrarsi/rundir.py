"""The run folder: its file names, its lock, its JSON files and where it lives by default.

A run folder is what ``infrarsi init`` creates and every later stage reads and writes::

    RUN/contract.json         the locked contract (init)
    RUN/doctor.json           doctor's record of the baseline (doctor)
    RUN/run.json              the bank run id of the search (run)
    RUN/patches.json          the proposer's patches and their verification (run)
    RUN/searcher_state.json   the searcher's saved state, for --resume (run)
    RUN/run_outcome.json      verdicts and the promotion (run, at its end)
    RUN/run.lock              the pid of the live run driver (run)
    RUN/bank.sqlite           a local bank, when the configured one was unreachable
    RUN/report/               report.md, report.html, plots (report)
    RUNS/LATEST               the path of the last initialized run, beside the run folders

This module is the low end of the package (it imports only :mod:`infrarsi.errors`): every stage
names these files through it, so no two modules can disagree on a name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from infrarsi.errors import ContractError, InfraRSIError

__all__ = [
    "CONTRACT_FILE", "DOCTOR_FILE", "LATEST_POINTER", "LOCAL_BANK_FILE", "LOCK_FILE",
    "OUTCOME_FILE", "PATCHES_FILE", "REPORT_DIR", "RUN_FILE", "STATE_FILE", "TUNE_DIR",
    "RunLockedError", "acquire_lock", "default_runs_root", "local_bank_url", "lock_holder",
    "point_latest", "read_json", "release_lock", "resolve_run_dir", "write_json",
]

CONTRACT_FILE = "contract.json"
DOCTOR_FILE = "doctor.json"
RUN_FILE = "run.json"
PATCHES_FILE = "patches.json"
STATE_FILE = "searcher_state.json"
OUTCOME_FILE = "run_outcome.json"
LOCK_FILE = "run.lock"
LOCAL_BANK_FILE = "bank.sqlite"
REPORT_DIR = "report"
TUNE_DIR = "tune"
LATEST_POINTER = "LATEST"


class RunLockedError(InfraRSIError):
    """Another live driver is running this task's run directory."""


def default_runs_root() -> Path:
    """Where run folders and the ``LATEST`` pointer live when none is given: ``./runs``
    (a task spec's default ``run_dir`` is ``runs/{name}``, relative to the current folder)."""
    return Path.cwd() / "runs"


# ---- which run folder --------------------------------------------------------------------
def point_latest(run_dir: Path) -> Path:
    """Record ``run_dir`` as the last initialized run (``LATEST`` beside it, and in ``./runs``
    when it lives elsewhere, so that a later stage run from here without ``--run-dir`` follows
    the ``--run-dir`` that init was given); returns the pointer beside it."""
    target = str(Path(run_dir).resolve()) + "\n"
    pointer = Path(run_dir).resolve().parent / LATEST_POINTER
    pointer.write_text(target)
    here = default_runs_root() / LATEST_POINTER
    if here.resolve() != pointer:
        here.parent.mkdir(parents=True, exist_ok=True)
        here.write_text(target)
    return pointer


def resolve_run_dir(run_dir: str | Path | None, runs_root: Path | None = None) -> Path:
    """The run directory a later stage works in: the one given, else the last one initialized."""
    if run_dir:
        path = Path(run_dir)
    else:
        pointer = (runs_root or default_runs_root()) / LATEST_POINTER
        if not pointer.is_file():
            raise ContractError(
                "no run directory given and no run initialized here; run `infrarsi init TASK.yaml` "
                "or pass --run-dir"
            )
        path = Path(pointer.read_text().strip())
    if not (path / CONTRACT_FILE).is_file():
        raise ContractError(f"{path} holds no {CONTRACT_FILE}; run `infrarsi init TASK.yaml` first")
    return path


def local_bank_url(run_dir: Path) -> str:
    """The run's own SQLite bank, used when the configured bank cannot be reached."""
    return f"sqlite:///{(Path(run_dir) / LOCAL_BANK_FILE).resolve()}"


# ---- JSON files --------------------------------------------------------------------------
def read_json(path: Path) -> dict[str, Any] | None:
    """A run file's JSON, or None when it is absent or unreadable (a half-written or foreign
    file is treated as missing: readers of optional evidence must not fail on it)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, OSError):
        return None


def write_json(path: Path, data: Any, *, sort_keys: bool = False) -> Path:
    """Write ``data`` as indented JSON atomically (temp file, ``os.replace``): a reader never
    sees half a file. Values JSON cannot hold are written as their ``str``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=sort_keys, default=str))
    os.replace(tmp, path)
    return path


# ---- the run lock ------------------------------------------------------------------------
def lock_holder(run_dir: Path) -> int | None:
    """The pid of the live process holding ``run_dir``'s lock, else None (no lock, a dead pid,
    or an unreadable file)."""
    lock = Path(run_dir) / LOCK_FILE
    try:
        pid = int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid and _alive(pid) else None


def acquire_lock(run_dir: Path) -> None:
    """Take ``run_dir``'s lock for this process; refuse while another live process holds it.

    Two runs of the same task at once would share a searcher state and a bank run, and their
    trials would compete for the same CPUs."""
    pid = lock_holder(run_dir)
    if pid is not None and pid != os.getpid():
        raise RunLockedError(
            f"{run_dir} is being run by process {pid}; two runs of the same task at "
            "once are refused. Wait for it, or stop it and use `infrarsi run --resume`."
        )
    (Path(run_dir) / LOCK_FILE).write_text(str(os.getpid()))


def release_lock(run_dir: Path) -> None:
    """Drop ``run_dir``'s lock if this process holds it."""
    lock = Path(run_dir) / LOCK_FILE
    if lock.is_file() and lock.read_text().strip() == str(os.getpid()):
        lock.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
