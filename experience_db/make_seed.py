"""Build infrarsi/bank/seed/ (a bank bundle shipped in the package) from the Ultra-Scale
Playbook measurements.

    INFRARSI_DATA_DIR=/path/to/data .venv/bin/python experience_db/make_seed.py
    .venv/bin/python experience_db/make_seed.py --csv /path/to/ultrascale_playbook_benchmarks.csv

The CSV (Apache-2.0, see experience_db/README.md) is read, never copied. What is kept, per
workload (model, nodes): the 5 fastest distinct configs that ran (tokens/s per GPU), and at
each (tp, pp, zero) layout the first micro-batch size above the largest that ran when it
crashed ("crashed_or_oom": an OOM boundary), as trials and as findings. Workloads where every
config crashed keep their 3 smallest-memory configs as crashed trials. Signatures and hardware
are built exactly as infrarsi/configs/tables/ultrascale.yaml builds them, so the table backend's
workloads find this experience by exact key.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import yaml

from infrarsi._home import data_dir
from infrarsi.bank import ExperienceBank
from infrarsi.bench._sources import DEFAULT_TABLE_SPEC
from infrarsi.space import config_key
from infrarsi.trial import (
    HardwareFingerprint,
    SoftwareVersions,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the bundle is written into its package
CSV_NAME = "ultrascale_playbook_benchmarks.csv"
ORIGIN = "seed:ultrascale-playbook"
SOURCE = ("Hugging Face Ultra-Scale Playbook benchmark (nanotron), Apache-2.0; "
          "ultrascale_playbook_benchmarks.csv")
KNOBS = {"data_parallel_degree": "dp", "tensor_parallel_degree": "tp",
         "pipeline_parallel_degree": "pp", "micro_batch_size": "mbs",
         "gradient_accumulation_steps": "grad_acc", "zero_stage": "zero"}
TOP_OK, TOP_ALL_CRASHED = 5, 3


def _signatures(spec: dict, model: str, nodes: int):
    w = dict(spec["signature"]["common"]) | spec["signature"]["lookup"]["model"][model]
    h = dict(spec["hardware"]["common"]) | {"num_nodes": nodes}
    return WorkloadSignature.from_dict(w), HardwareFingerprint.from_dict(h)


def _record(row: dict, line: int, w: WorkloadSignature, h: HardwareFingerprint) -> TrialRecord:
    config = {k: int(row[c]) for k, c in KNOBS.items()}
    tid = f"csv-line-{line}"
    common = dict(trial_id=tid, config=config, backend="table", workload=w, hardware=h,
                  memory_capacity_bytes=h.memory_bytes, tokens_per_step=w.tokens_per_step,
                  extra={"source_line": line})
    if row["status"] == "ok":
        step = w.tokens_per_step / float(row["tok_s"])
        return TrialRecord(status=TrialStatus.OK, step_times_s=(step,),
                           peak_memory_bytes=(int(float(row["gpu_mem_gb"]) * 1e9),),
                           **common | {"extra": common["extra"] | {
                               "mfu_pct": float(row["mfu_pct"]),
                               "tok_s_gpu": float(row["tok_s_gpu"])}})
    return TrialRecord(status=TrialStatus.OOM, memory_censor_bytes=h.memory_bytes,
                       error_message="crashed_or_oom (the source does not separate OOM from "
                                     "other crashes)", **common)


def _select(rows: list[tuple[int, dict]]):
    """(kept rows, boundary findings) for one workload."""
    seen, ok, crashed = set(), [], []
    for line, r in rows:
        key = config_key({k: r[c] for k, c in KNOBS.items()})
        if key in seen:
            continue
        seen.add(key)
        (ok if r["status"] == "ok" else crashed).append((line, r))
    if not ok:
        return sorted(crashed, key=lambda x: float(x[1]["gpu_mem_gb"] or 0))[:TOP_ALL_CRASHED], []
    keep = sorted(ok, key=lambda x: -float(x[1]["tok_s_gpu"]))[:TOP_OK]
    layouts = defaultdict(lambda: ([], []))
    for _line, r in ok:
        layouts[(r["tp"], r["pp"], r["zero"])][0].append(int(r["mbs"]))
    for line, r in crashed:
        layouts[(r["tp"], r["pp"], r["zero"])][1].append((int(r["mbs"]), line, r))
    findings = []
    for (tp, pp, zero), (ok_mbs, bad) in sorted(layouts.items()):
        above = sorted(b for b in bad if ok_mbs and b[0] > max(ok_mbs))
        if above:
            mbs, line, r = above[0]
            keep.append((line, r))
            findings.append((mbs, {"tensor_parallel_degree": int(tp),
                                   "pipeline_parallel_degree": int(pp), "zero_stage": int(zero),
                                   "largest_ok_micro_batch_size": max(ok_mbs),
                                   "first_crashed_micro_batch_size": mbs,
                                   "outcome": "crashed_or_oom"}))
    return keep, findings


def build(csv_path: Path, out: Path) -> dict:
    spec = yaml.safe_load(DEFAULT_TABLE_SPEC.read_text())
    groups: dict[tuple[str, int], list[tuple[int, dict]]] = defaultdict(list)
    with csv_path.open() as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            groups[(row["model"], int(row["nodes"]))].append((line, row))
    with tempfile.TemporaryDirectory() as tmp:
        bank = ExperienceBank.open(f"sqlite:///{tmp}/seed.sqlite")
        for (model, nodes), rows in sorted(groups.items()):
            w, h = _signatures(spec, model, nodes)
            rid = bank.start_run(
                f"ultrascale-playbook/{model}-{nodes}n", "seed:no-contract", w, h,
                SoftwareVersions(), {"source": SOURCE, "license": "Apache-2.0",
                                     "derived_by": "experience_db/make_seed.py"},
                run_id=f"seed-ultrascale-{model}-{nodes}n", origin=ORIGIN)
            keep, findings = _select(rows)
            bank.record_trials(rid, [_record(r, line, w, h) for line, r in keep], origin=ORIGIN)
            for mbs, measured in findings:
                bank.record_finding(rid, "micro_batch_size", mbs, {}, measured, False,
                                    origin=ORIGIN)
            bank.finish_run(rid, "finished")
        if out.exists():
            shutil.rmtree(out)
        manifest = bank.export(out)
        bank.close()
    return manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, help=f"the table (default: $INFRARSI_DATA_DIR/{CSV_NAME})")
    p.add_argument("--out", type=Path, default=ROOT / "infrarsi" / "bank" / "seed")
    args = p.parse_args()
    args.csv = args.csv or data_dir(CSV_NAME) / CSV_NAME
    manifest = build(args.csv, args.out)
    rows = {k: v["rows"] for k, v in manifest["tables"].items() if v["rows"]}
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"seed bundle {args.out}: {rows}, {size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
