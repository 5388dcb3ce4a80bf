"""Which Ray processes a run driver started, and reaping them after the driver was killed.

A driver that starts its own local Ray (no ``RAY_ADDRESS``) owns a GCS, a raylet, their agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and workers. A clean exit stops them; a
SIGKILL leaves some running, orphaned. Which processes are its? Ray rewrites their titles
(``ray::IDLE``), and that rewrite also overwrites what ``/proc/PID/environ`` shows, so neither a
command line nor an inherited variable alone can tell. Two marks are recorded in
``RUN/ray_session.json``:

* the Ray *session directory* (``/tmp/ray/session_<time>_<driver pid>``, unique to this
  ``ray.init``): every process Ray starts for it writes its logs there and holds them open;
* a tag put in the driver's environment (:data:`OWNER_ENV`) before ``ray.init``, inherited by
  what Ray processes start without retitling (compilers, user subprocesses).

The next driver of the same run folder (see :func:`reap_previous`) stops the processes that
hold a file under the recorded session directory or carry the tag, once the recorded driver is
dead: never a process it did not start, whoever else runs Ray on the machine.
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

    Call right before ``ray.init`` starts a local Ray, then :func:`record_session` after it.
    Returns the tag."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.environ[OWNER_ENV] = tag
    write_json(Path(run_dir) / RAY_SESSION_FILE, {"driver_pid": os.getpid(), "tag": tag})
    return tag


def record_session(run_dir: Path) -> None:
    """Add the session directory of the Ray this driver just started to the record."""
    import ray

    path = Path(run_dir) / RAY_SESSION_FILE
    rec = read_json(path) or {"driver_pid": os.getpid()}
    try:
        node = ray._private.worker._global_node  # noqa: SLF001 - the session of this ray.init
        rec["session_dir"] = node.get_session_dir_path() if node is not None else None
    except AttributeError:
        return
    write_json(path, rec)


def owned_pids(tag: str | None, session_dir: str | None = None) -> list[int]:
    """Pids of live processes (other than this one) that hold a file under ``session_dir``
    or whose environment carries ``tag``."""
    import psutil

    want = f"{OWNER_ENV}={tag}".encode() if tag else None
    prefix = session_dir.rstrip("/") + "/" if session_dir else None
    out = []
    for proc in psutil.process_iter(["pid"]):
        pid = proc.info["pid"]
        if pid == os.getpid():
            continue
        if (prefix and _holds_file_under(pid, prefix)) or (want and _has_env(pid, want)):
            out.append(pid)
    return out


def _has_env(pid: int, want: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return want in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _holds_file_under(pid: int, prefix: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False


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
    pids = owned_pids(rec["tag"], rec.get("session_dir"))
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
