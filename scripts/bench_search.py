#!/usr/bin/env python
"""Side-by-side search benchmark: peers (and later InfraRSI) on a measured table or a simulator.

    .venv/bin/python scripts/bench_search.py --budgets 10,15,25 --seeds 10 --out bench.json

Rule for samplers that draw knob values one by one: they draw only the table's *searched* knobs
from their measured values; a combination the table never measured is answered "not run" (the
searcher hears an errored trial, no budget and no device time are spent) and it is asked again,
up to 100 times, after which a uniformly drawn measured config is run (a "fallback", counted).
Random search draws uniformly from the measured configs (Tune's variant generator over one
categorical). OOM: the plain Optuna and HyperOpt peers see it as an errored trial; constrained
TPE sees it (and a not-run sample) as a constraint violation; DeepSpeed and the greedy climber
see a failed trial. ``--engine inline`` drives the same Searcher objects in-process through
Tune's protocol (identical trajectories, checked by ``--tune-check``), without Tune's overhead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infrarsi.bench import SEARCHERS, run_bench  # noqa: E402
from infrarsi.bench._overhead import tune_overhead  # noqa: E402
from infrarsi.bench._report import (  # noqa: E402
    _geo,
    format_report,
    load_metrics,
    metrics,
    summarize,
    to_json,
)
from infrarsi.bench._sources import WORKLOAD_SOURCES  # noqa: E402


def _parse_workloads(text: str | None) -> list[dict] | None:
    """'1B:1,8B:4' -> [{'model': '1B', 'nodes': 1}, ...] for the Ultra-Scale table, or JSON."""
    if not text:
        return None
    if text.lstrip().startswith("["):
        return json.loads(text)
    out = []
    for part in text.split(","):
        model, nodes = part.split(":")
        out.append({"model": model.strip(), "nodes": int(nodes)})
    return out


def _baseline_fractions(backends) -> dict[str, float | None]:
    out = {}
    for b in backends:
        best = getattr(b, "best_objective", lambda: None)()
        value = b.objective(b.execute(b.baseline_config())) if best else None
        out[getattr(b, "workload_name", b.workload.name)] = value / best if value else None
    return out


def _experience_source(a: argparse.Namespace, backends):
    """``experience(i, backend)`` for run_bench from --experience-from / --experience-bank, or
    None (leave-one-workload-out within the table). Prints what each projection keeps."""
    if not (a.experience_from or a.experience_bank):
        return None
    from infrarsi.bank.transfer import project_records

    pooled = []
    for spec in (a.experience_from or "").split(","):
        if spec.strip():
            spec = spec.strip()
            if spec.startswith("sim:"):  # the simulator's built-ins on one GPU, e.g. sim:H100-80GB
                group = WORKLOAD_SOURCES["simulator"]({"gpus": [spec[4:]]})
            else:
                group = WORKLOAD_SOURCES["table"]({"spec": spec})
            for b in group:
                pooled += b.records()
    bank = None
    if a.experience_bank:
        from infrarsi.bank import ExperienceBank

        bank = ExperienceBank.open(a.experience_bank, seed=False)
    shown = set()

    def experience(i, backend):
        recs = list(pooled)
        if bank is not None:
            recs += [n.record for n in bank.nearest(backend.workload, backend.hardware, k=400)
                     if (n.record.workload, n.record.hardware) != (backend.workload, backend.hardware)]
        line = project_records(backend.space, recs).summary()
        if line not in shown:
            shown.add(line)
            print(f"  {getattr(backend, 'workload_name', '')}: {line}")
        return recs

    return experience


def _n_configs(backend) -> int:
    """Legal configs of a workload: a table's measured rows, a simulator's enumerated space."""
    space = backend.space
    return len(space.allowed) if space.allowed is not None else len(space.enumerate())


def _budget_groups(backends, budgets, third: bool):
    """[(budgets, backends)]: with ``third``, each budget capped at a third of the workload's
    configs (the issue's "budget 15 or a third of the configs, whichever is smaller")."""
    if not third:
        return [(budgets, list(backends))]
    groups: dict[tuple, list] = {}
    for b in backends:
        n = _n_configs(b)
        key = tuple(sorted({max(1, min(x, n // 3)) for x in budgets}))
        groups.setdefault(key, []).append(b)
    return [(list(k), v) for k, v in groups.items()]


def _trajectories(runs) -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(workload, searcher label, budget, config-key sequence) of every run."""
    from infrarsi.space import config_key

    return [(r.workload, r.searcher + ("+exp" if r.experience else ""), r.budget,
             tuple(config_key(t.config) for t in r.trajectory.records)) for r in runs]


def _print_distinct(trajectories, n_configs: dict[str, int], large: int = 50) -> None:
    """Distinct trajectories (config sequences) over the seeds, per workload and searcher: the
    worst and mean workload, over all workloads and over those with ``large`` configs or more."""
    from collections import defaultdict

    seqs, n = defaultdict(set), defaultdict(int)
    for wl, label, budget, seq in trajectories:
        seqs[(wl, label, budget)].add(tuple(seq))
        n[(wl, label, budget)] += 1
    print("\ndistinct trajectories over seeds (workload, searcher, budget): distinct/searches")
    for subset, keep in (("all workloads", lambda wl: True),
                         (f"workloads with >= {large} configs",
                          lambda wl: n_configs.get(wl, 0) >= large)):
        by_searcher = defaultdict(list)
        for key, s in sorted(seqs.items()):
            if keep(key[0]):
                by_searcher[key[1]].append((len(s), n[key], key[0], key[2]))
        print(f" {subset}: {len({k[0] for k in seqs if keep(k[0])})}")
        for name, rows in by_searcher.items():
            worst = min(rows)
            print(f"  {name:22s} min {worst[0]}/{worst[1]} ({worst[2]}, budget {worst[3]}), "
                  f"mean {sum(r[0] for r in rows) / len(rows):.1f}")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default="table", choices=sorted(WORKLOAD_SOURCES),
                   help="where workloads come from: the measured table (replay) or the simulator's "
                        "built-in GPU-cluster workloads")
    p.add_argument("--spec", help="table spec YAML (default: the shipped infrarsi/configs/tables/ultrascale.yaml)")
    p.add_argument("--csv", help="override the CSV path (else $INFRARSI_DATA_DIR)")
    p.add_argument("--hide", default="", help="table: measured columns to hide, e.g. 'memory' "
                   "(the table replayed as logs with ok/OOM labels but no peak memory)")
    p.add_argument("--workloads", help="table: e.g. '1B:1,8B:4'; simulator: JSON, e.g. "
                   "'[{\"name\": \"moe-single-node\"}]' (default: every workload)")
    p.add_argument("--searchers", default=",".join(SEARCHERS),
                   help=f"comma list from {', '.join(SEARCHERS)}")
    p.add_argument("--budgets", default="10,15,25", help="trial budgets, comma list")
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 per cell (use >= 10)")
    p.add_argument("--engine", default="inline", choices=["inline", "tune"],
                   help="tune: every search through tune.Tuner; inline: same searchers in-process")
    p.add_argument("--tune-check", type=int, default=1, metavar="N",
                   help="measure Tune overhead and check tune == inline on N workloads (0: skip)")
    p.add_argument("--experience-from", metavar="SPEC[,SPEC]",
                   help="the +exp rows start from every record of these table specs (e.g. "
                        "configs/tables/ultrascale.yaml: H100 experience for an A100 table; "
                        "sim:H100-80GB, the simulator's built-ins on that GPU) "
                        "instead of the searched table's other workloads")
    p.add_argument("--experience-bank", metavar="URL",
                   help="the +exp rows start from a bank's nearest records (as `infrarsi run` "
                        "queries it), leaving out the searched workload's own")
    p.add_argument("--sim-gpus", metavar="GPU[,GPU]",
                   help="simulator: run every workload on each of these GPUs (e.g. "
                        "A100-40GB,A100-80GB,H200-141GB,MI300X-192GB)")
    p.add_argument("--min-configs", type=int, default=0,
                   help="only workloads with at least this many measured configs")
    p.add_argument("--budget-third", action="store_true",
                   help="cap each workload's budget at a third of its configs")
    p.add_argument("--per-workload", action="store_true", help="print every workload's table")
    p.add_argument("--out", help="write the runs and figures as JSON here")
    p.add_argument("--from-json", metavar="PATH",
                   help="print the report of an earlier --out file instead of running")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.from_json:
        ms, meta = load_metrics(Path(a.from_json).read_text())
        data = json.loads(Path(a.from_json).read_text())
        from infrarsi.space import config_key

        _print_distinct([(r["workload"], r["searcher"] + ("+exp" if r["experience"] else ""),
                          r["budget"], tuple(config_key(t["config"]) for t in r["trajectory"]))
                         for r in data["runs"]], meta.get("n_configs", {}))
        print(format_report(summarize(ms), per_workload=a.per_workload))
        print(f"\nfrom {a.from_json}: engine {meta.get('engine')}, bench wall "
              f"{meta.get('bench_wall_s', float('nan')):.1f} s")
        return 0
    t_start = time.perf_counter()
    source = WORKLOAD_SOURCES[a.source]
    backends = source({"spec": a.spec, "csv": a.csv, "workloads": _parse_workloads(a.workloads),
                       "hide": [h for h in a.hide.split(",") if h],
                       "gpus": [g for g in (a.sim_gpus or "").split(",") if g]})
    skipped = [b for b in backends if getattr(b, "best_objective", lambda: 1)() is None]
    backends = [b for b in backends if b not in skipped]
    for b in skipped:
        print(f"skipped {getattr(b, 'workload_name', b.workload.name)}: no config in its space ran ok")
    if a.min_configs:
        backends = [b for b in backends if _n_configs(b) >= a.min_configs]
    searchers = [s for s in a.searchers.split(",") if s]
    budgets = [int(x) for x in a.budgets.split(",")]
    seeds = list(range(a.seeds))
    overhead = None
    if a.tune_check:
        t0 = time.perf_counter()
        checks = [tune_overhead(b, searchers) for b in backends[: a.tune_check]]
        overhead = {"checks": checks, "wall_s": time.perf_counter() - t0}
        for c in checks:
            print(f"tune check: identical trajectories tune vs inline: {c['all_identical']}; "
                  f"Tune overhead {c['per_tuner_s']:.2f} s per Tuner + "
                  f"{c['per_trial_s'] * 1e3:.0f} ms per trial")
    t0 = time.perf_counter()
    experience = _experience_source(a, backends)
    runs = []
    for group_budgets, group in _budget_groups(backends, budgets, a.budget_third):
        runs += run_bench(group, searchers=searchers, budgets=group_budgets, seeds=seeds,
                          engine=a.engine, progress=lambda m: print("  done", m, flush=True),
                          experience=experience)
    n_configs = {getattr(b, "workload_name", b.workload.name): _n_configs(b) for b in backends}
    _print_distinct(_trajectories(runs), n_configs)
    bench_wall = time.perf_counter() - t0
    ms = [metrics(r) for r in runs]
    summary = summarize(ms)
    summary["baseline_fraction"] = _baseline_fractions(backends)
    print(format_report(summary, per_workload=a.per_workload))
    bf = [v for v in summary["baseline_fraction"].values() if v is not None]
    print(f"reference: the baseline config alone (where baseline-anchored searchers start) reaches "
          f"geo-mean {_geo(bf):.3f} of the best over {len(bf)} workloads")
    total_trials = sum(m.trials for m in ms)
    print(f"\n{len(runs)} searches, {total_trials} trials, engine {a.engine}: {bench_wall:.1f} s "
          f"(total with checks {time.perf_counter() - t_start:.1f} s)")
    if overhead and overhead["checks"][0]["per_trial_s"] is not None:
        c = overhead["checks"][0]
        tuners = len({(r.workload, r.searcher, r.experience, r.seed)
                      if not getattr(SEARCHERS[r.searcher], "budget_aware", True)
                      else (r.workload, r.searcher, r.experience, r.seed, r.budget) for r in runs})
        trials_run = total_trials if a.engine == "tune" else sum(
            m.trials for m in ms if m.budget == max(budgets)
            or getattr(SEARCHERS[m.searcher], "budget_aware", True))
        est = tuners * c["per_tuner_s"] + trials_run * c["per_trial_s"]
        print(f"the same grid through Tune ({tuners} Tuner runs, {trials_run} trials) would add "
              f"about {est / 60:.0f} min of Tune overhead")
    if a.out:
        meta = {"argv": sys.argv, "engine": a.engine, "budgets": budgets, "seeds": seeds,
                "searchers": searchers, "source": a.source, "bench_wall_s": bench_wall,
                "tune_overhead": overhead, "n_configs": n_configs, "skipped": [getattr(b, "workload_name", "") for b in skipped]}
        Path(a.out).write_text(to_json(ms, runs, summary, meta))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
