"""The step clock is checked against an outside timer process (issue 34): a trial whose
in-process clock was tampered with reports the outside clock's true step times and fails."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import statistics
import sys
import time

import pytest
import torch
from _patch_specs import WORKSPACE, tiny_spec
from conftest import copy_task

from infrarsi.contract import load_task
from infrarsi.harness import clock as C
from infrarsi.harness import train_worker
from infrarsi.patches import Scope, load_catalog, materialize
from infrarsi.trial import TrialStatus
from infrarsi.workloads import build_torch_space

CLOCK_PATCH = next(e.patch for e in load_catalog("gaming") if e.patch.id == "clock_private_reference")


def test_an_honest_clock_agrees_with_the_outside_timer():
    clock = C.StepClock(torch.device("cpu"))
    for _ in range(4):
        clock.mark()
        time.sleep(0.03)
    clock.close()
    assert clock.check() is None
    assert all(0.025 < d < 0.2 for d in clock.durations())


def test_a_process_keeps_its_timer_and_each_clock_reads_only_its_own_marks():
    """The next clock reuses the timer process (no start-up before a warm trial's first step);
    a clock whose timer received marks it did not make (a patch writing to the timer's pipe,
    or ending its session) is tampering, and that timer is not kept."""
    first = C.StepClock(torch.device("cpu"))
    pid = first._timer.proc.pid
    for _ in range(3):
        first.mark()
    first.close()
    assert first.check() is None and len(first.outside_marks) == 3

    second = C.StepClock(torch.device("cpu"))
    assert second._timer.proc.pid == pid
    second.mark()
    second._timer.mark()  # a mark the clock did not make
    second._timer._send(b"e0123\n")  # a session the clock did not end
    second._timer.mark()
    second.mark()
    second.close()
    problem = second.check()
    assert problem and "clock tampering" in problem and "session end(s)" in problem

    third = C.StepClock(torch.device("cpu"))
    assert third._timer.proc.pid != pid  # the tampered-with timer was not kept
    third.mark()
    third.mark()
    third.close()
    assert third.check() is None and len(third.outside_marks) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel message stamps: Linux")
def test_a_timer_the_scheduler_leaves_waiting_still_times_every_mark():
    """On a busy machine the timer process can wait over a second for a CPU and then read
    several marks at once (a CI run saw true step times [1.68, 9e-06, 1e-06] s and called an
    honest trial tampered). The kernel stamps each mark when it is sent, so a stopped timer
    still gives the true step times."""
    clock = C.StepClock(torch.device("cpu"))
    clock.mark()
    os.kill(clock._timer.proc.pid, signal.SIGSTOP)
    try:
        for _ in range(3):
            time.sleep(0.05)
            clock.mark()
        time.sleep(0.3)
    finally:
        os.kill(clock._timer.proc.pid, signal.SIGCONT)
    clock.close()
    assert clock.check() is None
    assert clock.durations() == pytest.approx(clock._intervals(clock.marks), abs=0.003)


def test_a_half_speed_clock_is_tampering_and_the_outside_times_are_reported(monkeypatch):
    real = C._perf
    monkeypatch.setattr(C, "_perf", lambda: real() * 0.5)
    clock = C.StepClock(torch.device("cpu"))
    for _ in range(4):
        clock.mark()
        time.sleep(0.05)
    clock.close()
    problem = clock.check()
    assert problem and "clock tampering" in problem
    assert all(d >= 0.045 for d in clock.durations())  # the outside clock: true step times
    # the message carries them across process boundaries (a Ray error is text)
    assert C.true_step_times(problem) == pytest.approx(clock.durations(), abs=1e-6)
    # the check itself is what catches it: the in-process durations say half
    assert all(d < 0.04 for d in clock._intervals(clock.marks))


def test_late_outside_marks_on_a_loaded_machine_are_not_tampering():
    """On a box with a load of 12 on 2 cores the timer process woke tens of ms late, once reading
    two marks 3 us apart (honest baselines read 26 vs 18 and 56 vs 73 ms/step): late marks are
    not tampering. A clock reading ahead of the outside one, or a rescaled one, is."""
    t0 = 26491.5  # CLOCK_MONOTONIC seconds, as both clocks read it
    clock = C.StepClock(torch.device("cpu"), outside=False)

    def judge(inside, lags):
        clock.marks = [t0 + t for t in inside]
        clock.outside_marks = [t0 + t + d for t, d in zip(inside, lags, strict=True)]
        return clock.check()

    assert judge([0.0, 0.0254, 0.0518, 0.0747], [0.020, 0.0, 0.0, 0.0]) is None
    assert judge([0.0, 0.0635, 0.1165, 0.1675], [0.0, 0.0, 0.101, 0.051]) is None
    assert judge([0.0254 * i for i in range(12)], [0, 0.03, 0, 0, 0, 0, 0, 0.025, 0, 0, 0, 0]) is None
    ahead = judge([0.0, 0.05, 0.10, 0.15], [0.0, -0.01, -0.02, -0.03])
    assert ahead and "clock tampering" in ahead and "ahead of the outside timer" in ahead
    clock.marks = [t * 0.5 for t in clock.outside_marks]  # the gaming patches' rescaled clock
    halved = clock.check()
    assert halved and "clock tampering" in halved and "behind the outside timer" in halved


def test_a_trial_whose_patched_model_halves_the_clock_is_rejected_with_true_times(tmp_path,
                                                                                 monkeypatch):
    """``train_worker`` (what a Ray Train worker runs) on a workspace whose patched model halves
    the harness clock's private perf_counter: the trial raises ClockTamperError naming the
    outside timer's step times."""
    spec = tiny_spec()
    # enough timed steps that halving them is well past the tolerance of a loaded machine
    spec = dataclasses.replace(spec, timing=dataclasses.replace(spec.timing, measured_steps=20))
    ws = materialize(WORKSPACE, [CLOCK_PATCH], Scope.from_spec(spec), cache=tmp_path)
    monkeypatch.setattr(C, "_perf", C._perf)  # restored after the test
    space = build_torch_space(spec)
    config = space.normalize({**space.defaults(), "num_workers": 1, "num_threads": 1})
    try:
        with pytest.raises(C.ClockTamperError, match="outside timer") as err:
            train_worker({"task": spec.to_dict(), "config": config, "workspace": str(ws),
                          "capacity_bytes": None})
        assert "true step times" in str(err.value)
    finally:
        if hasattr(C, "_real"):
            del C._real


@pytest.mark.slow
@pytest.mark.parametrize("fresh", [True, False], ids=["ray_train_job", "warm_pool"])
def test_a_real_trial_with_a_patched_clock_is_rejected_with_the_true_step_times(tmp_path,
                                                                               ray_local, fresh):
    """A real trial (RayTrainBackend: a TorchTrainer job, or the default warm pool; the task's
    two gloo ranks) on a workspace whose patched model halves the harness clock: the record is
    rejected as clock tampering and its step times are the outside timer's, not the halved ones.
    The static scan is not involved: the patched copy goes straight to the trial."""
    path = copy_task(tmp_path, **{"timing.warmup_steps": 1, "timing.measured_steps": 3})
    spec = load_task(path)
    ws = materialize(spec.workspace_path(), [CLOCK_PATCH], Scope.from_spec(spec),
                     cache=tmp_path / "cache")
    from infrarsi.backends.ray_train import RayTrainBackend

    backend = RayTrainBackend(spec, workspace=ws, fresh_processes=fresh)
    rec = backend.execute(backend.baseline_config())  # num_workers: 2, as the task says
    assert rec.status is TrialStatus.REJECTED, (rec.status, rec.error_message)
    assert "clock tampering" in rec.error_message
    m = re.search(r"reads ([\d.]+) ms per step, the outside timer ([\d.]+) ms", rec.error_message)
    assert m, rec.error_message
    inside, outside = float(m[1]), float(m[2])
    assert 0.4 < inside / outside < 0.6  # what the patched clock would have reported: half
    assert len(rec.step_times_s) == spec.timing.measured_steps
    # the record's step times are the outside timer's
    assert statistics.mean(rec.step_times_s) * 1e3 == pytest.approx(outside, abs=0.1)
    assert sum(rec.step_times_s) < rec.wall_seconds
