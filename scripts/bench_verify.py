"""The promotion rule on real CPU trials: A/A false promotions, A/B power under a busy core.

Every trial is a real Ray Train job of the task (like the search runs them); every verdict is
``infrarsi.search.verify.verify_candidate`` with the rule the run uses (one-sided lower bound
from the verification's own pairs > 1 + min_effect, Pocock-type alpha spending over the looks).

(a) A/A: the baseline verified against itself ``--aa`` times: how many are promoted (the rule
    targets at most 5%). With few real verdicts that count is coarse, so the A/A pairs measured
    are also resampled (with replacement, as measured, not re-centred) into ``--resample``
    sequential verdicts through the same looks and levels (``judge``).
(b) A/B: ``--candidate`` (default micro_batch_size=4, a real difference) verified ``--ab`` times
    while ``--load-cores`` busy-loop processes this script starts (and stops, by pid, with a
    deadline of their own) compete for the CPUs; then, quiet, one re-measurement of the same
    two configs: how often the loaded verdicts promote and how far their estimate is from the
    quiet one.

    .venv/bin/python scripts/bench_verify.py [--task cpu_dense] [--aa 3] [--ab 2] [--pairs 5]
        [--max-pairs 10] [--candidate micro_batch_size=4] [--load-cores 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _parse_set(items: list[str]) -> dict:
    import yaml

    return {k: yaml.safe_load(v) for k, _, v in (i.partition("=") for i in items)}


def resampled_rate(log_ratios: list[float], *, pairs: int, max_pairs: int, min_effect: float,
                   n: int, seed: int = 0) -> float:
    """Share of ``n`` sequential verdicts promoted when pairs are drawn from ``log_ratios``."""
    from infrarsi.search.verify import judge, look_alphas, look_schedule

    rng = random.Random(seed)
    looks = look_schedule(pairs, max_pairs)
    alphas = look_alphas(looks)
    promoted = 0
    for _ in range(n):
        drawn = [math.exp(rng.choice(log_ratios)) for _ in range(looks[-1])]
        for k, (m, a) in enumerate(zip(looks, alphas, strict=True)):
            decision, *_ = judge([(d, 1.0) for d in drawn[:m]], min_effect=min_effect, alpha=a,
                                 final=k == len(looks) - 1, cap=looks[-1])
            if decision != "continue":
                promoted += decision == "promote"
                break
    return promoted / n


def _load(cores: int, seconds: float) -> list[subprocess.Popen]:
    code = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(cores)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
        p.wait(timeout=10)


def _row(tag: str, v, wall: float) -> dict:
    return {"tag": tag, "promoted": v.promoted, "speedup": v.speedup, "lower": v.ci_low,
            "pairs": len(v.pairs), "wall_s": wall, "reason": v.reason,
            "log_ratios": [math.log(b / c) for b, c in v.pairs]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="cpu_dense")
    ap.add_argument("--aa", type=int, default=3, help="A/A verdicts on real trials")
    ap.add_argument("--ab", type=int, default=2, help="A/B verdicts under load")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--max-pairs", type=int, default=10)
    ap.add_argument("--min-effect", type=float, default=0.03)
    ap.add_argument("--candidate", action="append", default=[], metavar="KNOB=VALUE")
    ap.add_argument("--load-cores", type=int, default=1)
    ap.add_argument("--resample", type=int, default=20000)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import ray

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.contract import load_task
    from infrarsi.search.verify import FALSE_PROMOTION_RATE, verify_candidate

    spec = load_task(ROOT / "configs" / "tasks" / f"{args.task}.yaml")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    backend = RayTrainBackend(spec)
    base = backend.baseline_config()
    cand = {**base, **(_parse_set(args.candidate) or {"micro_batch_size": 4})}
    kw = {"pairs": args.pairs, "max_pairs": args.max_pairs, "min_effect": args.min_effect}
    out: dict = {"args": vars(args), "aa": [], "ab": [], "quiet": None}

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=2))

    try:
        for j in range(args.aa):
            t0 = time.monotonic()
            v = verify_candidate(backend, base, dict(base), tag=f"aa{j}", **kw)
            out["aa"].append(_row(f"aa{j}", v, time.monotonic() - t0))
            print(f"A/A {j + 1}/{args.aa}: {'PROMOTED' if v.promoted else 'refused'}: {v.reason}",
                  flush=True)
            save()
        procs = _load(args.load_cores, seconds=3600)
        try:
            for j in range(args.ab):
                t0 = time.monotonic()
                v = verify_candidate(backend, base, cand, tag=f"ab{j}", **kw)
                out["ab"].append(_row(f"ab{j}", v, time.monotonic() - t0))
                print(f"A/B under {args.load_cores} busy core(s) {j + 1}/{args.ab}: "
                      f"{'PROMOTED' if v.promoted else 'refused'}: {v.reason}", flush=True)
                save()
        finally:
            _stop(procs)
        t0 = time.monotonic()
        v = verify_candidate(backend, base, cand, tag="quiet", pairs=args.pairs,
                             max_pairs=args.pairs, min_effect=args.min_effect)
        out["quiet"] = _row("quiet", v, time.monotonic() - t0)
        print(f"A/B quiet re-measurement: {v.reason}", flush=True)
        save()
    finally:
        backend.close()
        ray.shutdown()

    aa_logs = [x for r in out["aa"] for x in r["log_ratios"]]
    n_aa = len(out["aa"])
    print(f"\nrule: one-sided lower bound > 1 + {args.min_effect} from the verification's own "
          f"pairs; target false-promotion rate <= {FALSE_PROMOTION_RATE:.0%}")
    print(f"(a) A/A real verdicts: {sum(r['promoted'] for r in out['aa'])}/{n_aa} promoted "
          f"(pairs used: {[r['pairs'] for r in out['aa']]})")
    if len(aa_logs) >= 2:
        sd = math.sqrt(sum((x - sum(aa_logs) / len(aa_logs)) ** 2 for x in aa_logs)
                       / (len(aa_logs) - 1))
        rate = resampled_rate(aa_logs, min_effect=args.min_effect, n=args.resample,
                              pairs=args.pairs, max_pairs=args.max_pairs)
        out["aa_resampled_rate"] = rate
        print(f"    resampled from the {len(aa_logs)} A/A pairs (SD of a pair's log ratio "
              f"{sd:.3f}): {rate:.2%} of {args.resample} verdicts promoted")
    quiet = out["quiet"]["speedup"] if out["quiet"] else None
    print(f"(b) A/B {cand} under {args.load_cores} busy core(s): "
          f"{sum(r['promoted'] for r in out['ab'])}/{len(out['ab'])} promoted; quiet "
          f"re-measurement {quiet:.3f}x" if quiet else "(b) no quiet re-measurement")
    for r in out["ab"]:
        rel = f", {r['speedup'] / quiet - 1:+.1%} from quiet" if quiet and r["speedup"] else ""
        print(f"    {r['tag']}: {r['speedup']:.3f}x (lower {r['lower']:.3f}, {r['pairs']} pairs)"
              f"{rel}, {r['wall_s']:.0f}s")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
