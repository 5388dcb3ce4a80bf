"""The warm worker pool: trials reuse a live group, stay isolated, and a failed trial retires it.

Real Ray actors with a real gloo process group on this CPU: marked slow.
"""

from __future__ import annotations

import time

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
# A hostile patch: it also rebinds a torch function for the whole process (no purge of the
# workspace's modules can undo that), scaling every later nn.Linear output in that interpreter.
PROCESS_WIDE = ("import torch.nn.functional as _F\n"
                "_orig_linear = _F.linear\n"
                "_F.linear = lambda x, w, b=None: _orig_linear(x, w, b) * 1.5\n")
# Module state that would carry from one trial to the next if the workspace were not re-imported:
# every build of this module's model scales its head by how many builds it has seen.
COUNTS_BUILDS = ("_BUILDS = []\n_orig_build = build_dense\n"
                 "def build_dense(shape):\n    _BUILDS.append(1)\n    m = _orig_build(shape)\n"
                 "    m.head.weight.data.mul_(float(len(_BUILDS)))\n    return m\n")


def group_of(record) -> str:
    return record.extra["pool"]["group"]


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
    """A patch is untrusted code: it runs in processes of its own, retired after its trial, so
    what it did to the interpreter (here it rebinds torch's linear for the whole process, and a
    second import would wrap it again) reaches no later trial, of other code or its own."""
    plain_task = copy_task(tmp_path / "plain")
    patched_task = copy_task(tmp_path / "patched")
    inject_into_dense(patched_task, SCALED + PROCESS_WIDE)
    plain = RayTrainBackend(load_task(plain_task))
    patched = RayTrainBackend(load_task(patched_task), untrusted_code=True)
    config = {**plain.baseline_config(), "num_workers": 1}
    before = plain.execute(config)
    with_patch = patched.execute(config)
    assert set(_pool_workers()) == {group_of(before)}  # the patch's group is gone
    after = plain.execute(config)
    again = patched.execute(config)
    assert before.ok and with_patch.ok and after.ok and again.ok
    assert with_patch.loss_trace[0] != pytest.approx(before.loss_trace[0], rel=1e-3)
    assert after.loss_trace == before.loss_trace  # neither the module nor its rebinding leaked
    assert again.loss_trace == with_patch.loss_trace  # a fresh interpreter again
    assert group_of(after) == group_of(before) and after.extra["pool"]["warm"]
    assert not with_patch.extra["pool"]["warm"] and not again.extra["pool"]["warm"]
    assert len({group_of(r) for r in (before, with_patch, again)}) == 3
    (workers,) = _pool_workers().values()
    assert ray.get(workers[0].leaked_workspace_modules.remote()) == []
    plain.close()


def test_a_warm_trial_imports_its_code_afresh(tmp_path, ray_local):
    """The same code twice in one live process: the second trial sees none of the first
    trial's module state (the workspace is imported anew), so it computes what a fresh trial
    would."""
    task = copy_task(tmp_path)
    inject_into_dense(task, COUNTS_BUILDS)
    backend = RayTrainBackend(load_task(task))
    config = {**backend.baseline_config(), "num_workers": 1}
    first, second = backend.execute(config), backend.execute(config)
    assert first.ok and second.ok, (first.error_message, second.error_message)
    assert second.extra["pool"]["warm"] and group_of(second) == group_of(first)
    assert second.loss_trace == first.loss_trace
    backend.close()


def test_a_trial_after_a_crash_or_an_oom_starts_in_a_fresh_group(tmp_path, ray_local):
    # One version of the code (one group key) that crashes while a marker file exists.
    marker = tmp_path / "crash-now"
    crashes = (f"import os as _os\n_orig_build = build_dense\ndef build_dense(shape):\n"
               f"    if _os.path.exists({str(marker)!r}):\n"
               f"        raise ZeroDivisionError('injected')\n    return _orig_build(shape)\n")
    ok_task = copy_task(tmp_path / "ok")
    oom_task = copy_task(tmp_path / "oom", **{"hardware.memory_capacity_gib": 0.02})
    for task in (ok_task, oom_task):
        inject_into_dense(task, crashes)
    ok, oom = (RayTrainBackend(load_task(p)) for p in (ok_task, oom_task))
    config = {**ok.baseline_config(), "num_workers": 1}

    warm = ok.execute(config)
    pids = {g: ray.get([w.node.remote() for w in ws]) for g, ws in _pool_workers().items()}
    marker.touch()
    crashed = ok.execute(config)
    marker.unlink()
    assert crashed.status is TrialStatus.ERROR and crashed.error_kind is ErrorKind.CRASH
    assert "ZeroDivisionError" in crashed.error_message
    assert crashed.extra == {} and _pool_workers() == {}  # the group was retired
    after_crash = ok.execute(config)
    assert after_crash.ok and after_crash.extra["pool"]["warm"] is False
    assert group_of(after_crash) not in pids and group_of(warm) in pids

    oomed = oom.execute(config)
    assert oomed.status is TrialStatus.OOM
    assert _pool_workers() == {}
    after_oom = ok.execute(config)
    assert after_oom.ok and after_oom.extra["pool"]["warm"] is False
    assert group_of(after_oom) != group_of(after_crash)
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
    # The job started no actor the trial does not use: Ray Train's Ray Data manager, preemption
    # watcher and placement-group cleaner ran beside the ranks and took CPU from their steps.
    started = {a["ActorClassName"].rsplit(".", 1)[-1] for a in ray._private.state.actors().values()}
    assert "TrainController" in started, started  # the listing sees this job's actors
    assert not started & {"DatasetManager", "PreemptionWatcher", "PlacementGroupCleaner"}, started
    warm.close()


