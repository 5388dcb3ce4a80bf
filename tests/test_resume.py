"""Resume anywhere (issue 35), fast parts: verification replay and re-measurement ids, the
trial in flight at a kill retried and not counted, a finished run, ``--pairs`` too small, the
reaper of a killed driver's Ray processes, and the live progress view's rendered lines.

The end-to-end SIGKILL test of a real driver is in test_faults_resume.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from infrarsi.search._progress import Progress, describe_state, fmt_duration, knob_changes
from infrarsi.search._verify_resume import ResumableVerification, logical_id
from infrarsi.search.verify import verify_candidate
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

WL = WorkloadSignature(model_family="dense", num_params=1, num_layers=1, hidden_size=8,
                       num_heads=1, seq_len=8, global_batch_size=1, vocab_size=8, name="fake")
HW = HardwareFingerprint(device_name="cpu", memory_bytes=2**30, devices_per_node=1)
BASE, CAND = {"mbs": 1}, {"mbs": 2}


def rec(trial_id: str, config: dict, step: float = 0.1, **kw) -> TrialRecord:
    ok = kw.pop("status", TrialStatus.OK)
    return TrialRecord(trial_id=trial_id, config=config, status=ok, backend="fake", workload=WL,
                       hardware=HW, step_times_s=(step,) if ok is TrialStatus.OK else (),
                       tokens_per_step=8, wall_seconds=kw.pop("wall", 4.0), **kw)


class Timed:
    """A backend whose baseline takes 0.10 s a step and the candidate 0.08 s (1.25x)."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def execute(self, config, *, trial_id=None, **_):
        self.ran.append(trial_id)
        return rec(trial_id, config, 0.10 if config == BASE else 0.08)


# ---- verification resumes --------------------------------------------------------------
def test_a_resumed_verification_keeps_complete_pairs_and_remeasures_the_rest_under_new_ids():
    first = Timed()
    v1 = verify_candidate(ResumableVerification(first, [], attempt=1), BASE, CAND, pairs=3,
                          mde=0.05, tag="verify0")
    assert first.ran == ["verify0-A0", "verify0-B0", "verify0-A1", "verify0-B1", "verify0-A2",
                         "verify0-B2"]
    # the driver was killed while verify0-B2 ran: A2 finished, B2 was closed as interrupted
    done = [first_rec for first_rec in _records(first.ran[:5])]
    done.append(rec("verify0-B2", CAND, status=TrialStatus.ERROR,
                    error_kind=ErrorKind.INTERRUPTED))
    second = Timed()
    wrapped = ResumableVerification(second, done, attempt=2)
    v2 = verify_candidate(wrapped, BASE, CAND, pairs=3, mde=0.05, tag="verify0")
    assert second.ran == ["verify0-A2-r2", "verify0-B2-r2"]  # the half pair, whole, new ids
    assert wrapped.replayed == 4
    assert v2.baseline_trials == ["verify0-A0", "verify0-A1", "verify0-A2-r2"]
    assert v2.promoted == v1.promoted and v2.speedup == pytest.approx(v1.speedup)
    # a third driver replays all three pairs (the first attempt in which a pair completed)
    third = Timed()
    later = done + [rec("verify0-A2-r2", BASE, 0.10), rec("verify0-B2-r2", CAND, 0.08)]
    v3 = verify_candidate(ResumableVerification(third, later, attempt=3), BASE, CAND, pairs=3,
                          mde=0.05, tag="verify0")
    assert third.ran == [] and v3.baseline_trials == v2.baseline_trials


def test_each_verification_trial_reaches_the_bank_as_soon_as_it_finished():
    written: list[str] = []
    backend = Timed()

    class Spy(Timed):
        def execute(self, config, *, trial_id=None, **kw):
            assert len(written) == len(backend.ran)  # the previous trial is already written
            return backend.execute(config, trial_id=trial_id, **kw)

    wrapped = ResumableVerification(Spy(), [], attempt=2,
                                    record=lambda r, origin: written.append(r.trial_id))
    verify_candidate(wrapped, BASE, CAND, pairs=3, mde=0.05, tag="verify0")
    assert written == backend.ran == [f"verify0-{s}{i}-r2" for i in range(3) for s in "AB"]


