"""Faults under real Ray Train trials on a real multi-node cluster: a worker process killed, a
whole node lost, a deadlocked collective. Each test prints what it measured (detection time,
cost); nothing may be lost: one bank row per trial, and the search goes on.

These start real Train worker groups (tens of seconds each on a 2-core box): marked slow and
faults.
"""

from __future__ import annotations

import signal
import time

import pytest
from cluster_fixture import LocalRayCluster, SearchDriver, local_cluster
from conftest import inject_into_dense
from test_multinode import spread_task

pytestmark = [pytest.mark.slow, pytest.mark.faults]

LOST = {"worker_lost", "communication"}


@pytest.fixture(scope="module")
def cluster():
    with local_cluster({"w1": 1, "w2": 1}) as c:
        yield c


@pytest.fixture
def full_cluster(cluster: LocalRayCluster) -> LocalRayCluster:
    """The module's cluster with every worker node up (a test before may have lost one)."""
    for name in ("w1", "w2"):
        if not cluster.nodes[name].alive:
            cluster.add_node(name, num_cpus=1)
    cluster.wait_for_nodes(3)
    return cluster


def _train_workers(cluster: LocalRayCluster, exclude: set[int], timeout: float = 240.0):
    """The two worker processes of the next trial (pids not in ``exclude``): Ray Train's
    (fresh processes) or the warm pool's (the default)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [(n, p) for needle in ("RayTrainWorker", "PoolWorker")
                 for n, p in cluster.find(needle) if p.pid not in exclude]
        if len(found) >= 2:
            return found
        time.sleep(0.25)
    raise AssertionError("the trial's two Train workers never started")


def _wait_in_job(workers, timeout: float = 240.0, settle_s: float = 4.0) -> None:
    """Wait until the two ranks are connected to each other (their gloo group is up, so the
    worker group has started and the train function runs), then ``settle_s`` more.

    Why: Ray Train retries a worker group that dies while it is still starting up; only a
    worker lost while the job runs fails the trial.
    """
    (_, a), (_, b) = workers[:2]
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            la = {c.laddr for c in a.net_connections("tcp") if c.raddr}
            rb = {c.raddr for c in b.net_connections("tcp") if c.raddr}
        except Exception:  # noqa: BLE001 - a worker gone while we look: let the caller see it
            return
        if la & rb:
            time.sleep(settle_s)
            return
        time.sleep(0.25)
    raise AssertionError("the two ranks never connected")


def test_worker_killed_then_node_lost_mid_trial_search_goes_on(full_cluster, tmp_path):
    cluster = full_cluster
    # 100 measured steps: the trial's job lasts long enough to be killed while it runs.
    task = spread_task(tmp_path, **{"timing.measured_steps": 100})
    driver = SearchDriver(cluster, tmp_path / "driver", task, budget=3)
    try:
        # Trial 1: SIGKILL one Ray Train worker process while the trial runs.
        workers = _train_workers(cluster, set())
        _wait_in_job(workers)
        node, victim = workers[0]
        t_kill = time.time()
        victim.send_signal(signal.SIGKILL)
        done1 = driver.wait_event("done", 1, timeout=300)
        # Trial 2: lose a whole worker node (every process of it SIGKILLed) under the trial.
        seen = {p.pid for _, p in workers}
        workers2 = _train_workers(cluster, seen)
        _wait_in_job(workers2)
        lost = next(n for n, _ in workers2 if n != "head")
        t_loss = cluster.nodes[lost].kill()
        cluster.wait_for_nodes(2, timeout=60)
        node_gone_s = time.time() - t_loss
        done2 = driver.wait_event("done", 2, timeout=300)
        # Trial 3 schedules on what is left: head + the other worker node.
        seen |= {p.pid for _, p in workers2}
        workers3 = _train_workers(cluster, seen)
        summary = driver.wait(timeout=400)
    finally:
        driver.kill()
    done3 = driver.events("done")[2]

    assert done1["status"] == "error" and done1["error_kind"] in LOST, done1
    assert done2["status"] == "error" and done2["error_kind"] in LOST, done2
    assert done1["device_seconds"] > 0 and done2["device_seconds"] > 0  # the cost is kept
    assert done3["status"] == "ok", done3
    assert lost not in {n for n, _ in workers3}
    # Nothing lost or repeated: one finished bank row per trial run, none left open.
    assert summary["trials"] == 3 and len(set(summary["trial_ids"])) == 3
    assert summary["counts"]["total"] == 3 and summary["counts"]["open"] == 0
    assert summary["cpu_total_end"] == summary["cpu_total_start"] - 1
    print(f"\n[fault] worker killed ({node}): detected in {done1['t'] - t_kill:.1f}s "
          f"as {done1['error_kind']}, cost {done1['device_seconds']:.0f} device-s")
    print(f"[fault] node {lost} lost: detected in {done2['t'] - t_loss:.1f}s as "
          f"{done2['error_kind']}, cost {done2['device_seconds']:.0f} device-s; GCS saw the node "
          f"gone within {node_gone_s:.1f}s; next trial ran on {sorted({n for n, _ in workers3})}")


DEADLOCK = """
import torch as _torch
import torch.distributed as _dist
_orig_build_dense = build_dense
def build_dense(shape):
    if _dist.is_initialized() and _dist.get_world_size() > 1:
        _t = _torch.zeros(1)
        if _dist.get_rank() == 0:
            _dist.all_reduce(_t)  # rank 1 never joins this collective ...
        else:
            _dist.recv(_t, src=0)  # ... it waits for a message rank 0 never sends
    return _orig_build_dense(shape)
