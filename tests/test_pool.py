"""The warm worker pool: trials reuse a live group, stay isolated, and a failed trial retires it.

Real Ray actors with a real gloo process group on this CPU: marked slow.
"""

from __future__ import annotations

import pytest
import ray
from conftest import copy_task, inject_into_dense

from infrarsi.backends.ray_train import RayTrainBackend, _pool
from infrarsi.contract import load_task
from infrarsi.trial import ErrorKind, TrialStatus

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_idle_pool(ray_local):
    """Each test starts with no warm group (an earlier test file's pool may still be up) and
    leaves none holding CPUs."""
    _pool.shutdown_process_pool()
    yield
    _pool.shutdown_process_pool()

# A patched model whose logits are scaled: the loss trace shows whether it ran.
SCALED = ("_orig_build = build_dense\n"
          "def build_dense(shape):\n    m = _orig_build(shape)\n"
          "    m.head.weight.data.mul_(3.0)\n    return m\n")


def _pool_workers() -> dict[str, list]:
    return ray.get(_pool.existing_process_pool().workers.remote())


def test_warm_trials_reuse_the_group_and_measure_the_same_loss(tmp_path, ray_local):
    backend = RayTrainBackend(load_task(copy_task(tmp_path)))
    config = {**backend.baseline_config(), "num_workers": 2}
    first = backend.execute(config)
    second = backend.execute(config)
    assert first.ok and second.ok, (first.error_message, second.error_message)
    assert first.extra["pool"]["warm"] is False and second.extra["pool"]["warm"] is True
    assert first.extra["pool"]["group"] == second.extra["pool"]["group"]
    assert first.loss_trace == second.loss_trace  # seeded per trial: the same computation
    assert len(second.peak_memory_bytes) == 2 and min(second.peak_memory_bytes) > 0
    assert second.startup_seconds < first.startup_seconds
    # A different world size needs new processes: a new group.
    other = backend.execute({**config, "num_workers": 1})
    assert other.ok and other.extra["pool"]["group"] != first.extra["pool"]["group"]
    backend.close()


def test_a_patched_trial_then_an_unpatched_one_runs_the_unpatched_code(tmp_path, ray_local):
    plain_task = copy_task(tmp_path / "plain")
    patched_task = copy_task(tmp_path / "patched")
    inject_into_dense(patched_task, SCALED)
    plain = RayTrainBackend(load_task(plain_task))
    patched = RayTrainBackend(load_task(patched_task))
    config = {**plain.baseline_config(), "num_workers": 1}
    before = plain.execute(config)
    with_patch = patched.execute(config)
    after = plain.execute(config)
    assert before.ok and with_patch.ok and after.ok
    groups = {r.extra["pool"]["group"] for r in (before, with_patch, after)}
    assert len(groups) == 1 and after.extra["pool"]["warm"]  # all three in one live process
    assert with_patch.loss_trace[0] != pytest.approx(before.loss_trace[0], rel=1e-3)
    assert after.loss_trace == before.loss_trace  # the patched module did not leak
    (workers,) = _pool_workers().values()
    assert ray.get(workers[0].leaked_workspace_modules.remote()) == []
    plain.close()


def test_a_trial_after_a_crash_or_an_oom_starts_in_a_fresh_group(tmp_path, ray_local):
    ok_task = copy_task(tmp_path / "ok")
    crash_task = copy_task(tmp_path / "crash")
    inject_into_dense(crash_task, "def build_dense(shape):\n    raise ZeroDivisionError('injected')\n")
    oom_task = copy_task(tmp_path / "oom", **{"hardware.memory_capacity_gib": 0.02})
    ok, crash, oom = (RayTrainBackend(load_task(p)) for p in (ok_task, crash_task, oom_task))
    config = {**ok.baseline_config(), "num_workers": 1}

    warm = ok.execute(config)
    pids = {g: ray.get([w.node.remote() for w in ws]) for g, ws in _pool_workers().items()}
    crashed = crash.execute(config)
    assert crashed.status is TrialStatus.ERROR and crashed.error_kind is ErrorKind.CRASH
    assert "ZeroDivisionError" in crashed.error_message
    assert crashed.extra == {} and _pool_workers() == {}  # the group was retired
    after_crash = ok.execute(config)
    assert after_crash.ok and after_crash.extra["pool"]["warm"] is False
    assert after_crash.extra["pool"]["group"] not in pids and warm.extra["pool"]["group"] in pids

    oomed = oom.execute(config)
    assert oomed.status is TrialStatus.OOM
    assert _pool_workers() == {}
    after_oom = ok.execute(config)
    assert after_oom.ok and after_oom.extra["pool"]["warm"] is False
    assert after_oom.extra["pool"]["group"] != after_crash.extra["pool"]["group"]
    ok.close()


def test_fresh_processes_runs_a_torchtrainer_job_and_frees_the_idle_pool(tmp_path, ray_local):
    spec = load_task(copy_task(tmp_path))
    warm = RayTrainBackend(spec)
    config = {**warm.baseline_config(), "num_workers": 2}
    assert warm.execute(config).ok  # an idle 2-CPU group now holds both CPUs of this Ray
    fresh = RayTrainBackend(spec, fresh_processes=True)
    rec = fresh.execute(config)
    assert rec.ok, rec.error_message
    assert "pool" not in rec.extra
    # The job started no actor the trial does not use: Ray Train's Ray Data manager and
    # preemption watcher started while the ranks ran and took the CPU from their measured steps.
    started = {a["ActorClassName"].rsplit(".", 1)[-1] for a in ray._private.state.actors().values()}
    assert "TrainController" in started, started  # the listing sees this job's actors
    assert not started & {"DatasetManager", "PreemptionWatcher"}, started
    warm.close()
