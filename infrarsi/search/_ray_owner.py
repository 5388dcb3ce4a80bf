"""Which Ray processes a run driver started, and reaping them after the driver was killed.

A driver that starts its own local Ray (no ``RAY_ADDRESS``) owns a GCS, a raylet, their agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and workers. A clean exit stops them; a
SIGKILL leaves some running, orphaned. Before ``ray.init`` the driver puts a tag unique to it
in its environment (:data:`OWNER_ENV`): every process Ray then starts inherits the environment,
workers included (whose command lines Ray rewrites to ``ray::IDLE``, so a command line cannot
tell whose they are). The tag and the driver's pid go to ``RUN/ray_session.json``.

The next driver of the same run folder (see :func:`reap_previous`) stops the processes that
carry the recorded tag, once the recorded driver is dead: never a process it did not start,
whoever else runs Ray on the machine.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from infrarsi.rundir import RAY_SESSION_FILE, read_json, write_json

OWNER_ENV = "INFRARSI_RAY_OWNER"


def claim(run_dir: Path) -> str:
    """Tag the Ray processes this driver is about to start; record the tag in the run folder.

    Call right before ``ray.init`` starts a local Ray. Returns the tag."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.environ[OWNER_ENV] = tag
    write_json(Path(run_dir) / RAY_SESSION_FILE, {"driver_pid": os.getpid(), "tag": tag})
    return tag


def owned_pids(tag: str) -> list[int]:
    """Pids of live processes (other than this one) whose environment carries ``tag``."""
    import psutil

    want = f"{OWNER_ENV}={tag}".encode()
    out = []
    for proc in psutil.process_iter(["pid"]):
        pid = proc.info["pid"]
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if want in env.split(b"\0"):
            out.append(pid)
    return out


def reap_previous(run_dir: Path, grace_s: float = 5.0) -> list[str]:
    """Stop what the last driver of ``run_dir`` left running, if that driver is dead.

    Returns the lines to print (none when there was nothing to do)."""
    import psutil

    path = Path(run_dir) / RAY_SESSION_FILE
    rec = read_json(path)
    if not rec or not rec.get("tag"):
        return []
    driver = int(rec.get("driver_pid") or 0)
    if driver == os.getpid() or (driver and psutil.pid_exists(driver) and not _zombie(driver)):
        return []  # that driver is alive (the run lock refuses a second one anyway)
    pids = owned_pids(rec["tag"])
    if pids:
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline and any(psutil.pid_exists(p) and not _zombie(p)
                                             for p in pids):
            time.sleep(0.2)
        for pid in pids:
            if psutil.pid_exists(pid) and not _zombie(pid):
                _signal(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    if not pids:
        return []
    return [f"cleanup: stopped {len(pids)} Ray process(es) the killed driver {driver} had "
            f"started (pids {', '.join(map(str, sorted(pids)))})"]


def _zombie(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
