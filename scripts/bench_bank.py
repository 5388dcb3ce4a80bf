"""Experience-bank figures: insert/query throughput, nearest latency, bundle size and time,
concurrent writers.

    .venv/bin/python scripts/bench_bank.py [--sizes 10000 100000] [--writers 4]
    scripts/with_postgres.sh .venv/bin/python scripts/bench_bank.py   # adds PostgreSQL writers
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infrarsi.bank import ExperienceBank
from infrarsi.trial import (
    HardwareFingerprint,
    SoftwareVersions,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

ROOT = Path(__file__).resolve().parents[1]
GPUS = [("A100-80GB", 80, 312e12), ("H100-80GB", 80, 989e12), ("L4", 24, 121e12),
        ("A10G", 24, 125e12), ("cpu", 16, 1e12)]


def signatures(n_workloads: int):
    rng = random.Random(0)
    wls = []
    for i in range(n_workloads):
        layers = rng.choice([12, 16, 24, 32, 48])
        hidden = rng.choice([768, 1024, 2048, 4096])
        moe = rng.random() < 0.3
        wls.append(WorkloadSignature("moe" if moe else "dense", 12 * layers * hidden**2, layers,
                                     hidden, hidden // 64, rng.choice([1024, 2048, 4096]),
                                     rng.choice([32, 64, 256]), 8 if moe else 0, 2 if moe else 0,
                                     name=f"w{i}"))
    hws = [HardwareFingerprint(n, gb << 30, 8, nodes, "nvlink", f)
           for n, gb, f in GPUS for nodes in (1, 2)]
    return wls, hws


def record(i: int, w: WorkloadSignature, h: HardwareFingerprint, rng: random.Random) -> TrialRecord:
    cfg = {"micro_batch_size": rng.choice([1, 2, 4, 8]), "activation_checkpointing":
           rng.choice(["none", "selective", "full"]), "compile": rng.choice(["off", "default"]),
           "seed": i}
    if rng.random() < 0.15:
        return TrialRecord(str(i), cfg, TrialStatus.OOM, "simulator", w, h,
                           memory_capacity_bytes=h.memory_bytes, memory_censor_bytes=h.memory_bytes,
                           device_seconds=5.0)
    t = rng.uniform(0.05, 2.0)
    return TrialRecord(str(i), cfg, TrialStatus.OK, "simulator", w, h,
                       step_times_s=tuple(t * rng.uniform(0.98, 1.02) for _ in range(10)),
                       peak_memory_bytes=(rng.randrange(1 << 30, h.memory_bytes),) * 2,
                       memory_capacity_bytes=h.memory_bytes, loss_trace=(10.0, 9.5, 9.1, 8.8),
                       phase_times_s={"forward": t / 3, "backward": t / 2, "optimizer": t / 6},
                       tokens_per_step=w.tokens_per_step, device_seconds=30.0, wall_seconds=4.0)


def fill(bank: ExperienceBank, n: int, n_pairs: int = 1000) -> list[tuple[str, WorkloadSignature, HardwareFingerprint]]:
    """n trials spread over ~n_pairs (workload, hardware) runs; returns the runs."""
    wls, hws = signatures(max(n_pairs // len(hws_count()), 1))
    rng = random.Random(1)
    runs = [(bank.start_run(w.name, "bench", w, h, SoftwareVersions(), {}), w, h)
            for w in wls for h in hws][:n_pairs]
    per = n // len(runs)
    i = 0
    for rid, w, h in runs:
        bank.record_trials(rid, [record(i + j, w, h, rng) for j in range(per)], origin="bench")
        i += per
    return runs


def hws_count():
    return signatures(1)[1]


def timed(fn, repeat: int = 1):
    times = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def bench_size(n: int, tmp: Path, parts: set[str]) -> None:
    url = f"sqlite:///{tmp / f'bench-{n}.sqlite'}"
    bank = ExperienceBank.open(url)
    w, h = signatures(1)[0][0], signatures(1)[1][0]
    rid = bank.start_run("single", "bench", w, h, SoftwareVersions(), {})
    rng = random.Random(2)
    calls = 1000
    recs = [record(10_000_000 + i, w, h, rng) for i in range(calls)]
    _, t_single = timed(lambda: [bank.record_trial(rid, r) for r in recs])
    _, t_fill = timed(lambda: fill(bank, n - calls, n_pairs=min(1000, n // 100)))
    total = bank.count_trials()["total"]
    print(f"[sqlite {n:,}] insert: one trial per transaction {calls / t_single:,.0f} trials/s "
          f"({calls} calls); batched record_trials {(n - calls) / t_fill:,.0f} trials/s; "
          f"rows {total:,}")
    if "query" in parts:
        bench_query(bank, n, rid, w, h, calls)
    if "nearest" in parts:
        bench_nearest(bank, n)
    if "bundle" in parts:
        bench_bundle(bank, n, tmp)
    bank.close()


def bench_query(bank, n, rid, w, h, calls) -> None:
    recs_all, t_all = timed(lambda: bank.trials())
    _, t_run = timed(lambda: bank.trials(rid), repeat=3)
    _, t_cnt = timed(lambda: bank.count_trials(), repeat=3)
    _, t_oom = timed(lambda: bank.trials(workload=w, hardware=h, status="oom"), repeat=3)
    print(f"[sqlite {n:,}] query: all trials {len(recs_all) / t_all:,.0f} records/s "
          f"({t_all:.2f} s); one run ({calls} trials) {t_run * 1e3:.0f} ms; "
          f"count by status {t_cnt * 1e3:.1f} ms; workload+hardware+status filter "
          f"{t_oom * 1e3:.1f} ms")


def bench_nearest(bank, n) -> None:
    wls, hws = signatures(40)
    lat = []
    for q in range(30):
        qw = wls[q % len(wls)]
        t0 = time.perf_counter()
        near = bank.nearest(qw, hws[q % len(hws)], k=20)
        lat.append(time.perf_counter() - t0)
    sig = bank.nearest_signatures(wls[0], k=5)
    print(f"[sqlite {n:,}] nearest(k=20): median {statistics.median(lat) * 1e3:.1f} ms, "
          f"p90 {sorted(lat)[int(len(lat) * 0.9)] * 1e3:.1f} ms over {len(lat)} queries "
          f"({len(near)} trials returned; {sum(s.num_trials for s in sig):,} trials in the 5 "
          f"nearest signatures)")


def bench_bundle(bank, n, tmp) -> None:
    out = tmp / f"bundle-{n}"
    _, t_exp = timed(lambda: bank.export(out))
    size = sum(f.stat().st_size for f in out.iterdir())
    other = ExperienceBank.open(f"sqlite:///{tmp / f'import-{n}.sqlite'}")
    summary, t_imp = timed(lambda: other.import_bundle(out))
    _, t_re = timed(lambda: other.import_bundle(out))
    print(f"[sqlite {n:,}] bundle: export {t_exp:.1f} s, {size / 2**20:.1f} MiB; import "
          f"{t_imp:.1f} s ({summary['trials']['inserted']:,} trials); re-import (no change) "
          f"{t_re:.1f} s")
    other.close()


WRITER = """
import sys
sys.path.insert(0, {root!r})
from scripts.bench_bank import record, signatures
from infrarsi.bank import ExperienceBank
import random
url, wid, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bank = ExperienceBank.open(url, retry_s=120)
w, h = signatures(1)[0][0], signatures(1)[1][0]
rid = bank.start_run("conc", "bench", w, h, __import__("infrarsi.trial", fromlist=["x"]).SoftwareVersions(), {{}}, run_id="conc-run")
rng = random.Random(wid)
for i in range(n):
    bank.record_trial(rid, record(wid * 1_000_000 + i, w, h, rng))
    if i % 10 == 0:
        bank.record_trial(rid, record(-1 - i, w, h, random.Random(i)))  # shared: every writer
