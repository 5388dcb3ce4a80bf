from __future__ import annotations

import pickle

import torch
from ray.train import WorkerGroupError

from infrarsi.backends.ray_train._classify import classify
from infrarsi.trial import ErrorKind, TrialStatus


def _group(exc: Exception) -> WorkerGroupError:
    return WorkerGroupError("rank 1 failed", {1: exc})


def test_oom_inside_a_worker_group_error_is_an_oom():
    status, kind, msg = classify(_group(torch.OutOfMemoryError("emulated: capacity 1.0 GiB")))
    assert (status, kind) == (TrialStatus.OOM, None)
    assert "capacity" in msg


def test_communication_and_crash_are_told_apart():
    comm = classify(_group(RuntimeError("[Gloo] Connection closed by peer [127.0.0.1]:1234")))
    assert comm[:2] == (TrialStatus.ERROR, ErrorKind.COMMUNICATION)
    crash = classify(_group(ZeroDivisionError("division by zero")))
    assert crash[:2] == (TrialStatus.ERROR, ErrorKind.CRASH)
    assert "ZeroDivisionError" in crash[2]


def test_worker_group_error_pickles_across_the_ray_boundary():
    e = pickle.loads(pickle.dumps(_group(ValueError("x"))))
    assert classify(e)[1] is ErrorKind.CRASH