def _records(ids):
    return [rec(t, BASE if "-A" in t else CAND, 0.10 if "-A" in t else 0.08) for t in ids]


def test_logical_ids():
    assert logical_id("verify1-B12") == "verify1-B12" == logical_id("verify1-B12-r3")
    assert logical_id("a1b2c3d4_00001") is None


def test_pairs_below_what_can_promote_are_refused_with_the_smallest_useful_number(tmp_path):
    from infrarsi.errors import ConfigError
    from infrarsi.search.run_stage import MIN_PAIRS, run_search

    with pytest.raises(ConfigError, match=f"--pairs {MIN_PAIRS} or more"):
        run_search(tmp_path, budget=2, pairs=2)
    assert list(tmp_path.iterdir()) == []  # refused before anything was opened or written


def test_resume_of_a_finished_run_says_so_and_returns_its_outcome(tmp_path):
    from infrarsi.rundir import OUTCOME_FILE, RUN_FILE, write_json
    from infrarsi.search.run_stage import RunOutcome, run_search

    best = rec("t1", CAND, 0.08)
    outcome = RunOutcome("run-1", 5, best, stop_reason=None)
    write_json(tmp_path / RUN_FILE, {"run_id": "run-1", "attempt": 2})
    write_json(tmp_path / OUTCOME_FILE, outcome.to_dict())
    lines: list[str] = []
    again = run_search(tmp_path, budget=5, resume=True, progress=lines.append)
    assert again.to_dict() == outcome.to_dict()
    assert "is finished: nothing to resume" in lines[0]


# ---- the searcher retries the interrupted trial -----------------------------------------
def test_the_searcher_suggests_interrupted_configs_first_and_the_engine_sees_them_pending():
    from infrarsi.backends.simulator import SimulatorBackend, SimWorkload
    from infrarsi.search import InfraRSISearcher
    from infrarsi.search.engine import SearchEngine

    b = SimulatorBackend(SimWorkload("r", "llama-3.1-8b", "H100-80GB", 1, 4096, 256,
                                     restrict={"micro_batch_size": (1, 2),
                                               "context_parallel_degree": (1,),
                                               "compile": ("off",)}))
    engine = SearchEngine(b.space, b.workload, b.hardware, budget=4, seed=0, pool_size=200)
    cfg = b.space.normalize(b.baseline_config())
    opened = []
    s = InfraRSISearcher(engine, retry=[(cfg, "seed:baseline")],
                         on_suggest=lambda t, c, o: opened.append((t, o)))
    assert s.suggest("t1") == cfg
    assert opened == [("t1", "seed:baseline:resumed")] and engine.pending == {"t1": cfg}
    second = s.suggest("t2")
    assert second != cfg  # the engine does not propose the pending config again


# ---- the reaper -------------------------------------------------------------------------
def test_the_reaper_stops_the_killed_drivers_tagged_processes_and_nothing_else(tmp_path):
    from infrarsi.rundir import RAY_SESSION_FILE, write_json
    from infrarsi.search._ray_owner import OWNER_ENV, owned_pids, reap_previous

    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    tag = "4242-deadbeef"
    ours = subprocess.Popen(sleeper, env={**os.environ, OWNER_ENV: tag})
    other = subprocess.Popen(sleeper, env={**os.environ, OWNER_ENV: "someone-else"})
    plain = subprocess.Popen(sleeper)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        write_json(tmp_path / RAY_SESSION_FILE, {"driver_pid": dead.pid, "tag": tag})
        assert owned_pids(tag) == [ours.pid]
        lines = reap_previous(tmp_path, grace_s=5.0)
        assert ours.wait(timeout=10) is not None
        assert f"pids {ours.pid}" in lines[0]
        assert other.poll() is None and plain.poll() is None
        assert not (tmp_path / RAY_SESSION_FILE).exists()
    finally:
        for p in (ours, other, plain):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_the_reaper_leaves_a_live_drivers_processes_alone(tmp_path):
    from infrarsi.rundir import RAY_SESSION_FILE, write_json
    from infrarsi.search._ray_owner import OWNER_ENV, reap_previous

    tag = "live-driver"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, OWNER_ENV: tag})
    try:
        write_json(tmp_path / RAY_SESSION_FILE, {"driver_pid": child.pid, "tag": tag})
        assert reap_previous(tmp_path) == [] and child.poll() is None
    finally:
        child.kill()
        child.wait()


