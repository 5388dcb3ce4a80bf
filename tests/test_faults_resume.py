"""A real ``infrarsi run`` driver SIGKILLed during search, during verification and during the
report, then resumed each time to a finished run (issue 35's "Done when"):

* no trial lost: the trial in flight at the kill is closed as interrupted with the device time
  it used and its config runs again; the search still gets its whole budget of measurements;
* no finished trial repeated: no search config measured twice, no verification pair that had
  finished measured again (a re-measurement has a new trial id);
* no Ray process of a killed driver left: every process carrying the killed driver's tag (see
  infrarsi.search._ray_owner) is gone once the next driver started, checked by pid.

cpu_dense with one rank and a few steps; trials run in the Tune trial process (local mode), so
the whole test is a few minutes on a shared 2-core box.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import copy_task

from infrarsi.bank import ExperienceBank
from infrarsi.rundir import OUTCOME_FILE, RAY_SESSION_FILE, RUN_FILE, read_json
from infrarsi.search._ray_owner import owned_pids
from infrarsi.space import config_key
from infrarsi.trial import ErrorKind

pytestmark = [pytest.mark.faults, pytest.mark.slow]

BUDGET = 4


class Driver:
    """``python -m infrarsi.cli ARGS`` with its output collected line by line."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "INFRARSI_LIVE_EVERY_S": "2"}
        self.proc = subprocess.Popen([sys.executable, "-m", "infrarsi.cli", *args], cwd=cwd,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float = 400.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(needle in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                time.sleep(0.5)  # the reader may still be draining
                if any(needle in line for line in self.lines):
                    return
                raise AssertionError(f"driver exited {self.proc.returncode} before {needle!r}:\n"
                                     f"{self.text[-5000:]}")
            time.sleep(0.2)
        self.kill()
        raise AssertionError(f"no {needle!r} after {timeout:.0f}s:\n{self.text[-5000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)

    def finish(self, timeout: float = 900.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return rc


def _alive(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def drivers():
    """Every driver the test starts, and every Ray session they recorded: whatever the
    outcome, the drivers are killed and their sessions' processes stopped (by pid)."""
    started: list[Driver] = []
    sessions: list[dict] = []
    yield started, sessions
    for d in started:
        d.kill()
    for rec in sessions:
        for pid in _alive(owned_pids(rec.get("tag"), rec.get("session_dir"))):
            os.kill(pid, signal.SIGKILL)


def _session(run_dir: Path, sessions: list[dict]) -> dict:
    """The Ray session the live driver recorded (tag and session folder), once it has."""
    deadline = time.time() + 60
    while time.time() < deadline:
        rec = read_json(run_dir / RAY_SESSION_FILE)
        if rec and rec.get("session_dir"):
            sessions.append(rec)
            return rec
        time.sleep(0.2)
    raise AssertionError("the driver recorded no Ray session")


def _owned(rec: dict) -> list[int]:
    return _alive(owned_pids(rec["tag"], rec["session_dir"]))


def test_a_driver_killed_in_search_verification_and_report_resumes_to_a_finished_run(
        tmp_path, drivers):
    from infrarsi.init_stage import init_task

    started, sessions = drivers

    path = copy_task(tmp_path, "cpu_dense.yaml", **{
        "timing.measured_steps": 3, "timing.warmup_steps": 1, "hardware.max_workers": 1,
        "search.baseline.num_workers": 1})
    _, cpath, _ = init_task(path, local_mode=True)
    run_dir = cpath.parent
    url = f"sqlite:///{tmp_path / 'bank.sqlite'}"
    args = ["run", "--run-dir", str(run_dir), "--budget", str(BUDGET), "--verify-top", "1",
            "--pairs", "3", "--bank-url", url, "--cold", "--no-patches", "--local-mode"]

    # 1. killed during the search: after the first trial finished, while the second runs
    d1 = Driver(args, tmp_path)
    started.append(d1)
    d1.wait_for("vs baseline:")
    d1.wait_for("running:")
    time.sleep(3.0)  # the trial in flight has used some device time (heartbeats every 2 s)
    s1 = _session(run_dir, sessions)
    d1.kill()
    time.sleep(2.0)
    left1 = _owned(s1)
    print(f"driver 1 left {len(left1)} Ray process(es): {left1}")

    # 2. resumed: reaps driver 1's processes, finishes the search; killed during verification
    #    after the first pair finished
    d2 = Driver([*args, "--resume"], tmp_path)
    started.append(d2)
    d2.wait_for("search: ")
    if left1:
        assert "Ray process(es) the killed driver" in d2.text, d2.text
    assert _alive(left1) == [] and _owned(s1) == [], f"driver 1's Ray processes: {_owned(s1)}"
    assert "1 interrupted one(s) to run again" in d2.text, d2.text
    d2.wait_for("  pair 1:")
    time.sleep(3.0)
    s2 = _session(run_dir, sessions)
    assert s2["tag"] != s1["tag"]
    d2.kill()
    time.sleep(2.0)
    left2 = _owned(s2)
    print(f"driver 2 left {len(left2)} Ray process(es): {left2}")
    assert left1 or left2, "no SIGKILLed driver left a Ray process: the reaping is untested"

    # 3. resumed again: keeps the finished pair, measures the rest, finishes
    d3 = Driver([*args, "--resume"], tmp_path)
    started.append(d3)
    rc = d3.finish()
    assert rc in (0, 1), d3.text[-5000:]
    assert _alive(left2) == [] and _owned(s2) == [], f"driver 2's Ray processes: {_owned(s2)}"
    assert "kept from the earlier driver" in d3.text, d3.text
    out = read_json(run_dir / OUTCOME_FILE)
    assert out and out["run_id"] == read_json(run_dir / RUN_FILE)["run_id"]
    assert out["trials"] == BUDGET

    bank = ExperienceBank.open(url, seed=False)
    try:
        records = bank.trials(out["run_id"])
        origins = bank.trial_origins(out["run_id"])
        assert bank.open_trials(out["run_id"]) == []
    finally:
        bank.close()
    search = [r for r in records if not origins[r.trial_id].startswith("verify")]
    measured = [r for r in search if r.error_kind is not ErrorKind.INTERRUPTED]
    interrupted = [r for r in records if r.error_kind is ErrorKind.INTERRUPTED]
    assert len(measured) == BUDGET  # the whole budget measured: the interruption cost none
    keys = [config_key(r.config) for r in measured]
    assert len(set(keys)) == len(keys), "a search config was measured twice"
    lost = [r for r in interrupted if not origins[r.trial_id].startswith("verify")]
    assert len(lost) == 1 and config_key(lost[0].config) in keys  # run again, kept its config
    # charged the device time up to its last heartbeat (every 2 s; it had run over 3 s)
    assert lost[0].device_seconds >= 2.0, lost[0].device_seconds
    verify = {r.trial_id for r in records if origins[r.trial_id].startswith("verify")
              and r.error_kind is not ErrorKind.INTERRUPTED}
    # no complete pair measured twice: per pair, one attempt has both trials finished
    complete: dict[str, list[str]] = {}
    for tid in verify:
        tag, _, rest = tid.partition("-")
        side_i, _, attempt = rest.partition("-")
        other = f"{tag}-{'B' if side_i[0] == 'A' else 'A'}{side_i[1:]}" + (f"-{attempt}" if attempt else "")
        if side_i[0] == "A" and other in verify:
            complete.setdefault(f"{tag}-{side_i[1:]}", []).append(attempt or "r1")
    assert complete and all(len(v) == 1 for v in complete.values()), complete
    verdict = out["verdicts"][0]
    assert "verify0-A0-r2" in verdict["baseline_trials"]  # driver 2's pair, kept
    assert len(verdict["baseline_trials"]) >= 3

    # 4. --resume on the finished run: says so, exit 0
    d4 = Driver([*args, "--resume"], tmp_path)
    started.append(d4)
    assert d4.finish(timeout=120) == 0 and "is finished: nothing to resume" in d4.text

    # 5. the report killed mid-way, then run again to the end
    rargs = ["report", str(run_dir), "--bank-url", url]
    d5 = Driver(rargs, tmp_path)
    started.append(d5)
    time.sleep(3.0)
    d5.kill()
    d6 = Driver(rargs, tmp_path)
    started.append(d6)
    assert d6.finish(timeout=300) == 0, d6.text[-3000:]
    assert (run_dir / "report" / "report.md").is_file()
    s3 = read_json(run_dir / RAY_SESSION_FILE)  # a later driver that started Ray, if any
    if s3 and s3.get("session_dir") and s3["tag"] != s2["tag"]:
        sessions.append(s3)
        deadline = time.time() + 30  # a clean exit stops its own Ray; give it a moment
        while _owned(s3) and time.time() < deadline:
            time.sleep(1)
        assert _owned(s3) == [], "the driver that finished left Ray processes"
