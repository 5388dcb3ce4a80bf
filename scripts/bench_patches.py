"""Measured speedup of each honest catalog patch, and of all of them combined, on the CPU tasks.

Each patch is first verified (``verify_patch`` against the task, in a child process). Then the
baseline and every variant run the harness's own ``train_worker`` in this process (one rank,
the task's baseline knobs otherwise), interleaved A B C ... per round in a rotating order, so
that drift of the shared machine hits every variant alike; the speedup of a variant is the
median over rounds of (baseline median step time / variant median step time) in the same round.

    .venv/bin/python scripts/bench_patches.py                    # cpu_dense and cpu_moe, 5 rounds
    .venv/bin/python scripts/bench_patches.py --tasks cpu_moe --rounds 3 --micro-batch-size 2

``--verify-cost BEFORE_TREE`` measures instead the seconds ``verify_patch`` takes per honest
patch (a fresh verifier process per side and task, so each side computes its baseline once, as a
run does), with this tree's code and with the code of BEFORE_TREE (e.g. ``git archive <commit>``
unpacked), side by side:

    .venv/bin/python scripts/bench_patches.py --tasks cpu_dense --verify-cost /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infrarsi.contract import load_task  # noqa: E402
from infrarsi.harness import train_worker  # noqa: E402
from infrarsi.patches import (  # noqa: E402
    Scope,
    find_conflicts,
    honest_patches,
    materialize,
    verify_patch,
)
from infrarsi.workloads import build_torch_space  # noqa: E402


def _combined(patches, workspace, scope):
    """A greedy maximal set of patches that apply together (catalog order, faster first)."""
    bad = {frozenset((a, b)) for a, b, _ in find_conflicts(patches, workspace, scope)}
    chosen = []
    for p in sorted(patches, key=lambda p: p.expected_log_time_effect or 0.0):
        if all(frozenset((p.id, q.id)) not in bad for q in chosen):
            chosen.append(p)
    return chosen


def _step_time(spec, config, workspace, stat: str) -> float:
    out = train_worker({"task": spec.to_dict(), "config": config, "workspace": str(workspace),
                        "capacity_bytes": None})
    return (min if stat == "min" else statistics.median)(out["step_times_s"])


def bench_task(name: str, rounds: int, mbs: int | None, verify: bool, stat: str) -> list[tuple]:
    spec = load_task(ROOT / "configs" / "tasks" / f"{name}.yaml")
    ws, scope = spec.workspace_path(), Scope.from_spec(spec)
    patches = honest_patches(spec.workload.family)
    verdicts = {}
    for p in patches:
        if verify:
            t0 = time.perf_counter()
            v = verify_patch(p, workspace=ws, spec=spec)
            verdicts[p.id] = (v.accepted, v.rule or "accepted", time.perf_counter() - t0)
            print(f"  verify {name}/{p.id}: {'ACCEPTED' if v.accepted else 'REJECTED: ' + v.reason}"
                  f" ({verdicts[p.id][2]:.0f} s)", flush=True)
    accepted = [p for p in patches if not verify or verdicts[p.id][0]]
    combo = _combined(accepted, ws, scope)
    variants = {"baseline": ws}
    variants.update({p.id: materialize(ws, [p], scope) for p in accepted})
    variants["all: " + "+".join(p.id for p in combo)] = materialize(ws, combo, scope)
    space = build_torch_space(spec)
    config = space.normalize({**space.defaults(), **spec.search.baseline, "num_workers": 1,
                              **({"micro_batch_size": mbs} if mbs else {})})
    names = list(variants)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            times[n].append(_step_time(spec, config, variants[n], stat))
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n.split(':')[0]} {times[n][-1] * 1e3:.0f} ms"
                                                     for n in names), flush=True)
    rows = []
    for n in names:
        ratios = [b / v for b, v in zip(times["baseline"], times[n], strict=True)]
        rows.append((name, n, statistics.median(times[n]), statistics.median(ratios),
                     min(ratios), max(ratios)))
    return rows


_COST = """
import json, sys, time
from pathlib import Path
from infrarsi.contract import load_task
from infrarsi.patches import honest_patches, verify_patch
spec = load_task(Path(sys.argv[1]))
out = {}
for p in honest_patches(spec.workload.family):
    t0 = time.perf_counter()
    v = verify_patch(p, workspace=spec.workspace_path(), spec=spec)
    out[p.id] = [time.perf_counter() - t0, v.rule or "accepted"]
print("@@cost " + json.dumps(out))
"""


def _verify_cost(tree: Path, task: Path) -> dict[str, list]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", _COST, str(task)], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("@@cost "):
            return json.loads(line[7:])
    raise RuntimeError(f"verify-cost run in {tree} failed: {proc.stderr[-1500:]}")


def verify_cost(tasks: list[str], before: Path) -> None:
    """Seconds per verified patch, before (BEFORE_TREE's code) and after (this tree's)."""
    print(f"\n{'task':10} {'patch':24} {'before s':>9} {'after s':>9} {'ratio':>6}  verdicts")
    for t in tasks:
        task = ROOT / "configs" / "tasks" / f"{t}.yaml"
        old = _verify_cost(before.resolve(), task)
        new = _verify_cost(ROOT, task)
        for pid in new:
            b, a = old.get(pid, [float("nan"), "-"]), new[pid]
            print(f"{t:10} {pid:24} {b[0]:9.1f} {a[0]:9.1f} {a[0] / b[0]:5.2f}x  {b[1]} / {a[1]}",
                  flush=True)
        print(f"{t:10} {'total':24} {sum(v[0] for v in old.values()):9.1f} "
              f"{sum(v[0] for v in new.values()):9.1f}")
    print("\nThe first patch of each side includes computing that side's baseline reference.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["cpu_dense", "cpu_moe"])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved A/B rounds")
    ap.add_argument("--micro-batch-size", type=int, default=None,
                    help="override the baseline's micro-batch size (default: the task's)")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="per-run step-time statistic; min resists a loaded, shared machine")
    ap.add_argument("--no-verify", action="store_true", help="skip verify_patch (faster)")
    ap.add_argument("--verify-cost", type=Path, metavar="BEFORE_TREE", default=None,
                    help="measure verify_patch seconds per patch, this tree vs BEFORE_TREE")
    args = ap.parse_args()
    if args.verify_cost:
        verify_cost(args.tasks, args.verify_cost)
        return
    rows = []
    for t in args.tasks:
        print(f"== {t}", flush=True)
        rows += bench_task(t, args.rounds, args.micro_batch_size, not args.no_verify, args.stat)
    print(f"\n{'task':10} {'variant':60} {args.stat + ' step':>12} {'speedup':>8} {'range':>14}")
    for task, n, med, sp, lo, hi in rows:
        print(f"{task:10} {n:60} {med * 1e3:9.1f} ms {sp:7.2f}x  [{lo:.2f}, {hi:.2f}]")
    print(f"\nOne rank, {args.rounds} interleaved rounds; per run the {args.stat} measured step; "
          "speedup = median over rounds of baseline / variant (range: min-max over rounds).")


if __name__ == "__main__":
    main()