# ---- the live view ------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_progress_rows_show_knob_changes_elapsed_and_an_eta():
    lines: list[str] = []
    clock = Clock()
    t = Progress(lines.append, baseline_step_s=0.1,
                 baseline_config={"mbs": 1, "precision": "fp32"}, clock=clock)
    t.header(4, 2, verify_trials=6)
    assert "#" in lines[1] and "source" in lines[1]  # the table header
    clock.t += 100
    t.row(1, rec("t1", {"mbs": 4, "precision": "fp32"}, 0.08, wall=50.0), "seed:expert", None)
    assert "mbs 1->4" in lines[3] and "precision" not in lines[3]
    # 3 search + 6 verification trials left at 50 s each
    assert "elapsed 1m40s" in lines[3] and "ETA 7m30s" in lines[3], lines[3]
    t.row(2, rec("t2", {"mbs": 1, "precision": "fp32"}, 0.1, wall=30.0), "seed:baseline", None)
    assert "vs baseline: baseline;" in lines[-1] and "ETA 5m20s" in lines[-1], lines[-1]


def test_a_running_trial_shows_its_state_and_time_so_far():
    lines: list[str] = []
    clock = Clock()
    t = Progress(lines.append, 0.1, baseline_config={"mbs": 1}, clock=clock)
    t.running(3, "model", {"mbs": 2}, {"phase": "measuring", "step": 3, "of": 5},
              started=clock.t - 65)
    assert lines == [f"{3:>3}  {'model':<22} running: measuring step 3 of 5 (1m05s); mbs 1->2"]
    assert describe_state(None).startswith("starting")
    assert describe_state({"phase": "warm-up", "step": 1, "of": 2}) == "warm-up 1/2"
    assert fmt_duration(3725) == "1h02m" and knob_changes({"a": 1}, None) == "a=1"


def test_verification_pairs_print_as_they_finish_with_the_running_interval():
    lines: list[str] = []
    t = Progress(lines.append, 0.1, baseline_config=BASE, clock=Clock())
    t.verify_start(1, 1, 3, CAND)
    assert "mbs 1->2" in lines[0]
    t.verify_pair(rec("A0", BASE, 0.100), rec("B0", CAND, 0.080), bar=1.05)
    assert "1.250x" in lines[1] and "no interval yet" in lines[1]
    t.verify_pair(rec("A1", BASE, 0.102), rec("B1", CAND, 0.081), bar=1.05, replayed=True)
    assert "95% CI [" in lines[2] and "kept from the earlier driver" in lines[2]
    t.verify_pair(rec("A2", BASE, 0.1), rec("B2", CAND, status=TrialStatus.OOM), bar=1.05)
    assert "B2 was oom" in lines[3]


def test_the_harness_live_state_is_written_off_the_loop(tmp_path):
    from infrarsi.live import LiveState, read_state

    path = tmp_path / "live" / "t1.json"
    live = LiveState(path, every_s=0.05)
    live.set("measuring", 2, 5)
    deadline = time.time() + 5
    while read_state(path) is None and time.time() < deadline:
        time.sleep(0.02)
    live.close()
    state = read_state(path)
    assert (state["phase"], state["step"], state["of"]) == ("measuring", 2, 5)
    LiveState(None).set("warm-up", 1, 2)  # no path: nothing, no thread
