"""Per-trial overhead against step time, for real Ray Train trials of the reference workloads.

Each trial is a real ``TorchTrainer`` job with the task's workers (gloo on CPU, nccl on GPU),
run back to back on one local Ray instance, like the search runs them. For each it prints:
submit -> first measured step (the overhead: worker start, process group, model build,
warm-up and compile), the median measured step, overhead in steps, and the whole trial's
wall time. The first trial of a fresh Ray instance pays process start-up that later trials
reuse less of, so it is shown separately from the median of the rest.

    .venv/bin/python scripts/bench_trial.py [--tasks cpu_dense,cpu_moe] [--repeats 3]
        [--set compile=default --set micro_batch_size=2] [--early-stop]

``--early-stop`` runs each trial twice, interleaved: to its end, and told it is clearly slow
(a 1 us hint: it stops after the harness's check), and prints the wall time the stop saves.

``--pool`` compares fresh trials (a new ``TorchTrainer`` job each: ``fresh_processes=True``)
with warm ones (the worker pool, ``infrarsi run``'s default), interleaved in pairs whose order
alternates (F W, W F, ...) after one untimed trial that starts the warm group. It prints each
kind's median overhead (submit -> first measured step), median trial wall, the overhead's share
of the wall, trials per hour (3600 / median wall) and their ratio, and the A/A check: the
warm/fresh ratio of the pairs' median step times, with a 95% t-interval of its log. A fresh
trial runs as in a ``--fresh-processes`` run, with no pool beside it: the idle warm group is
retired first (an idle Ray worker process still takes a few ms of CPU a second), and a warm trial
after it is preceded by one untimed trial that starts its group, so every timed warm trial runs
on a group that ran a trial before. Trials run at the driver's CPU priority
(as a run's do) and after ``--gap`` seconds of rest (default 5), so a warm trial never times its
steps while the previous fresh job's processes exit. ``--phases`` adds where each kind's wall
goes on rank 0 (submit -> rank 0 runs, workspace files, timer + entry import, model build, the
memory meter's read of the build, the warm-up steps, the measured steps, then off the clock the
metered step and the reply): what is start-up and what is the contract's own warm-up.
``--new-group`` adds a third arm: a trial on a pool group started for it (the idle groups are
retired before the rest), i.e. fresh processes without Ray Train's per-job actors (controller,
synchronization actor, placement-group cleaner). Warm vs new group isolates what reusing a group
does to a step; new group vs fresh what Ray Train's own processes do to it on this machine.
``--cpu-times`` also prints, per trial, the CPU every other process on the node took during the
measured steps (their threads' scheduler run times; the trial's ranks excluded), with the three
that took most: on a machine the ranks fill, that CPU is what the ranks waited for. It scans /proc
just before the first measured step, so it adds to a trial's measured overhead: time overhead
without it.

Peak memory against micro-batch size: ``scripts/bench_memory.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parse_set(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="cpu_dense,cpu_moe")
    ap.add_argument("--repeats", type=int, default=3, help="trials per task (>= 2)")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                    help="a knob for every trial (repeatable; default: the baseline)")
    ap.add_argument("--early-stop", action="store_true",
                    help="also run each trial with a stop hint it cannot meet; compare walls")
    ap.add_argument("--pool", action="store_true",
                    help="fresh vs warm (pooled) trials, interleaved pairs; overhead and A/A")
    ap.add_argument("--phases", action="store_true",
                    help="with --pool: where each trial's time goes on rank 0 (submit -> worker, "
                         "workspace, import, model build, meter read, warm-up steps, measured "
                         "steps, metered step, reply); a setup hook in every worker")
    ap.add_argument("--gap", type=float, default=5.0, metavar="S",
                    help="with --pool: seconds of rest before each timed trial, so no trial "
                         "shares the CPUs with the last one's teardown (a fresh job's ~8 Ray "
                         "processes exit after it returns)")
    ap.add_argument("--new-group", action="store_true",
                    help="with --pool: a third arm, each trial on a pool group started for it "
                         "(fresh processes without Ray Train's per-job actors)")
    ap.add_argument("--cpu-times", action="store_true",
                    help="with --pool: also each trial's CPU seconds per measured step on rank 0 "
                         "and the seconds its training thread waited for a CPU (more work, or more waiting?); "
                         "a setup hook in every worker")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.pool:
        return compare_pool(args)

    import ray

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.backends.ray_train._priority import with_trial_priority
    from infrarsi.contract import load_task

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", runtime_env=with_trial_priority())
    rows, stops = [], []
    try:
        for name in args.tasks.split(","):
            spec = load_task(ROOT / "configs" / "tasks" / f"{name}.yaml")
            backend = RayTrainBackend(spec)
            config = {**backend.baseline_config(), **_parse_set(args.set)}
            for i in range(args.repeats):
                rec = backend.execute(config)
                step = statistics.median(rec.step_times_s) if rec.step_times_s else float("nan")
                rows.append((name, i, rec.status.value, rec.startup_seconds, step,
                             rec.wall_seconds))
                print(f"  {name} #{i}: {rec.summary()}", flush=True)
                if args.early_stop:
                    short = backend.execute(config, stop_slower_than_s=1e-6)
                    stops.append((name, rec.wall_seconds, short.wall_seconds,
                                  len(rec.step_times_s), len(short.step_times_s)))
                    print(f"  {name} #{i} told to stop: {short.summary()}", flush=True)
            backend.close()
    finally:
        ray.shutdown()

    print("\nper-trial overhead (submit -> first measured step) against step time")
    print(f"  {'task':10} {'trial':>5} {'status':>7} {'overhead':>9} {'step':>9} "
          f"{'overhead/step':>13} {'trial wall':>10}")
    for name, i, status, startup, step, wall in rows:
        over = f"{startup:8.1f}s" if startup is not None else "        -"
        ratio = f"{startup / step:12.0f}x" if startup and step == step else "            -"
        print(f"  {name:10} {i:>5} {status:>7} {over} {step * 1e3:7.1f}ms {ratio} {wall:9.1f}s")
    for name in args.tasks.split(","):
        later = [r for r in rows if r[0] == name and r[1] > 0 and r[3] is not None]
        if later:
            over = statistics.median(r[3] for r in later)
            step = statistics.median(r[4] for r in later)
            print(f"  {name}: after the first trial, median overhead {over:.1f}s = "
                  f"{over / step:.0f} steps of {step * 1e3:.1f} ms")
    for name in args.tasks.split(","):
        pairs = [r for r in stops if r[0] == name]
        if pairs:
            full = statistics.median(r[1] for r in pairs)
            short = statistics.median(r[2] for r in pairs)
            print(f"  {name}: early stop after {pairs[0][4]} of {pairs[0][3]} measured steps: "
                  f"median wall {short:.1f}s vs {full:.1f}s to the end "
                  f"(saves {1 - short / full:.0%} of a trial)")
    return 0


def compare_pool(args) -> int:
    import math

    import ray

    from infrarsi.backends.ray_train import RayTrainBackend, _pool
    from infrarsi.backends.ray_train._pool import shutdown_process_pool
    from infrarsi.backends.ray_train._priority import with_trial_priority
    from infrarsi.contract import load_task

    cpu_log = phase_log = None
    hooks = []
    if args.cpu_times or args.phases:
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="infrarsi-bench-"))
        if args.cpu_times:
            cpu_log = folder / "steps.jsonl"
            hooks.append(_cpu_time_hook(str(cpu_log)))
        if args.phases:
            phase_log = folder / "phases.jsonl"
            hooks.append(_phase_hook(str(phase_log)))
    runtime_env = {"worker_process_setup_hook": _hooks(hooks),
                   "env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}} if hooks else {}
    # Trials at the driver's priority, as every run's trials (Ray's default niceness 15 would
    # time how much CPU other users' processes leave, not the trial).
    ray.init(num_cpus=2 * (os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", runtime_env=with_trial_priority(runtime_env))
    out: dict[str, dict[str, list]] = {}
    try:
        for name in args.tasks.split(","):
            spec = load_task(ROOT / "configs" / "tasks" / f"{name}.yaml")
            kinds = {"fresh": RayTrainBackend(spec, fresh_processes=True),
                     "warm": RayTrainBackend(spec)}
            if args.new_group:
                kinds["new group"] = kinds["warm"]
            config = {**kinds["warm"].baseline_config(), **_parse_set(args.set)}
            first = kinds["warm"].execute(config)
            print(f"  {name} warm group start (untimed): {first.summary()}", flush=True)
            rows = out[name] = {k: [] for k in kinds}
            arms = list(kinds)
            for i in range(args.repeats):
                # Each arm takes each place in the order equally often (rotated, and reversed
                # on every other cycle of rotations): no arm always follows the same one.
                order = arms[i % len(arms):] + arms[:i % len(arms)]
                if (i // len(arms)) % 2:
                    order.reverse()
                for kind in order:
                    if kind == "new group":  # its processes start for this trial
                        ray.get(_pool.existing_process_pool().retire_idle.remote())
                    elif kind == "fresh":  # as in a --fresh-processes run: no pool beside it
                        ray.get(_pool.existing_process_pool().retire_idle.remote())
                    elif kind == "warm" and not ray.get(_pool.existing_process_pool().workers.remote()):
                        kinds["warm"].execute(config)  # untimed: the group's first trial
                    time.sleep(args.gap)  # the previous trial's processes have exited
                    rec = kinds[kind].execute(config)
                    cpu = _last_cpu(cpu_log)
                    if phase_log is not None:
                        rec.extra["phases"] = _phases(_last_cpu(phase_log), rec)
                    if cpu is not None:
                        rec.extra["cpu_per_step_s"], rec.extra["wait_per_step_s"] = cpu[0], cpu[4]
                        rec.extra["thread_cpu_per_step_s"] = cpu[7]
                        rec.extra["others_cpu_per_step_s"] = cpu[9]
                    print(f"  {name} round {i} {kind:9}: {rec.summary()}"
                          + (f" | rank 0 over the measured steps: cpu/step {cpu[0] * 1e3:.0f} ms "
                             f"(training thread {cpu[7] * 1e3:.0f} ms), "
                             f"gc {cpu[1] * 1e3:.0f} ms ({cpu[2]} full), {cpu[3]} objects, "
                             f"waited for a CPU {cpu[4] * 1e3:.0f} ms/step; process: "
                             f"{cpu[5]:.0f} page faults/step (training thread {cpu[8]:.0f}), "
                             f"system CPU {cpu[6] * 1e3:.0f} ms/step; other processes "
                             f"{cpu[9] * 1e3:.0f} ms/step (most: "
                             + ", ".join(f"{c} {cmd}" for c, cmd in cpu[10]) + ")"
                             if cpu is not None else ""), flush=True)
                    rows[kind].append(rec)
            shutdown_process_pool()
    finally:
        ray.shutdown()

    med = statistics.median
    print("\nfresh vs warm trials (interleaved rounds; medians)")
    print(f"  {'task':10} {'kind':9} {'overhead':>9} {'wall':>7} {'overhead/wall':>13} "
          f"{'step':>9} {'trials/h':>8}")
    for name, rows in out.items():
        summary = {}
        for kind, recs in rows.items():
            ok = [r for r in recs if r.ok and r.startup_seconds is not None]
            if not ok:
                print(f"  {name:10} {kind:9} no trial ran ok")
                continue
            over, wall = med(r.startup_seconds for r in ok), med(r.wall_seconds for r in ok)
            step = med(r.step_time_s for r in ok)
            summary[kind] = (over, wall)
            print(f"  {name:10} {kind:9} {over:8.1f}s {wall:6.1f}s {over / wall:12.0%} "
                  f"{step * 1e3:7.1f}ms {3600 / wall:8.0f}")
        if "fresh" in summary and "warm" in summary:
            print(f"  {name}: warm trials/hour = {summary['fresh'][1] / summary['warm'][1]:.2f}x "
                  f"fresh; warm overhead = {summary['warm'][0] / summary['warm'][1]:.1%} of its "
                  f"wall (fresh {summary['fresh'][0] / summary['fresh'][1]:.1%})")
        for a, b in (("warm", "fresh"), ("warm", "new group"), ("new group", "fresh")):
            if a in rows and b in rows:
                _print_ratio(name, a, b, rows[a], rows[b])
        _print_phases(name, rows)
        cpu, thread = ([w.extra[k] / f.extra[k] for f, w in zip(rows["fresh"], rows["warm"], strict=True)
                        if k in f.extra and k in w.extra]
                       for k in ("cpu_per_step_s", "thread_cpu_per_step_s"))
        waits = {k: [r.extra["wait_per_step_s"] for r in recs if "wait_per_step_s" in r.extra]
                 for k, recs in rows.items()}
        if all(waits.values()):
            print(f"  {name}: rank 0's training thread waited for a CPU, median per measured "
                  "step: " + ", ".join(f"{k} {med(v) * 1e3:.0f} ms" for k, v in waits.items()))
        others = {k: [r.extra["others_cpu_per_step_s"] for r in recs if "others_cpu_per_step_s" in r.extra]
                  for k, recs in rows.items()}
        if all(others.values()):
            print(f"  {name}: CPU of every other process on the node (not the trial's ranks), median "
                  "per measured step: " + ", ".join(f"{k} {med(v) * 1e3:.0f} ms" for k, v in others.items()))
        for label, ratios in (("process", cpu), ("training thread", thread)):
            if ratios:
                print(f"  {name}: warm/fresh CPU seconds per measured step (rank 0, {label}): "
                      f"geometric mean {math.exp(statistics.fmean(math.log(x) for x in ratios)):.3f}"
                      f", pairs {[round(x, 2) for x in ratios]}")
    return 0


def _print_ratio(name: str, a: str, b: str, rows_a: list, rows_b: list) -> None:
    """The A/A check of arm ``a`` against arm ``b``: the geometric mean of the rounds' step-time
    ratios a/b with the 95% t-interval the verification uses (a round is one trial of each arm,
    back to back)."""
    from infrarsi.stats import paired_speedup

    ok = [(x.step_time_s, y.step_time_s) for x, y in zip(rows_a, rows_b, strict=True)
          if x.ok and y.ok]
    if len(ok) < 2:
        return
    # paired_speedup(first, second) is exp(mean log(first / second)): here a's time over b's.
    ratio, lo, hi = paired_speedup([t for t, _ in ok], [t for _, t in ok])
    print(f"  {name}: A/A {a}/{b} step time {ratio:.3f} "
          f"(95% CI {lo:.3f}-{hi:.3f}, {len(ok)} rounds): "
          f"{'includes 1 (no bias seen)' if lo <= 1 <= hi else 'EXCLUDES 1'}")


def _cpu_time_hook(path: str):
    """A worker setup hook: rank 0's process CPU seconds per measured step, one line per trial
    appended to ``path`` (diagnosis: a slower step that costs no more CPU was waiting)."""

    def hook() -> None:
        import gc
        import json
        import resource
        import time

        import torch.distributed as dist

        from infrarsi.harness import clock

        mark, close = clock.StepClock.mark, clock.StepClock.close

        def _runqueue_wait() -> float:
            """Seconds the calling (training) thread waited for a CPU (schedstat), 0 if unknown."""
            try:
                with open("/proc/thread-self/schedstat") as f:
                    return int(f.read().split()[1]) / 1e9
            except OSError:
                return 0.0

        gc_log: list[tuple[float, int, str]] = []  # (perf_counter, generation, start|stop)
        gc.callbacks.append(lambda phase, info: gc_log.append(
            (time.perf_counter(), info["generation"], phase)))

        def _thread_faults() -> int:
            """Minor page faults of the calling (training) thread (/proc stat field 10)."""
            try:
                with open("/proc/thread-self/stat") as f:
                    return int(f.read().rsplit(")", 1)[1].split()[7])
            except (OSError, IndexError, ValueError):
                return 0

        _RANKS = ("ray::RayTrainWorker", "ray::PoolWorker.run")  # a busy rank's process title

        def _others() -> dict[int, tuple[str, float]]:
            """CPU seconds of every other process on this node, by pid (who shares the CPUs):
            the sum of its threads' scheduler run times (ns, not clock ticks)."""
            import os

            me, out = os.getpid(), {}
            for d in os.listdir("/proc"):
                if not d.isdigit() or int(d) == me:
                    continue
                try:
                    run = 0
                    for t in os.listdir(f"/proc/{d}/task"):
                        with open(f"/proc/{d}/task/{t}/schedstat") as f:
                            run += int(f.read().split()[0])
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                    if not cmd:
                        with open(f"/proc/{d}/comm") as f:
                            cmd = f.read().strip()
                except (OSError, ValueError, IndexError):
                    continue
                out[int(d)] = (cmd[:60], run / 1e9)
            return out

        def timed_mark(self):
            if not self.__dict__.get("_cpu"):  # before the clock starts: off the measured steps
                self.__dict__["_others0"] = _others()
            out = mark(self)
            self.__dict__.setdefault("_tfaults", []).append(_thread_faults())
            use = resource.getrusage(resource.RUSAGE_SELF)
            self.__dict__.setdefault("_faults", []).append((use.ru_minflt, use.ru_stime))
            self.__dict__.setdefault("_cpu", []).append(time.process_time())
            self.__dict__.setdefault("_thread", []).append(time.thread_time())
            self.__dict__.setdefault("_wait", []).append(_runqueue_wait())
            return out

        def timed_close(self):
            cpus = self.__dict__.get("_cpu", [])
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            if len(cpus) > 1 and rank == 0:
                lo, hi = self.marks[0], self.marks[-1]
                spans = [(t, g) for t, g, p in gc_log if lo <= t <= hi]
                gen2 = sum(1 for _, g in spans if g == 2) // 2
                gc_s = sum(b[0] - a[0] for a, b in zip(spans[::2], spans[1::2], strict=False))
                with open(path, "a") as f:
                    waits, faults = self.__dict__.get("_wait", []), self.__dict__.get("_faults", [])
                    n = len(cpus) - 1
                    thread = self.__dict__.get("_thread", [])
                    tfaults = self.__dict__.get("_tfaults", [0])
                    before, after = self.__dict__.get("_others0", {}), _others()
                    # The trial's other ranks are busy by design; everything else that ran
                    # took CPU the ranks could have used (a box the ranks fill).
                    others = sorted(((after[p][1] - c, cmd.strip()) for p, (cmd, c) in before.items()
                                     if p in after and not cmd.startswith(_RANKS)), reverse=True)
                    f.write(json.dumps([(cpus[-1] - cpus[0]) / n, gc_s, gen2,
                                        len(gc.get_objects()), (waits[-1] - waits[0]) / n,
                                        (faults[-1][0] - faults[0][0]) / n,
                                        (faults[-1][1] - faults[0][1]) / n,
                                        (thread[-1] - thread[0]) / n,
                                        (tfaults[-1] - tfaults[0]) / n,
                                        sum(c for c, _ in others) / n,
                                        [(round(c / n * 1e3, 1), cmd[:40]) for c, cmd in others[:3]]])
                            + "\n")
            gc_log.clear()
            return close(self)

        clock.StepClock.mark, clock.StepClock.close = timed_mark, timed_close

    return hook


