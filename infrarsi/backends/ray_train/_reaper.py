"""Free the placement groups a killed trial leaves behind.

Ray Train's own cleaner removes a dead controller's placement group through the state API, which
cannot find its cluster on a machine running several Ray instances; then the killed trial's
CPUs stay reserved forever. A placement group whose creating actor is dead (and that is not
detached) belongs to no one: removing it is always safe, whoever else is running trials.

Careful: the GCS marks a placement group created by a driver or a plain task (Tune creates each
trial's group from its driver) with a nil creator actor *and* ``creator_actor_dead=True``. Such
a group is alive for as long as its job is; only groups an actual actor created are reaped.
"""

from __future__ import annotations

import time

import ray
from ray.core.generated import gcs_pb2
from ray.util.placement_group import PlacementGroup, remove_placement_group

_ALIVE = (gcs_pb2.PlacementGroupTableData.PENDING, gcs_pb2.PlacementGroupTableData.PREPARED,
          gcs_pb2.PlacementGroupTableData.CREATED, gcs_pb2.PlacementGroupTableData.RESCHEDULING)


def orphaned_placement_groups() -> list[bytes]:
    accessor = ray._private.state.state._connect_and_get_accessor()  # noqa: SLF001 - GCS table
    out = []
    for raw in accessor.get_placement_group_table():
        pg = gcs_pb2.PlacementGroupTableData.FromString(raw)
        nil = b"\xff" * len(pg.creator_actor_id)
        made_by_actor = bool(pg.creator_actor_id) and pg.creator_actor_id != nil
        if pg.state in _ALIVE and not pg.is_detached and made_by_actor and pg.creator_actor_dead:
            out.append(pg.placement_group_id)
    return out


def reap_orphaned_placement_groups(wait_s: float = 10.0) -> int:
    """Remove orphaned placement groups, waiting up to ``wait_s`` for creators to be seen dead."""
    deadline = time.time() + wait_s
    removed = 0
    while True:
        for pg_id in orphaned_placement_groups():
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(pg_id)))
            removed += 1
        if removed or time.time() >= deadline:
            return removed
        time.sleep(0.5)
