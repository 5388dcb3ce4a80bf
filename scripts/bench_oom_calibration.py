#!/usr/bin/env python
"""P(OOM) calibration of the configs InfraRSI's search actually runs, on a measured table.

Drives the search engine of ``infrarsi`` (as ``scripts/bench_search.py`` builds it: expert
priors, leave-one-workload-out experience in the ``+exp`` rows) over every workload and seed,
and keeps, for every trial, the P(OOM) the models predicted when the config was picked and
whether it ran out of memory. Prints the calibration by decile of predicted P(OOM) (predicted
mean vs observed OOM rate), the failed share and the geometric-mean fraction of the best,
cold and with experience; ``--hide memory`` replays the table as ok/OOM labels without peaks.
Also: the searcher's time per suggestion (suggest + observe; median and p90).

    .venv/bin/python scripts/bench_oom_calibration.py --hide memory --seeds 10 --budget 15
    .venv/bin/python scripts/bench_oom_calibration.py --spec configs/tables/bigscience.yaml
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from infrarsi.bench import execute_trial  # noqa: E402
from infrarsi.bench._report import FLOOR  # noqa: E402
from infrarsi.bench._sources import table_workloads  # noqa: E402
from infrarsi.proposers import ExpertProposer  # noqa: E402
from infrarsi.search import SearchEngine  # noqa: E402
from infrarsi.trial import TrialStatus  # noqa: E402


def one_search(backend, budget: int, seed: int, experience) -> tuple[list[dict], float, list[float]]:
    priors = ExpertProposer().priors({"space": backend.space, "hardware": backend.hardware})
    eng = SearchEngine(backend.space, backend.workload, backend.hardware, budget=budget, seed=seed,
                       experience=experience or (), objective=backend.objective,
                       baseline=backend.baseline_config(), priors=priors,
                       include_baseline=not experience)
    rows, best, times = [], None, []
    for i in range(budget):
        t0 = time.perf_counter()
        sug = eng.suggest(f"t{i}")
        dt = time.perf_counter() - t0
        if sug is None:
            break
        rec, _ = execute_trial(backend, sug.config, seed, i)  # the bench's per-trial seeding
        t0 = time.perf_counter()
        eng.observe(rec, sug.origin, trial_id=f"t{i}")
        times.append(dt + time.perf_counter() - t0)
        v = backend.objective(rec)
        if v is not None:
            best = v if best is None else max(best, v)
        rows.append({"p_oom": sug.predicted.get("p_oom"), "origin": sug.origin,
                     "config": sug.config,
                     "oom": rec.status is TrialStatus.OOM, "failed": not rec.ok})
    ref = backend.best_objective()
    frac = (best or 0.0) / ref if ref else None
    return rows, frac, times


def calibration(rows: list[dict], bins: int = 10) -> list[tuple[str, int, float, float]]:
    scored = [r for r in rows if r["p_oom"] is not None]
    edges = np.linspace(0, 1, bins + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inb = [r for r in scored if lo <= r["p_oom"] < hi or (hi == 1 and r["p_oom"] == 1)]
        if inb:
            out.append((f"{lo:.1f}-{hi:.1f}", len(inb), float(np.mean([r["p_oom"] for r in inb])),
                        float(np.mean([r["oom"] for r in inb]))))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", help="table spec (default the Ultra-Scale table)")
    ap.add_argument("--hide", default="", help="e.g. 'memory': ok/OOM labels only")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=15)
    ap.add_argument("--min-rows", type=int, default=1,
                    help="only workloads with at least this many measured configs")
    ap.add_argument("--modes", default="cold,exp", help="cold, exp (with experience) or both")
    ap.add_argument("--workloads", type=int, default=0, help="only the first N workloads (smoke)")
    ap.add_argument("--out", help="write every trial's prediction and outcome as JSON here")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    backends = table_workloads({"spec": a.spec, "hide": [h for h in a.hide.split(",") if h]})
    backends = [b for b in backends if b.best_objective() is not None
                and len(b.space.allowed) >= a.min_rows]
    if a.workloads:
        backends = backends[:a.workloads]
    own = [b.records() for b in backends]
    result = {}
    t_all = time.perf_counter()
    modes = [m.strip() for m in a.modes.split(",")]
    for with_exp in [m == "exp" for m in ("cold", "exp") if m in modes]:
        rows, fracs, fails, times, searches = [], [], [], [], []
        for i, b in enumerate(backends):
            exp = [r for j, recs in enumerate(own) if j != i for r in recs] if with_exp else None
            for seed in range(a.seeds):
                r, frac, t = one_search(b, a.budget, seed, exp)
                rows += [{**x, "workload": b.workload_name, "seed": seed} for x in r]
                times += t
                if frac is not None:
                    fracs.append(frac)
                fails.append(sum(x["failed"] for x in r) / max(len(r), 1))
                searches.append({"workload": b.workload_name, "seed": seed, "frac": frac,
                                 "failed": fails[-1]})
        label = "+exp" if with_exp else "cold"
        geo = math.exp(statistics.fmean(math.log(max(f, FLOOR)) for f in fracs))
        ooms = sum(x["oom"] for x in rows)
        print(f"\n{label}: {len(backends)} workloads x {a.seeds} seeds, budget {a.budget}"
              f"{' (hidden: ' + a.hide + ')' if a.hide else ''}: geo fraction of best {geo:.3f}, "
              f"failed share {statistics.fmean(fails):.1%}, OOM {ooms}/{len(rows)} trials; "
              f"time per suggestion median {statistics.median(times) * 1e3:.0f} ms, "
              f"p90 {statistics.quantiles(times, n=10)[-1] * 1e3:.0f} ms")
        print(f"  {'P(OOM) bin':>11} {'trials':>7} {'predicted':>10} {'observed':>9}")
        for name, n, pred, obs in calibration(rows):
            print(f"  {name:>11} {n:>7d} {pred:>10.3f} {obs:>9.3f}")
        result[label] = {"geo": geo, "fail_share": statistics.fmean(fails), "rows": rows,
                         "searches": searches,
                         "median_suggest_s": statistics.median(times)}
    print(f"\nwall {time.perf_counter() - t_all:.0f} s")
    if a.out:
        Path(a.out).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
