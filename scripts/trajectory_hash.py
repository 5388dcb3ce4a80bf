#!/usr/bin/env python
"""One SHA-256 over the trajectories of a fixed set of InfraRSI searches: a behaviour fingerprint.

Run it before and after a change that must not change what the search engine decides (a
refactor); the two hashes must be identical. Each search is the benchmark's own ``infrarsi``
searcher (:mod:`infrarsi.bench._ours`, behind the same legality guard, driven inline), cold and
with leave-one-workload-out experience, over:

- the Ultra-Scale table (``configs/tables/ultrascale.yaml``; the CSV under ``$INFRARSI_DATA_DIR``
  or ``--csv``): ``--table-workloads`` x seeds x {cold, +exp};
- the simulator's built-in clusters: ``--sim-workloads`` x seeds x {cold, +exp}.

When the table's CSV cannot be found, only the simulator searches run (the hash says which).
What is hashed per search, in order: every trial's config, the origin the engine gave it,
status, error kind and objective; then the engine's pairings and stop reason.

    INFRARSI_DATA_DIR=/path/to/data .venv/bin/python scripts/trajectory_hash.py [--verbose]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infrarsi.bench import build_search_alg, run_inline  # noqa: E402
from infrarsi.bench._sources import WORKLOAD_SOURCES  # noqa: E402
from infrarsi.space import config_key  # noqa: E402


def _engine_of(alg):
    """The SearchEngine inside the (guarded) InfraRSISearcher."""
    inner = getattr(alg, "searcher", alg)
    return inner.engine


def one_search(backend, experience, budget: int, seed: int) -> dict:
    alg, param_space, oom_as_error, mode = build_search_alg(
        "infrarsi", backend, budget=budget, seed=seed, experience=experience)
    traj = run_inline(alg, backend, budget=budget, seed=seed, mode=mode,
                      oom_as_error=oom_as_error, param_space=param_space)
    engine = _engine_of(alg)
    origins = [o["origin"] for o in engine.observations]
    trials = [{"config": config_key(r.config), "status": r.status.value,
               "error_kind": r.error_kind.value if r.error_kind else None,
               "objective": backend.objective(r)} for r in traj.records]
    return {"trials": trials, "origins": origins, "pairings": engine.pairings,
            "stop_reason": engine.stop_reason}


def _searches(source: str, options: dict, names: list[str], seeds: list[int], budget: int):
    backends = WORKLOAD_SOURCES[source](options)
    by_name = {getattr(b, "workload_name", b.workload.name): (i, b) for i, b in enumerate(backends)}
    own = [list(b.records()) if hasattr(b, "records") else [] for b in backends]
    for name in names:
        i, backend = by_name[name]
        others = [r for j, recs in enumerate(own) if j != i for r in recs]
        for seed in seeds:
            for with_exp in (False, True):
                label = f"{source} {name} seed={seed} {'+exp' if with_exp else 'cold'}"
                yield label, backend, (others if with_exp else None), budget, seed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", help="the Ultra-Scale table CSV (else found via $INFRARSI_DATA_DIR)")
    ap.add_argument("--table-workloads", default="1B:1,8B:4,80B:16", help="MODEL:NODES list")
    ap.add_argument("--sim-workloads", default="dense-single-node,moe-single-node")
    ap.add_argument("--seeds", default="0,1", help="seeds of every table search")
    ap.add_argument("--sim-seeds", default="0", help="seeds of every simulator search")
    ap.add_argument("--budget", type=int, default=15)
    ap.add_argument("--verbose", action="store_true", help="print each search's own hash")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # the models' fallback notes; they change no decision

    plans = []
    try:
        opts = {"csv": a.csv, "workloads": [
            {"model": m, "nodes": int(n)} for m, n in (p.split(":") for p in a.table_workloads.split(","))]}
        names = [f"model={d['model']},nodes={d['nodes']}" for d in opts["workloads"]]
        WORKLOAD_SOURCES["table"](opts)  # fails here when the CSV is absent
        plans.append(("table", {"csv": a.csv}, names, [int(s) for s in a.seeds.split(",")]))
    except (FileNotFoundError, OSError) as e:
        print(f"table skipped (simulator only): {e}")
    plans.append(("simulator", {}, a.sim_workloads.split(","), [int(s) for s in a.sim_seeds.split(",")]))

    total = hashlib.sha256()
    n, t0 = 0, time.perf_counter()
    for source, options, names, seeds in plans:
        for label, backend, exp, budget, seed in _searches(source, options, names, seeds, a.budget):
            blob = json.dumps(one_search(backend, exp, budget, seed), sort_keys=True, default=str)
            total.update(label.encode() + b"\0" + blob.encode() + b"\0")
            n += 1
            if a.verbose:
                print(f"  {label}: {hashlib.sha256(blob.encode()).hexdigest()[:16]}", flush=True)
    print(f"{n} searches ({', '.join(p[0] for p in plans)}), budget {a.budget}, "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"trajectory sha256: {total.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
