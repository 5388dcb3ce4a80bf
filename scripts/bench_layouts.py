"""Parallel layouts on 2 local gloo ranks: step time, peak memory and loss against data parallel.

Runs the harness's ``train_worker`` on 2 spawned ranks (no Ray) for each layout of a task
(default cpu_dense) and prints, side by side with the DDP baseline (``num_workers=2``): the median
measured step, its ratio to the baseline, rank 0's peak memory and the largest relative loss
difference over the trace (the contract's check, fp32 tolerance 2e-3).

    python scripts/bench_layouts.py [--task configs/tasks/cpu_dense.yaml] [--micro-batch 1]

On a 2-core CPU tensor and pipeline parallelism only add communication to a model that fits one
rank; the figures say what each layout costs here, not what it gains on GPUs.
"""

from __future__ import annotations

import argparse
import statistics

from infrarsi.contract import load_task
from infrarsi.harness._local import run_local
from infrarsi.workloads import build_torch_space

LAYOUTS = [
    ("dp2 (ddp)", {}),
    ("tp2", {"tensor_parallel_degree": 2}),
    ("tp2+sp", {"tensor_parallel_degree": 2, "sequence_parallel": True}),
    ("pp2 gpipe", {"pipeline_parallel_degree": 2, "pipeline_schedule": "gpipe"}),
    ("pp2 1f1b", {"pipeline_parallel_degree": 2, "pipeline_schedule": "1f1b"}),
    ("pp2 interleaved", {"pipeline_parallel_degree": 2, "pipeline_schedule": "interleaved_1f1b"}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="configs/tasks/cpu_dense.yaml")
    ap.add_argument("--micro-batch", type=int, default=1)
    args = ap.parse_args()
    spec = load_task(args.task)
    space = build_torch_space(spec)
    base = {**space.defaults(), **spec.search.baseline, "num_workers": 2,
            "micro_batch_size": args.micro_batch}
    ref = None
    print(f"{'layout':<17} {'step ms':>9} {'vs dp2':>7} {'peak MiB':>9} {'max loss rel diff':>18}")
    for name, knobs in LAYOUTS:
        config = space.normalize({**base, **knobs})
        out = run_local({"task": spec.to_dict(), "config": config,
                         "workspace": str(spec.workspace_path()), "capacity_bytes": None}, 2)
        if not isinstance(out[0], dict):
            print(f"{name:<17} failed: {out[0]!r}")
            continue
        step = statistics.median(out[0]["step_times_s"])
        trace = out[0]["loss_trace"]
        ref = ref or (step, trace)
        diff = max(abs(a - b) / abs(b) for a, b in zip(trace, ref[1], strict=True))
        print(f"{name:<17} {step * 1e3:9.1f} {ref[0] / step:6.2f}x "
              f"{out[0]['peak_memory_bytes'] / 2**20:9.1f} {diff:18.2e}")


if __name__ == "__main__":
    main()
