"""Real trials: Ray Train TorchTrainer jobs with worker processes on this CPU (gloo)."""

from __future__ import annotations

import random
import time

import pytest
import torch
from conftest import copy_task, inject_into_dense

from infrarsi.backends.ray_train import RayTrainBackend
from infrarsi.contract import Contract, load_task
from infrarsi.errors import ConfigError, IllegalConfigError
from infrarsi.harness.train import METERED_STEPS
from infrarsi.init_stage import init_task
from infrarsi.trial import ErrorKind, TrialStatus

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_idle_pool(ray_local):
    """Each test's idle warm groups give their CPUs back (later tests place their own groups)."""
    yield
    from infrarsi.backends.ray_train._pool import shutdown_process_pool

    shutdown_process_pool()


def test_two_worker_trial_measures_step_time_memory_and_loss(tmp_path, ray_local):
    spec = load_task(copy_task(tmp_path))
    backend = RayTrainBackend(spec)
    rec = backend.execute({**backend.baseline_config(), "num_workers": 2})
    assert rec.ok, rec.error_message
    assert len(rec.step_times_s) == spec.timing.measured_steps
    assert len(rec.peak_memory_bytes) == 2 and min(rec.peak_memory_bytes) > 0
    assert len(rec.loss_trace) == (spec.timing.warmup_steps + METERED_STEPS
                                   + spec.timing.measured_steps)
    assert rec.tokens_per_step == spec.workload.tokens_per_step
    assert 0 < rec.startup_seconds < rec.wall_seconds
    assert rec.device_seconds == pytest.approx(2 * rec.wall_seconds)


def test_a_clearly_slow_two_worker_trial_stops_early_and_still_passes_the_loss_check(
        tmp_path, ray_local):
    contract, _, baseline = init_task(copy_task(tmp_path))
    backend = RayTrainBackend(contract.spec(), contract=contract)
    config = {**backend.baseline_config(), "num_workers": 2}
    rec = backend.execute(config, stop_slower_than_s=baseline.step_time_s / 100)
    assert rec.ok, rec.error_message  # the loss reference ran and matched: not rejected
    assert rec.extra["stopped_early"]["measured_steps"] == len(rec.step_times_s) == 2
    assert len(rec.step_times_s) < contract.spec().timing.measured_steps


def test_setting_above_capacity_is_an_oom_censored_at_capacity(tmp_path, ray_local):
    spec = load_task(copy_task(tmp_path, **{"hardware.memory_capacity_gib": 0.02}))
    backend = RayTrainBackend(spec)
    rec = backend.execute(backend.baseline_config())
    assert rec.status is TrialStatus.OOM
    assert rec.peak_memory_bytes is None  # a GPU never tells the true peak
    assert rec.memory_censor_bytes == int(0.02 * 2**30)
    assert rec.memory_observation == (float(rec.memory_censor_bytes), False)
    assert rec.device_seconds > 0


def test_hanging_trial_times_out_and_frees_its_workers(tmp_path, ray_local):
    path = copy_task(tmp_path, **{"trial.timeout_s": 15})
    inject_into_dense(path, (
        "import time as _t\n_orig_build = build_dense\n"
        "def build_dense(shape):\n    _t.sleep(3600)\n"
    ))
    backend = RayTrainBackend(load_task(path))
    import infrarsi.backends.ray_train.backend as mod

    old, mod.STARTUP_ALLOWANCE_S = mod.STARTUP_ALLOWANCE_S, 60.0
    try:
        rec = backend.execute({**backend.baseline_config(), "num_workers": 1})
    finally:
        mod.STARTUP_ALLOWANCE_S = old
    assert rec.status is TrialStatus.ERROR and rec.error_kind is ErrorKind.TIMEOUT
    assert "time limit" in rec.error_message
    deadline = time.time() + 60
    while ray_local.available_resources().get("CPU", 0) < 2 and time.time() < deadline:
        time.sleep(1)
    assert ray_local.available_resources().get("CPU", 0) == 2


def test_crashing_user_code_is_a_crash_and_the_driver_survives(tmp_path, ray_local):
    path = copy_task(tmp_path)
    inject_into_dense(path, "def build_dense(shape):\n    raise ZeroDivisionError('injected')\n")
    backend = RayTrainBackend(load_task(path))
    rec = backend.execute({**backend.baseline_config(), "num_workers": 1})
    assert rec.status is TrialStatus.ERROR and rec.error_kind is ErrorKind.CRASH
    assert "ZeroDivisionError" in rec.error_message


def test_init_locks_contract_and_a_drifting_loss_is_rejected(tmp_path, ray_local):
    path = copy_task(tmp_path)
    contract, contract_path, baseline = init_task(path)
    assert contract_path.is_file() and baseline.ok
    assert Contract.load(contract_path.parent).loss_reference["trace"] == list(baseline.loss_trace[:4])
    # A user change that alters what the model computes (logits scaled) must be rejected.
    inject_into_dense(path, (
        "_orig_build = build_dense\n"
        "def build_dense(shape):\n    m = _orig_build(shape)\n"
        "    m.head.weight.data.mul_(1.5)\n    return m\n"
    ))
    backend = RayTrainBackend(load_task(path), contract=Contract.load(contract_path.parent))
    rec = backend.execute(backend.baseline_config())
    assert rec.status is TrialStatus.REJECTED
    assert "loss drifted" in rec.error_message


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_cuda_task_on_a_cluster_without_a_gpu_is_refused_with_the_fix(tmp_path, ray_local):
    spec = load_task(copy_task(tmp_path, **{"hardware.device": "cuda"}))
    with pytest.raises(ConfigError, match="nor the Ray cluster has a GPU.*hardware.device: cpu"):
        RayTrainBackend(spec)


def test_illegal_config_never_reaches_ray(tmp_path):
    backend = RayTrainBackend(load_task(copy_task(tmp_path)))
    with pytest.raises(IllegalConfigError, match="unknown knob"):
        backend.execute({"micro_batch": 2})


def test_local_mode_has_one_rank_so_a_multi_worker_config_is_refused_with_the_fix(tmp_path):
    """Local mode runs the train function in this process: one rank. A 2-worker config (the
    reference task's baseline) is illegal there with the fix named, before anything runs, and
    the local space offers no multi-worker config to the search."""
    spec = load_task(copy_task(tmp_path))
    local = RayTrainBackend(spec, local_mode=True)
    with pytest.raises(IllegalConfigError, match="one rank.*without --local-mode"):
        local.execute({"num_workers": 2})
    assert {c["num_workers"] for c in local.space.sample(50, random.Random(0))} == {1}
    assert 2 in {c["num_workers"] for c in RayTrainBackend(spec).space.sample(50, random.Random(0))}