def _hooks(hooks: list):
    def hook() -> None:
        for h in hooks:
            h()

    return hook


# (label, from, to): the phases of one trial on rank 0, between the hook's wall-clock stamps
# (``submit`` and ``end`` are the driver's; the rest rank 0's, in the order they happen).
_PHASES = (("submit -> rank 0 runs", "submit", "run"), ("workspace files", "run", "ws"),
           ("timer + import entry", "ws", "build0"), ("model build", "build0", "build1"),
           ("meter read (build)", "build1", "pause1"), ("warm-up steps", "pause1", "first"),
           ("measured steps", "first", "last"), ("metered step", "last", "metered"),
           ("to the reply", "metered", "end"))


def _phase_hook(path: str):
    """A worker setup hook: rank 0's wall-clock stamps of one trial's phases, one JSON line per
    trial appended to ``path`` (``--phases``)."""

    def hook() -> None:
        import json
        import time

        import torch.distributed as dist

        from infrarsi.backends.ray_train import _runner
        from infrarsi.harness import train

        stamps: dict[str, float] = {}

        def wrap(owner, attr, before=None, after=None):
            orig = getattr(owner, attr)

            def wrapper(*a, **k):
                if before:
                    stamps.setdefault(before, time.time())
                out = orig(*a, **k)
                if after:
                    stamps[after] = time.time()
                return out

            setattr(owner, attr, wrapper)

        run_rank = _runner.run_rank

        def timed_run_rank(payload, on_workspace=None):
            stamps.clear()
            stamps["run"] = time.time()
            out = run_rank(payload, on_workspace)
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            if rank == 0:
                with open(path, "a") as f:
                    f.write(json.dumps(stamps) + "\n")
            return out

        _runner.run_rank = timed_run_rank
        wrap(_runner, "_materialize", after="ws")
        wrap(train._Run, "build", "build0", "build1")
        wrap(train.CpuMemoryMeter, "pause", after="pause1")
        wrap(train.CpuMemoryMeter, "peak_bytes", after="metered")
        mark = train.StepClock.mark

        def timed_mark(self):
            out = mark(self)
            stamps.setdefault("first", time.time())
            stamps["last"] = time.time()
            return out

        train.StepClock.mark = timed_mark

    return hook


