"""The searcher's own time per suggestion (model refits included) against experience size.

For each experience size, one search of a measured-table workload runs ``--budget`` trials
through the InfraRSI searcher (trials are table lookups, so only the searcher is timed); the
experience is that many records of the *other* workloads of the table (leave-one-out, as a bank
would hold them). Prints the median, 90th percentile and maximum time of ``suggest`` + the
record's ``on_trial_complete``. The first suggestion of a search with experience fits the
experience models (cached across searches that share it: ``cold cache`` is that first search).

    .venv/bin/python scripts/bench_engine.py [--sizes 0,1000,3000] [--budget 25] [--workload 8B:4]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infrarsi.bench import build_search_alg, execute_trial  # noqa: E402
from infrarsi.bench._ours import EXPERIENCE_CACHE  # noqa: E402
from infrarsi.bench._sources import table_workloads  # noqa: E402


def one_search(backend, experience, budget: int, seed: int) -> list[float]:
    """The bench's own InfraRSI searcher (behind the same legality guard as in the benchmark)."""
    searcher, *_ = build_search_alg("infrarsi", backend, budget=budget, seed=seed,
                                    experience=experience)
    times = []
    for i in range(budget):
        tid = f"t{i}"
        t0 = time.perf_counter()
        config = searcher.suggest(tid)
        dt = time.perf_counter() - t0
        if not isinstance(config, dict):
            break
        _, result = execute_trial(backend, config, seed, i)
        t0 = time.perf_counter()
        searcher.on_trial_complete(tid, result)
        times.append(dt + time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0,1000,3000", help="experience sizes (records)")
    ap.add_argument("--budget", type=int, default=25)
    ap.add_argument("--workload", default="8B:4", help="MODEL:NODES of the searched workload")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)

    backends = table_workloads({})
    model, nodes = args.workload.split(":")
    name = f"model={model},nodes={nodes}"
    target = next(b for b in backends if b.workload_name == name)
    pool = [r for b in backends if b is not target for r in b.records()]
    print(f"workload {name}; {len(pool)} records of other workloads available; "
          f"budget {args.budget}, {args.seeds} seed(s)")
    print(f"  {'experience':>10} {'cache':>6} {'median':>8} {'p90':>8} {'max':>8} {'first':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        if size > len(pool):
            print(f"  {size:>10}: only {len(pool)} records available; skipped")
            continue
        exp = random.Random(size).sample(pool, size)
        EXPERIENCE_CACHE.clear()  # measure the cold fit too
        for seed in range(args.seeds):
            t = one_search(target, exp, args.budget, seed)
            q = statistics.quantiles(t, n=10)[-1] if len(t) >= 2 else t[0]
            cache = "cold" if seed == 0 and size else ("warm" if size else "-")
            print(f"  {size:>10} {cache:>6} {statistics.median(t):7.3f}s {q:7.3f}s "
                  f"{max(t):7.3f}s {t[0]:7.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
