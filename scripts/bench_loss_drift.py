"""How far an honest config's loss trace drifts from the baseline's, step by step.

Real trials are checked against the contract's loss reference at the precision's tolerance
(``Contract.check_loss``). Issue 34 extends that check from the first K steps to every step the
baseline ran (warm-up, settle and measured). This script measures whether honest configs stay
inside the tolerance over all those steps: the task's baseline at one rank, then each knob
changed alone (and bf16 with the largest micro-batch), all through the harness's own
``train_worker`` in this process. It prints, per config, the worst relative drift over the
first K steps and over every step, next to the contract's tolerance for its precision.

    INFRARSI_DATA_DIR=... python scripts/bench_loss_drift.py [--task configs/tasks/cpu_dense.yaml]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from infrarsi.contract import load_task
from infrarsi.contract.contract import DEFAULT_LOSS_RTOL
from infrarsi.harness import train_worker
from infrarsi.workloads import build_torch_space

ROOT = Path(__file__).resolve().parents[1]
# Knobs that need more than one rank (or a compiler run of minutes) are left out.
SKIP = {"num_workers", "data_parallel", "bucket_cap_mb", "gradient_as_bucket_view",
        "reshard_after_forward", "compile"}


def _variants(space, base: dict) -> list[tuple[str, dict]]:
    out = [("baseline (1 rank)", base)]
    for knob in space.knobs:
        if knob.name in SKIP or knob.name.startswith("patch:"):
            continue
        for v in knob.values:
            if v != base[knob.name]:
                out.append((f"{knob.name}={v}", {**base, knob.name: v}))
    big = max(space.knob("micro_batch_size").values)
    out.append((f"precision=bf16 + micro_batch_size={big}",
                {**base, "precision": "bf16", "micro_batch_size": big}))
    legal = []
    for name, cfg in out:
        try:
            legal.append((name, space.normalize(cfg)))
        except Exception as e:  # noqa: BLE001 - an illegal combination is skipped, and said
            print(f"skip {name}: {e}")
    return legal


def _drift(trace: list[float], ref: list[float], upto: int) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(trace[:upto], ref[:upto], strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default=str(ROOT / "configs" / "tasks" / "cpu_dense.yaml"))
    args = ap.parse_args()
    spec = load_task(args.task)
    space = build_torch_space(spec)
    base = space.normalize({**space.normalize(space.defaults()), "num_workers": 1})
    k = spec.loss_reference.steps
    rows, ref = [], None
    for name, cfg in _variants(space, base):
        t0 = time.perf_counter()
        out = train_worker({"task": spec.to_dict(), "config": cfg,
                            "workspace": str(spec.workspace_path()), "capacity_bytes": None})
        trace = out["loss_trace"]
        ref = ref or trace
        tol = DEFAULT_LOSS_RTOL[cfg["precision"]]
        first, every = _drift(trace, ref, k), _drift(trace, ref, len(ref))
        rows.append((name, len(trace), first, every, tol, time.perf_counter() - t0))
    print(f"\n{spec.name}: loss drift vs the one-rank baseline, first K={k} steps and every step")
    print(f"{'config':44s} {'steps':>5s} {'first K':>9s} {'every':>9s} {'tol':>6s} "
          f"{'every/tol':>9s} {'s':>6s}")
    for name, n, first, every, tol, secs in rows:
        print(f"{name:44s} {n:5d} {first:9.2e} {every:9.2e} {tol:6g} {every / tol:9.3f} "
              f"{secs:6.1f}")
    worst = max(r[3] / r[4] for r in rows)
    print(f"worst every-step drift / tolerance: {worst:.3f} "
          f"({'inside' if worst <= 1 else 'OUTSIDE'} the contract's tolerance)")


if __name__ == "__main__":
    main()
