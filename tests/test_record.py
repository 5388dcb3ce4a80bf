from __future__ import annotations

import pytest

from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

WL = WorkloadSignature("dense", 1_000_000, 2, 64, 4, 32, 8)
HW = HardwareFingerprint("cpu", 2**30, 2)


def test_record_round_trips_through_dict():
    r = TrialRecord("t1", {"mbs": 2}, TrialStatus.OK, "x", WL, HW, step_times_s=(0.2, 0.1, 0.3),
                    peak_memory_bytes=(10, 12), loss_trace=(5.0, 4.9), tokens_per_step=256)
    back = TrialRecord.from_dict(r.to_dict())
    assert back == r
    assert r.step_time_s == 0.2
    assert r.tokens_per_s == pytest.approx(1280.0)
    assert r.memory_observation == (12.0, True)


def test_oom_record_is_censored_and_cannot_carry_its_peak():
    r = TrialRecord("t2", {}, "oom", "x", WL, HW, memory_censor_bytes=2**30)
    assert r.memory_observation == (float(2**30), False)
    with pytest.raises(AssertionError):
        TrialRecord("t3", {}, "oom", "x", WL, HW, peak_memory_bytes=(2**31,))


def test_error_kind_goes_with_error_status_only():
    TrialRecord("t4", {}, "error", "x", WL, HW, error_kind="timeout")
    with pytest.raises(AssertionError):
        TrialRecord("t5", {}, "error", "x", WL, HW)
    assert TrialRecord("t6", {}, "error", "x", WL, HW, error_kind=ErrorKind.CRASH).summary().startswith(
        "trial t6: error (crash)")