def _free_cpus_become(n: float, timeout: float = 20.0) -> float:
    """The cluster's free CPUs once they reach ``n`` (Ray reports them with a short lag), else
    what they were at the timeout."""
    deadline = time.time() + timeout
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free == n or time.time() > deadline:
            return free
        time.sleep(0.2)


def test_an_idle_group_holds_no_cpus_so_a_patched_trial_leaves_the_code_s_group_warm(
        tmp_path, ray_local):
    """On 2 CPUs, a 2-rank group of the untouched code stays warm while a 2-rank patched trial
    runs: idle, it holds no CPUs (each trial leases them while it runs), so the patched trial's
    group fits beside it and the next untouched trial runs warm in the first group."""
    plain_task = copy_task(tmp_path / "plain")
    patched_task = copy_task(tmp_path / "patched")
    inject_into_dense(patched_task, SCALED)
    plain = RayTrainBackend(load_task(plain_task))
    patched = RayTrainBackend(load_task(patched_task), untrusted_code=True)
    config = {**plain.baseline_config(), "num_workers": 2}
    assert ray.cluster_resources()["CPU"] == 2
    first = plain.execute(config)
    assert first.ok, first.error_message
    assert _free_cpus_become(2) == 2  # the idle group holds none
    with_patch = patched.execute(config)
    third = plain.execute(config)
    assert with_patch.ok and third.ok, (with_patch.error_message, third.error_message)
    assert group_of(third) == group_of(first) and third.extra["pool"]["warm"]
    assert group_of(with_patch) != group_of(first)
    assert third.loss_trace == first.loss_trace
    assert set(_pool_workers()) == {group_of(first)}
    assert _free_cpus_become(2) == 2
    plain.close()


def test_a_trial_s_lease_is_released_after_a_crash_and_a_hang(tmp_path, ray_local):
    """A trial's CPUs are leased while it runs and given back however it ends: crashed (the
    group retired) or hung past its deadline (the pool ends it)."""
    marker = tmp_path / "hang-now"
    faulty = (f"import os as _os, time as _time\n_orig_build = build_dense\n"
              f"def build_dense(shape):\n"
              f"    if _os.path.exists({str(marker)!r}):\n        _time.sleep(3600)\n"
              f"    raise ZeroDivisionError('injected')\n")
    task = copy_task(tmp_path)
    inject_into_dense(task, faulty)
    backend = RayTrainBackend(load_task(task))
    config = {**backend.baseline_config(), "num_workers": 2}
    crashed = backend.execute(config)
    assert crashed.error_kind is ErrorKind.CRASH, crashed.error_message
    assert _free_cpus_become(2) == 2 and _pool_workers() == {}

    marker.touch()
    pool = _pool.existing_process_pool()
    key = _pool.group_key(config, device="cpu", backend="gloo", collective_timeout_s=300,
                          placement_strategy=backend.spec.trial.placement_strategy,
                          code="hangs")
    ref = pool.run.remote(key, backend.payload(config), time.time() + 60.0, "hung")
    assert _free_cpus_become(0) == 0  # leased while it starts and runs
    reply = ray.get(ref, timeout=180)
    # ended by the trial's deadline (a group that could not start says why before the message)
    assert not reply["ok"] and (reply["error_kind"], reply["message"]) == ("timeout", "hung")
    assert _free_cpus_become(2) == 2 and _pool_workers() == {}
    backend.close()


def test_idle_groups_are_bounded_oldest_retired_first(tmp_path, ray_local):
    """Past ``MAX_IDLE_GROUPS`` idle groups (each keeps its processes in memory), the one idle
    longest is retired when another goes idle."""
    backends = []
    for i in range(_pool.MAX_IDLE_GROUPS + 1):
        task = copy_task(tmp_path / f"v{i}")
        inject_into_dense(task, f"_VERSION = {i}\n")  # one group per code version
        backends.append(RayTrainBackend(load_task(task)))
    config = {**backends[0].baseline_config(), "num_workers": 1}
    records = [b.execute(config) for b in backends]
    assert all(r.ok for r in records), [r.error_message for r in records]
    live = set(_pool_workers())
    assert len(live) == _pool.MAX_IDLE_GROUPS
    assert group_of(records[0]) not in live and group_of(records[-1]) in live
    assert _free_cpus_become(2) == 2
    backends[0].close()
