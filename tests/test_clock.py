"""The step clock is checked against an outside timer process (issue 34): a trial whose
in-process clock was tampered with reports the outside clock's true step times and fails."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from _patch_specs import WORKSPACE, tiny_spec

from infrarsi.harness import clock as C
from infrarsi.harness import train_worker
from infrarsi.patches import Scope, load_catalog, materialize
from infrarsi.workloads import build_torch_space


def test_an_honest_clock_agrees_with_the_outside_timer():
    clock = C.StepClock(torch.device("cpu"))
    for _ in range(4):
        clock.mark()
        time.sleep(0.03)
    clock.close()
    assert clock.check() is None
    assert all(0.025 < d < 0.2 for d in clock.durations())


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
    # the check itself is what catches it: the in-process durations say half
    assert all(d < 0.04 for d in clock._intervals(clock.marks))


def test_a_trial_whose_patched_model_halves_the_clock_is_rejected_with_true_times(tmp_path,
                                                                                 monkeypatch):
    """``train_worker`` (what a Ray Train worker runs) on a workspace whose patched model halves
    the harness clock's private perf_counter: the trial raises ClockTamperError naming the
    outside timer's step times."""
    entry = next(e for e in load_catalog("gaming") if e.patch.id == "clock_private_reference")
    spec = tiny_spec()
    # enough timed steps that halving them is well past the tolerance of a loaded machine
    spec = dataclasses.replace(spec, timing=dataclasses.replace(spec.timing, measured_steps=20))
    ws = materialize(WORKSPACE, [entry.patch], Scope.from_spec(spec), cache=tmp_path)
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
