"""Does a warm process drift? N trials back to back in the same ranks, each phase timed.

Two spawned gloo ranks (no Ray) run the warm pool's per-trial sequence N times in the same
processes (``PoolWorker.run``'s reset, seed, ``run_rank``, module purge) and print, per trial,
how long each phase took on rank 0: model build, the meter's read of the build, the warm-up
steps, the median
measured step, and the wall from the trial's start to its first measured step. A process whose
later trials measure slower steps than its first carries something across trials.

    .venv/bin/python scripts/bench_warm_drift.py [--task cpu_dense] [--pairs 5]
        [--variant pool|no-meter|no-timer]

``--variant`` switches off one suspect to see whether the drift goes with it (diagnosis only:
``no-meter`` skips the CPU memory meter (build and metered step), ``no-timer`` the outside step timer).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _phase_timers(times: dict[str, float]) -> None:
    """Wrap the harness's phase boundaries with timestamps (this process only)."""
    from infrarsi.harness import train

    orig_build, orig_stop = train._Run.build, train.CpuMemoryMeter.pause
    orig_mark = train.StepClock.mark

    def build(self, entry):
        times["build0"] = time.perf_counter()
        out = orig_build(self, entry)
        times["build1"] = time.perf_counter()
        return out

    def stop(self):
        times["stop0"] = time.perf_counter()
        out = orig_stop(self)
        times["warm1"] = time.perf_counter()
        return out

    def mark(self):
        out = orig_mark(self)
        if "mark0" not in times:
            times["mark0"], times["cpu0"] = time.perf_counter(), time.process_time()
        return out

    train._Run.build, train.CpuMemoryMeter.pause, train.StepClock.mark = build, stop, mark


def _variant(name: str) -> None:
    from infrarsi.harness import clock, train

    if name == "no-meter":
        class NoMeter:
            def __init__(self):
                pass

            def start(self):
                pass

            def pause(self):
                return 0

            def step(self, index, held_bytes=0):
                from contextlib import nullcontext
                return nullcontext()

            def peak_bytes(self):
                return 0

            def close(self):
                pass

        train.CpuMemoryMeter = NoMeter
    elif name == "no-timer":
        orig = clock.StepClock.__init__

        def init(self, device, guard=None, outside=True):
            orig(self, device, guard, outside=False)

        train.StepClock.__init__ = init


def _trial(payload: dict, flags: dict, times: dict) -> dict | None:
    """The warm pool's per-trial sequence (``PoolWorker.run``), each phase timed."""
    from infrarsi.backends.ray_train import _pool
    from infrarsi.backends.ray_train._runner import run_rank
    from infrarsi.harness import train

    times.clear()
    t0 = time.perf_counter()
    _pool._reset_between_trials(flags)
    _pool._seed(int(payload["task"]["loss_reference"]["seed"]))
    path_before = list(sys.path)
    holder: dict[str, str] = {}
    cpu: dict[str, float] = {}
    orig = train.StepClock.durations

    def durations(self):  # CPU seconds of this process over the measured steps
        cpu.setdefault("per_step", (time.process_time() - times["cpu0"]) / max(len(self.marks) - 1, 1))
        return orig(self)

    train.StepClock.durations = durations
    try:
        out = run_rank(payload, on_workspace=lambda ws: holder.setdefault("ws", ws))
    finally:
        train.StepClock.durations = orig
    _pool._purge_workspace(holder["ws"], path_before)
    _pool._reset_between_trials(flags)
    if out is None:
        return None
    return {"start": times["build0"] - t0, "build": times["build1"] - times["build0"],
            "meter_stop": times.get("warm1", 0.0) - times.get("stop0", 0.0),
            "warmup": times["mark0"] - times.get("warm1", times["build1"]),
            "to_first": times["mark0"] - t0, "wall": time.perf_counter() - t0,
            "step": statistics.median(out["step_times_s"]), "cpu_step": cpu.get("per_step", 0.0)}


def _rank(rank: int, world: int, port: int, payload: dict, variant: str, inbox, outbox) -> None:
    """One rank: runs a trial per message on ``inbox`` until None; rank 0 answers on ``outbox``."""
    import torch.distributed as dist

    from infrarsi.backends.ray_train import _pool

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    _variant(variant)
    times: dict[str, float] = {}
    _phase_timers(times)
    flags = _pool._torch_globals()
    while inbox.get() is not None:
        row = _trial(payload, flags, times)
        if rank == 0:
            outbox.put(row)
    dist.destroy_process_group()


class _Ranks:
    """``world`` spawned gloo ranks that run one trial per :meth:`trial` call."""

    def __init__(self, ctx, world: int, payload: dict, variant: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.inboxes = [ctx.SimpleQueue() for _ in range(world)]
        self.outbox = ctx.SimpleQueue()
        self.procs = [ctx.Process(target=_rank, args=(r, world, port, payload, variant,
                                                      self.inboxes[r], self.outbox))
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def trial(self) -> dict:
        for q in self.inboxes:
            q.put(1)
        return self.outbox.get()

    def close(self) -> None:
        for q in self.inboxes:
            q.put(None)
        for p in self.procs:
            p.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="cpu_dense")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--variant", default="pool", choices=("pool", "no-meter", "no-timer"))
    args = ap.parse_args(argv)

    import math

    import torch.multiprocessing as mp

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.contract import load_task

    backend = RayTrainBackend(load_task(ROOT / "configs" / "tasks" / f"{args.task}.yaml"),
                              local_mode=True)
    config = backend.baseline_config()
    payload = backend.payload(config)
    ctx = mp.get_context("spawn")
    world = int(config["num_workers"])
    warm = _Ranks(ctx, world, payload, args.variant)
    rows: list[tuple[str, dict]] = [("warm0", warm.trial())]
    for i in range(args.pairs):
        for kind in (("fresh", "warm") if i % 2 == 0 else ("warm", "fresh")):
            if kind == "warm":
                rows.append(("warm", warm.trial()))
            else:
                fresh = _Ranks(ctx, world, payload, args.variant)
                rows.append(("fresh", fresh.trial()))
                fresh.close()
    warm.close()
    print(f"{args.task}, variant {args.variant}: warm = the same {world} ranks every trial, "
          f"fresh = new ranks per trial; pairs interleaved F W, W F, ...")
    print(f"  {'trial':>5} {'kind':>5} {'start':>7} {'build':>7} {'meter':>6} {'warm-up':>8} "
          f"{'to 1st step':>11} {'step':>8} {'cpu/step':>8} {'wall':>7}")
    for i, (kind, r) in enumerate(rows):
        print(f"  {i:>5} {kind:>5} {r['start']:6.2f}s {r['build']:6.2f}s {r['meter_stop']:5.2f}s "
              f"{r['warmup']:7.2f}s {r['to_first']:10.2f}s {r['step'] * 1e3:6.0f}ms {r['cpu_step'] * 1e3:6.0f}ms "
              f"{r['wall']:6.2f}s")
    fresh_rows = [r for k, r in rows if k == "fresh"]
    warm_rows = [r for k, r in rows if k == "warm"]
    for key, label in (("step", "step time"), ("cpu_step", "CPU time per step")):
        logs = [math.log(w[key] / f[key]) for f, w in zip(fresh_rows, warm_rows, strict=True)]
        print(f"  warm/fresh {label}: geometric mean {math.exp(statistics.fmean(logs)):.3f}, "
              f"pairs {[round(math.exp(x), 2) for x in logs]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
