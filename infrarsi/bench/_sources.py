"""Where a benchmark's workloads come from: ``WORKLOAD_SOURCES[name](options) -> backends``.

The simulator plugs in with one line, e.g.
``WORKLOAD_SOURCES["simulator"] = lambda opts: [SimulatorBackend(w, seed=opts.get("seed", 0))
for w in BUILTIN_WORKLOADS]``. Every backend of one source is a workload of the same "table"
(leave-one-workload-out experience is drawn among them). For scoring, a backend provides
``best_objective()`` (the best objective in its space); for experience, ``records()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from infrarsi._resources import package_path
from infrarsi.backends.base import Backend

__all__ = ["DEFAULT_TABLE_SPEC", "WORKLOAD_SOURCES", "table_workloads"]

# shipped with the package; the CSV it reads comes from $INFRARSI_DATA_DIR or the csv option
DEFAULT_TABLE_SPEC: Path = package_path("infrarsi", "configs", "tables", "ultrascale.yaml", kind="file")


def table_workloads(options: dict[str, Any]) -> list[Backend]:
    """Options: ``spec`` (path), ``csv`` (override), ``workloads`` (list of dicts or None = all),
    ``seed``, ``hide`` (measured columns to hide, see ``TableSpec.hide``)."""
    from infrarsi.backends.table import TableBackend, load_table_spec

    spec = load_table_spec(options.get("spec") or DEFAULT_TABLE_SPEC)
    if options.get("hide"):  # e.g. ("memory",): replay the table as logs without that column
        spec = replace(spec, hide=tuple(options["hide"]))
    wanted = options.get("workloads") or TableBackend.workloads(spec, csv_path=options.get("csv"))
    return [TableBackend.from_spec(spec, w, seed=options.get("seed", 0), csv_path=options.get("csv"))
            for w in wanted]


def simulator_workloads(options: dict[str, Any]) -> list[Backend]:
    """Options: ``workloads`` (list of dicts ``{"name": ..., "gpu": ...}``, or None = every
    built-in), ``gpus`` (run every workload on each of these GPUs), ``seed``. Experience: each workload's seeded sample of 200 simulated trials."""
    from infrarsi.backends.simulator import SimulatorBackend

    wanted = options.get("workloads") or [{"name": n} for n in SimulatorBackend.builtin_names()]
    gpus = options.get("gpus")
    if gpus:  # every workload on each of these GPUs instead of its own (same nodes and model)
        wanted = [{**w, "gpu": g} for w in wanted for g in gpus]
    return [_sim(w, options.get("seed", 0)) for w in wanted]


def _sim(w: dict[str, Any], seed: int) -> Backend:
    """A built-in simulator workload, moved to ``w["gpu"]`` when given (e.g. "A100-80GB")."""
    from dataclasses import replace

    from infrarsi.backends.simulator import SimulatorBackend
    from infrarsi.backends.simulator.workloads import BUILTIN_WORKLOADS

    if not w.get("gpu"):
        return SimulatorBackend.builtin(w["name"], seed=seed)
    wl = BUILTIN_WORKLOADS[w["name"]]
    return SimulatorBackend(replace(wl, gpu=w["gpu"], name=f"{wl.name}@{w['gpu']}"), seed=seed)


WORKLOAD_SOURCES: dict[str, Callable[[dict[str, Any]], list[Backend]]] = {
    "table": table_workloads,
    "simulator": simulator_workloads,
}
