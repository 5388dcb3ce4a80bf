"""The placement-group reaper frees only groups whose creating actor died.

Regression: the GCS marks groups made by a driver or a plain task (Tune makes every trial's
group from its driver) with a nil creator actor and ``creator_actor_dead=True``; reaping those
destroyed the Tune trial that was about to report a timed-out trial's record.
"""

from __future__ import annotations

import time

import pytest

from infrarsi.backends.ray_train._reaper import orphaned_placement_groups


def _ids() -> set[bytes]:
    return set(orphaned_placement_groups())


@pytest.fixture
def placement_group(ray_local):
    from ray.util.placement_group import placement_group, remove_placement_group

    made = []

    def make(bundles=({"CPU": 0.01},)):
        pg = placement_group(list(bundles))
        ray_local.get(pg.ready(), timeout=30)
        made.append(pg)
        return pg

    yield make
    for pg in made:
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - already removed by the reaper under test
            pass


def test_groups_of_drivers_tasks_and_live_actors_are_never_orphans(ray_local, placement_group):
    from ray.util.placement_group import placement_group as make_pg

    driver_pg = placement_group()

    @ray_local.remote(num_cpus=0)
    def from_task():
        pg = make_pg([{"CPU": 0.01}])
        ray_local.get(pg.ready())
        return pg.id.binary()

    @ray_local.remote(num_cpus=0)
    class Owner:
        def make(self):
            pg = make_pg([{"CPU": 0.01}])
            ray_local.get(pg.ready())
            return pg.id.binary()

    task_pg = ray_local.get(from_task.remote())
    owner = Owner.remote()
    actor_pg = ray_local.get(owner.make.remote())
    orphans = _ids()
    assert driver_pg.id.binary() not in orphans
    assert task_pg not in orphans
    assert actor_pg not in orphans

    ray_local.kill(owner, no_restart=True)  # now its group belongs to no one
    deadline = time.time() + 20
    while actor_pg not in _ids() and time.time() < deadline:
        time.sleep(0.5)
    orphans = _ids()
    assert actor_pg in orphans
    assert driver_pg.id.binary() not in orphans and task_pg not in orphans
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for pg_id in (task_pg, actor_pg):
        remove_placement_group(PlacementGroup(ray_local.PlacementGroupID(pg_id)))
