"""Where InfraRSI keeps mutable state and finds the measured data tables.

One home folder holds everything InfraRSI writes by default, so a run does not depend on the
folder it was started from:

* ``$INFRARSI_HOME`` when set, else the per-user data directory: ``$XDG_DATA_HOME/infrarsi``
  (``~/.local/share/infrarsi`` when ``XDG_DATA_HOME`` is unset; ``%LOCALAPPDATA%\\infrarsi`` on
  Windows).
* ``<home>/bank.sqlite``: the default experience bank, used when neither ``--bank-url``/``--url``,
  the task's ``bank.url`` nor ``$INFRARSI_BANK_URL`` names one.
* ``<home>/runs/<task name>``: the default run folder of a task whose spec sets no ``run_dir``.
  A folder given by ``--run-dir`` or by the spec's ``run_dir`` always wins.
* ``<home>/runs/LATEST``: the run folder ``infrarsi init`` created last (wherever it is), read by
  the later stages when no ``--run-dir`` is given, from any current folder.

The measured data tables (benchmark CSVs, read in place, never copied) are not shipped: they are
found through ``$INFRARSI_DATA_DIR`` or an explicit path (``--csv``), never by a folder layout.

Nothing here creates folders on import; :func:`ensure_home` does, when something is written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from infrarsi.errors import ConfigError

__all__ = ["ENV_HOME", "ENV_DATA_DIR", "home", "ensure_home", "default_bank_path",
           "runs_root", "latest_pointer", "data_dir"]

ENV_HOME = "INFRARSI_HOME"
ENV_DATA_DIR = "INFRARSI_DATA_DIR"


def home() -> Path:
    """The home folder (absolute; not created): ``$INFRARSI_HOME``, else the user data dir."""
    env = os.environ.get(ENV_HOME, "").strip()
    if env:
        return Path(env).expanduser().resolve()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "infrarsi"
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    # XDG: a relative XDG_DATA_HOME is invalid and must be ignored
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "infrarsi"


def ensure_home() -> Path:
    """The home folder, created if missing."""
    path = home()
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_bank_path() -> Path:
    """The default SQLite bank file: ``<home>/bank.sqlite``."""
    return home() / "bank.sqlite"


def runs_root() -> Path:
    """The folder holding default run folders and the LATEST pointer: ``<home>/runs``."""
    return home() / "runs"


def latest_pointer() -> Path:
    """The file naming the run folder ``infrarsi init`` created last: ``<home>/runs/LATEST``."""
    return runs_root() / "LATEST"


def data_dir(what: str = "the measured data tables") -> Path:
    """``$INFRARSI_DATA_DIR`` as a folder; a ConfigError naming the variable when unset.

    ``what`` names the file(s) needed, for the message.
    """
    env = os.environ.get(ENV_DATA_DIR, "").strip()
    if not env:
        raise ConfigError(
            f"{what}: no data folder given; set {ENV_DATA_DIR} to the folder holding the "
            "measured tables (or pass the CSV path explicitly, e.g. --csv)")
    return Path(env).expanduser()
