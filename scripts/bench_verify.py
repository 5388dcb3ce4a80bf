"""The promotion rule on real CPU trials: A/A false promotions, A/B power under a busy core.

Every trial is a real Ray Train job of the task (like the search runs them); every verdict is
``infrarsi.search.verify.verify_candidate`` with the rule the run uses (one-sided lower bound
from the verification's own pairs > 1 + min_effect, Pocock-type alpha spending over the looks).

(a) A/A: the baseline verified against itself ``--aa`` times: how many are promoted (the rule
    targets at most 5%). With few real verdicts that count is coarse, so the A/A pairs measured
    are also resampled (with replacement, as measured, not re-centred) into ``--resample``
    sequential verdicts through the same looks and levels (``judge``).
(b) A/B: ``--candidate`` against ``--ab-baseline`` (each KNOB=VALUE over the task's baseline)
    verified ``--ab`` times while ``--load-cores`` busy-loop processes this script starts (and
    stops, by pid, with a deadline of their own) compete for the CPUs; then, quiet, one
    re-measurement of the same two configs: how often the loaded verdicts promote and how far
    their estimate is from the quiet one. The default pair is a difference known to be real on
    any machine: the A side recomputes every layer's forward in the backward
    (``activation_checkpointing=full``), the B side is the task's baseline (no recompute), so B
    does about a third less compute per step. (micro_batch_size 1 vs 4 is no such difference
    on the CPU reference task: its quiet re-measurement read 1.01x.) ``--ab 0`` skips (b).

(c) Many more A/A verdicts on the simulator, its machine noise fitted to the real A/A trials
    (``infrarsi.backends.simulator.noise.fit_noise``: step jitter, stalled steps, per-trial
    shifts, a slow load drift): ``--sim-aa`` verdicts through ``verify_candidate`` (how many
    promote), ``--sim-bar`` verdicts of the config whose noise-free speedup is nearest the bar
    ``1 + min_effect`` (the worst case the rule's 5% is stated for), and ``--sim-ab`` verdicts
    of the config nearest ``--sim-effect`` (how many promote: the power at that effect).
    ``--calibrate FILE.json`` reads the real trials from an earlier ``--out`` and runs (c) only.

    .venv/bin/python scripts/bench_verify.py [--task cpu_dense] [--aa 3] [--ab 2] [--pairs 5]
        [--max-pairs 10] [--ab-baseline activation_checkpointing=full]
        [--candidate activation_checkpointing=none] [--load-cores 1] [--out FILE.json]
        [--sim-aa 2000] [--sim-bar 2000] [--sim-ab 500] [--sim-effect 1.10]
        [--calibrate FILE.json]
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


def _whole_pairs(trials: list) -> list:
    """The trials of pairs whose two trials both measured (A/A pairs in order)."""
    return [t for i in range(0, len(trials) - 1, 2) if trials[i] and trials[i + 1]
            for t in (trials[i], trials[i + 1])]


def _load(cores: int, seconds: float) -> list[subprocess.Popen]:
    # each loop also ends when this script does (its parent changes): none outlives a killed run
    code = (f"import os, time\nparent, end = os.getppid(), time.time() + {seconds}\n"
            "while time.time() < end and os.getppid() == parent:\n    pass\n")
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(cores)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
        p.wait(timeout=10)


def _row(tag: str, v, wall: float, trials: list | None = None) -> dict:
    return {"tag": tag, "promoted": v.promoted, "speedup": v.speedup, "lower": v.ci_low,
            "pairs": len(v.pairs), "wall_s": wall, "reason": v.reason,
            "log_ratios": [math.log(b / c) for b, c in v.pairs],
            # every trial's measured steps in the order they ran (A, B, A, B ...): (c) fits these
            "trials": trials or []}


def _steps_of(trials: list):
    return lambda rec, origin: trials.append(list(rec.step_times_s) if rec.ok else None)


def _nearest(b, base_s: float, effect: float):
    """The simulator config whose noise-free speedup is nearest ``effect``, and that speedup."""
    cand, true = None, None
    for c in b.space.enumerate():
        o = b.simulate(c)
        if o.step_time_s and (true is None or abs(base_s / o.step_time_s - effect)
                              < abs(true - effect)):
            cand, true = c, base_s / o.step_time_s
    return cand, true


def simulated(trials: list[list[float]], *, n_aa: int, n_ab: int, effect: float, pairs: int,
              max_pairs: int, min_effect: float, n_bar: int = 0) -> dict:
    """(c): A/A and A/B verdicts on the simulator with the noise fitted to ``trials``."""
    from infrarsi.backends.simulator import SimulatorBackend
    from infrarsi.backends.simulator.noise import fit_noise
    from infrarsi.backends.simulator.params import SimParams
    from infrarsi.search.verify import verify_candidate

    fit = fit_noise(trials)
    params = SimParams().replace(measured_steps=fit["measured_steps"], **{
        k: v for k, v in fit.items() if k.startswith("noise_")})
    b = SimulatorBackend.builtin("dense-single-node", seed=0, params=params)
    base = b.baseline_config()
    base_s = b.simulate(base).step_time_s
    cand, true = _nearest(b, base_s, effect)
    kw = {"pairs": pairs, "max_pairs": max_pairs, "min_effect": min_effect}
    aa = [verify_candidate(b, base, dict(base), tag=f"sim-aa{j}", **kw) for j in range(n_aa)]
    ab = [verify_candidate(b, base, cand, tag=f"sim-ab{j}", **kw) for j in range(n_ab)]
    # the worst case the rule guards: a candidate whose true speedup is exactly the bar
    at_bar, bar_true = _nearest(b, base_s, 1.0 + min_effect) if n_bar else (None, None)
    bar = [verify_candidate(b, base, at_bar, tag=f"sim-bar{j}", **kw) for j in range(n_bar)]
    return {"fit": fit, "bar_true_speedup": bar_true, "bar_promoted": sum(v.promoted for v in bar),
            "bar": n_bar, "aa_promoted": sum(v.promoted for v in aa), "aa": n_aa,
            "aa_pairs_mean": sum(len(v.pairs) for v in aa) / max(n_aa, 1),
            "ab_true_speedup": true, "ab_promoted": sum(v.promoted for v in ab), "ab": n_ab,
            "ab_pairs_mean": sum(len(v.pairs) for v in ab) / max(n_ab, 1),
            "ab_median_speedup": sorted(v.speedup for v in ab)[n_ab // 2] if ab else None}


def _print_sim(sim: dict, min_effect: float) -> None:
    f = sim["fit"]
    print(f"(c) simulator, noise fitted to {f['pairs']} real A/A pairs: step jitter "
          f"{f['noise_step_cv']:.1%}, stalls {f['noise_stall_prob']:.1%} x"
          f"{f['noise_stall_factor']:.2f}, per-trial {f['noise_trial_cv']:.1%}, drift "
          f"{f['noise_drift_cv']:.1%} (rho {f['noise_drift_rho']:.2f}); pair log-ratio SD "
          f"{f['pair_log_ratio_sd']:.3f}")
    n = sim["aa"]
    if n:
        rate = sim["aa_promoted"] / n
        se = math.sqrt(max(rate * (1 - rate), 1e-12) / n)
        print(f"    A/A: {sim['aa_promoted']}/{n} promoted = {rate:.2%} (+-{2 * se:.2%}), "
              f"mean pairs {sim['aa_pairs_mean']:.1f}")
    if sim.get("bar"):
        print(f"    at the bar (a true {sim['bar_true_speedup']:.3f}x, bar {1 + min_effect:.3f}): "
              f"{sim['bar_promoted']}/{sim['bar']} promoted = {sim['bar_promoted'] / sim['bar']:.1%}"
              " (the false-promotion rate the rule targets: <= 5%)")
    if sim["ab"]:
        print(f"    A/B at a true {sim['ab_true_speedup']:.3f}x (bar {1 + min_effect:.3f}): "
              f"{sim['ab_promoted']}/{sim['ab']} promoted = {sim['ab_promoted'] / sim['ab']:.1%}"
              f", median estimate {sim['ab_median_speedup']:.3f}x, mean pairs "
              f"{sim['ab_pairs_mean']:.1f}")


def _ab(backend, base: dict, cand: dict, args, kw: dict, out: dict, save) -> None:
    """(b): ``args.ab`` verdicts under the busy loops, then one quiet re-measurement."""
    from infrarsi.search.verify import verify_candidate

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="cpu_dense")
    ap.add_argument("--aa", type=int, default=3, help="A/A verdicts on real trials")
    ap.add_argument("--ab", type=int, default=2, help="A/B verdicts under load")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--max-pairs", type=int, default=10)
    ap.add_argument("--min-effect", type=float, default=0.03)
    ap.add_argument("--candidate", action="append", default=[], metavar="KNOB=VALUE",
                    help="(b)'s B side over the task's baseline (default: the baseline itself)")
    ap.add_argument("--ab-baseline", action="append", default=[], metavar="KNOB=VALUE",
                    help="(b)'s A side over the task's baseline (default: "
                         "activation_checkpointing=full, a known real slowdown)")
    ap.add_argument("--load-cores", type=int, default=1)
    ap.add_argument("--resample", type=int, default=20000)
    ap.add_argument("--out", default="")
    ap.add_argument("--sim-aa", type=int, default=0, help="(c) simulated A/A verdicts")
    ap.add_argument("--sim-ab", type=int, default=0, help="(c) simulated A/B verdicts")
    ap.add_argument("--sim-effect", type=float, default=1.10)
    ap.add_argument("--sim-bar", type=int, default=0,
                    help="(c) simulated verdicts of a candidate whose true speedup is the bar")
    ap.add_argument("--calibrate", default="", help="(c) only, from an earlier --out file")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sim_kw = {"n_aa": args.sim_aa, "n_ab": args.sim_ab, "effect": args.sim_effect,
              "n_bar": args.sim_bar,
              "pairs": args.pairs, "max_pairs": args.max_pairs, "min_effect": args.min_effect}
    if args.calibrate:
        real = json.loads(Path(args.calibrate).read_text())
        trials = [t for r in real["aa"] for t in _whole_pairs(r["trials"])]
        sim = simulated(trials, **sim_kw)
        _print_sim(sim, args.min_effect)
        if args.out:
            Path(args.out).write_text(json.dumps({"args": vars(args), "sim": sim}, indent=2))
        return 0

    import ray

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.contract import load_task
    from infrarsi.search.verify import FALSE_PROMOTION_RATE, verify_candidate

    spec = load_task(ROOT / "configs" / "tasks" / f"{args.task}.yaml")
    from infrarsi.backends.ray_train._priority import with_trial_priority

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", runtime_env=with_trial_priority())
    backend = RayTrainBackend(spec)
    base = backend.baseline_config()
    ab_base = {**base, **(_parse_set(args.ab_baseline)
                          or {"activation_checkpointing": "full"})}
    cand = {**base, **_parse_set(args.candidate)}
    if ab_base == cand:
        ap.error("--ab-baseline and --candidate give the same config: (b) needs a difference")
    kw = {"pairs": args.pairs, "max_pairs": args.max_pairs, "min_effect": args.min_effect}
    out: dict = {"args": vars(args), "aa": [], "ab": [], "quiet": None}

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=2))

    try:
        for j in range(args.aa):
            t0 = time.monotonic()
            trials: list = []
            v = verify_candidate(backend, base, dict(base), tag=f"aa{j}", on_record=_steps_of(trials),
                                 **kw)
            out["aa"].append(_row(f"aa{j}", v, time.monotonic() - t0, trials))
            print(f"A/A {j + 1}/{args.aa}: {'PROMOTED' if v.promoted else 'refused'}: {v.reason}",
                  flush=True)
            save()
        if args.ab:
            _ab(backend, ab_base, cand, args, kw, out, save)
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
    aa_trials = [t for r in out["aa"] for t in _whole_pairs(r["trials"])]
    if (args.sim_aa or args.sim_ab or args.sim_bar) and len(aa_trials) >= 4:
        out["sim"] = simulated(aa_trials, **sim_kw)
        _print_sim(out["sim"], args.min_effect)
    quiet = out["quiet"]["speedup"] if out["quiet"] else None
    changed = {k: (ab_base[k], cand[k]) for k in cand if ab_base.get(k) != cand[k]}
    print(f"(b) A/B {changed} under {args.load_cores} busy core(s): "
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
