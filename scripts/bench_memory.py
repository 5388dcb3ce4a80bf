"""Peak memory per worker against micro_batch_size for the CPU reference workloads.

Runs the harness in-process (one rank, no Ray) with the emulated capacity switched off, so every
row is a measured peak, and prints a table per workload: micro_batch_size x
activation_checkpointing, with whether the peak exceeds the task's emulated capacity.

    .venv/bin/python scripts/bench_memory.py [--tasks cpu_dense,cpu_moe] [--ac none,selective,full]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from infrarsi.contract import load_task
from infrarsi.contract.spec import TaskSpec
from infrarsi.harness import train_worker
from infrarsi.workloads import build_torch_space

ROOT = Path(__file__).resolve().parents[1]


def measure(spec: TaskSpec, **knobs) -> tuple[int, float]:
    space = build_torch_space(spec)
    config = space.normalize({**space.defaults(), "num_workers": 1, **knobs})
    data = spec.to_dict()
    # Memory is profiled in warm-up steps; a short run is enough for the table.
    data["timing"] = {"warmup_steps": 1, "measured_steps": 2}
    data["loss_reference"] = {**data["loss_reference"], "steps": 1}
    r = train_worker({"task": data, "config": config,
                      "workspace": str(spec.workspace_path()), "capacity_bytes": None})
    return r["peak_memory_bytes"], min(r["step_times_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="cpu_dense,cpu_moe")
    ap.add_argument("--ac", default="none,selective,full", help="activation_checkpointing values")
    ap.add_argument("--precision", default="fp32")
    args = ap.parse_args()
    for name in args.tasks.split(","):
        spec = load_task(ROOT / "configs" / "tasks" / f"{name}.yaml")
        cap = int(spec.hardware.memory_capacity_gib * 2**30)
        gbs = spec.workload.global_batch_size
        acs = args.ac.split(",")
        print(f"\n{name}: seq_len {spec.workload.seq_len}, global batch {gbs}, "
              f"precision {args.precision}, emulated capacity {cap / 2**20:.0f} MiB/worker "
              "(peak MiB per rank, 1 rank in-process; '*' = exceeds capacity -> oom)")
        print(f"{'micro_batch_size':>16} " + " ".join(f"{ac:>14}" for ac in acs) + "   step_s(none)")
        for mbs in [m for m in (1, 2, 4, 8, 16, 32) if gbs % m == 0]:
            cells, step = [], float("nan")
            for ac in acs:
                peak, best = measure(spec, micro_batch_size=mbs, activation_checkpointing=ac,
                                     precision=args.precision)
                step = best if ac == acs[0] else step
                mark = "*" if peak > cap else " "
                cells.append(f"{peak / 2**20:>12.1f}{mark} ")
            print(f"{mbs:>16} " + " ".join(cells) + f"   {step:.3f}")


if __name__ == "__main__":
    main()