def _phases(stamps: list | dict | None, rec) -> dict[str, float] | None:
    """Seconds per phase of ``_PHASES`` (the driver's submit/end from the record)."""
    if not stamps or rec.startup_seconds is None:
        return None
    t = dict(stamps)
    t["submit"] = t["first"] - rec.startup_seconds
    t["end"] = t["submit"] + rec.wall_seconds
    return {label: t[b] - t[a] for label, a, b in _PHASES if a in t and b in t}


def _print_phases(name: str, rows: dict[str, list]) -> None:
    kinds = {k: [r.extra["phases"] for r in recs if r.extra.get("phases")] for k, recs in rows.items()}
    if not all(kinds.values()):
        return
    print(f"  {name}: where a trial's wall goes (median seconds, rank 0)")
    print(f"    {'phase':22} " + " ".join(f"{k:>7}" for k in kinds))
    for label, _, _ in _PHASES:
        vals = [statistics.median(p.get(label, 0.0) for p in ps) for ps in kinds.values()]
        print(f"    {label:22} " + " ".join(f"{v:6.2f}s" for v in vals))


def _last_cpu(path: Path | None) -> list | None:
    if path is None or not path.exists():
        return None
    lines = path.read_text().splitlines()
    return json.loads(lines[-1]) if lines else None


if __name__ == "__main__":
    sys.exit(main())