"""


def bench_writers(url: str, label: str, writers: int, n: int) -> None:
    ExperienceBank.open(url).close()
    code = WRITER.format(root=str(ROOT))
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code, url, str(k), str(n)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for k in range(writers)]
    errs = [p.communicate()[1] for p in procs]
    dt = time.perf_counter() - t0
    failed = [e[-500:] for p, e in zip(procs, errs, strict=True) if p.returncode]
    bank = ExperienceBank.open(url)
    ids = [r.trial_id for r in bank.trials("conc-run")]
    expected = writers * n + len(range(0, n, 10))
    print(f"[{label}] concurrent writers: {writers} processes x {n} trials (+{len(range(0, n, 10))} "
          f"shared ids written by all): rows written {expected:,}, rows found {len(ids):,}, "
          f"distinct {len(set(ids)):,}, failures {len(failed)}, {expected / dt:,.0f} trials/s "
          f"overall ({dt:.1f} s incl. start-up)")
    for e in failed:
        print(e)
    bank.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--writer-trials", type=int, default=300)
    p.add_argument("--parts", nargs="+", default=["query", "nearest", "bundle", "writers"],
                   choices=["query", "nearest", "bundle", "writers"])
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-bank-"))
    try:
        print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        for n in args.sizes:
            bench_size(n, tmp, set(args.parts))
        if "writers" not in args.parts:
            return
        bench_writers(f"sqlite:///{tmp / 'conc.sqlite'}", "sqlite", args.writers, args.writer_trials)
        pg = os.environ.get("INFRARSI_TEST_POSTGRES_URL")
        if pg:
            bench_writers(pg, "postgresql", args.writers, args.writer_trials)
        else:
            print("[postgresql] skipped: run under scripts/with_postgres.sh for PostgreSQL writers")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