"""


def _deadlock_run(cluster: LocalRayCluster, tmp_path, inline: bool):
    task = spread_task(tmp_path, **{"trial.timeout_s": 20})
    inject_into_dense(task, DEADLOCK)
    driver = SearchDriver(cluster, tmp_path / "driver", task, budget=1, startup_allowance=60,
                          inline=inline)
    try:
        workers = _train_workers(cluster, set())
        summary = driver.wait(timeout=300)
    finally:
        driver.kill()
    (done,) = driver.events("done")
    (start,) = driver.events("start")
    return done, start, summary, workers


def test_deadlocked_collective_is_ended_by_the_trial_timeout(full_cluster, tmp_path):
    """The backend as the driver calls it: rank 0 in all_reduce, rank 1 waiting on a recv."""
    done, start, summary, workers = _deadlock_run(full_cluster, tmp_path, inline=True)
    assert done["status"] == "error" and done["error_kind"] == "timeout", (done, summary)
    assert "time limit" in done["message"]
    assert done["device_seconds"] > 0
    assert summary["counts"]["total"] == 1 and summary["counts"]["open"] == 0
    assert summary["freed_s"] is not None, "CPUs still held after the hung trial was ended"
    deadline = time.time() + 30  # its worker processes are gone too, on every node
    while any(p.is_running() for _, p in workers) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(p.is_running() for _, p in workers)
    print(f"\n[fault] deadlocked collective: ended {done['t'] - start['t']:.1f}s after the trial "
          f"began (limit 20s + 60s startup allowance), classified {done['error_kind']}, cost "
          f"{done['device_seconds']:.0f} device-s, CPUs free {summary['freed_s']:.1f}s after")


# Regression: the placement-group reaper used to remove the Tune trial's own group (made by
# the Tune driver, which the GCS marks with a nil, "dead" creator actor), destroying the trial
# process before it could report the timeout record (tests/test_reaper.py).
def test_deadlocked_collective_under_tune_is_recorded_as_a_timeout(full_cluster, tmp_path):
    done, _, summary, _ = _deadlock_run(full_cluster, tmp_path, inline=False)
    assert done["status"] == "error" and done["error_kind"] == "timeout", (done, summary)
    assert done["device_seconds"] > 0
