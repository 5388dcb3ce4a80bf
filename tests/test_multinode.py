"""A real multi-node Ray cluster on this machine: trials whose Ray Train workers span nodes.

The cluster is a head and two worker nodes, each its own ``ray start`` with 1 CPU; the search
runs as its own driver process joining through RAY_ADDRESS, as ``ray job submit`` runs it.
"""

from __future__ import annotations

import time

import pytest
from cluster_fixture import TRIAL_DRIVER_RESOURCE, LocalRayCluster, SearchDriver, local_cluster
from conftest import copy_task

from infrarsi.bank import ExperienceBank

pytestmark = pytest.mark.slow

# Two 1-thread DDP workers, fp32, no compile: the cheapest real 2-rank trials of cpu_dense.
CHEAP_2_RANK = {
    "num_workers": [2], "num_threads": [1], "micro_batch_size": [1, 2],
    "activation_checkpointing": ["none"], "precision": ["fp32"], "compile": ["off"],
    "data_parallel": ["ddp"],
}


def spread_task(tmp_path, **overrides):
    return copy_task(tmp_path, **{"trial.timeout_s": 120, "trial.placement_strategy": "SPREAD",
                                  "search.restrict": CHEAP_2_RANK, **overrides})


@pytest.fixture(scope="module")
def cluster():
    with local_cluster({"w1": 1, "w2": 1}) as c:
        yield c


def test_nodes_are_separate_with_their_own_resources(cluster: LocalRayCluster):
    nodes = cluster.alive_nodes()
    assert len(nodes) == 3
    assert sorted(n["resources"]["CPU"] for n in nodes) == [1.0, 1.0, 1.0]  # not double-counted
    head = [n for n in nodes if "node_head" in n["resources"]]
    assert len(head) == 1 and head[0]["resources"][TRIAL_DRIVER_RESOURCE] == 4
    assert {p.pid for p in cluster.nodes["w1"].processes()}.isdisjoint(
        p.pid for p in cluster.nodes["w2"].processes())


def test_spread_trial_runs_its_workers_on_two_nodes(cluster: LocalRayCluster, tmp_path):
    driver = SearchDriver(cluster, tmp_path / "driver", spread_task(tmp_path), budget=1)
    nodes_seen: set[str] = set()
    trial_driver_nodes: set[str] = set()
    while driver.proc.poll() is None:
        # a trial's workers: Ray Train's (fresh processes) or the warm pool's (the default)
        nodes_seen |= {name for needle in ("RayTrainWorker", "PoolWorker")
                       for name, _ in cluster.find(needle)}
        trial_driver_nodes |= {name for name, _ in cluster.find("ImplicitFunc")}
        time.sleep(0.5)
    summary = driver.wait(timeout=10)
    assert summary["counts"]["ok"] == 1, driver.events("done")
    assert len(nodes_seen) == 2, f"workers ran on {nodes_seen}"
    assert trial_driver_nodes <= {"head"}  # Tune's trial process: on the head, no CPU taken
    assert summary["freed_s"] is not None
    with ExperienceBank.open(driver.bank_url, seed=False) as bank:
        (rec,) = bank.trials(summary["run_id"])
    assert rec.ok and len(rec.peak_memory_bytes) == 2 and rec.device_seconds > 0
