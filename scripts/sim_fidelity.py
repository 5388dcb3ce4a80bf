"""Calibrate the GPU-cluster simulator against the Ultra-Scale Playbook table; print fidelity.

    .venv/bin/python scripts/sim_fidelity.py            # fidelity of the stored constants
    .venv/bin/python scripts/sim_fidelity.py --fit      # refit, store, then print fidelity

The table is read in place from --csv or $INFRARSI_DATA_DIR (never copied). The
fitted constants go to infrarsi/backends/simulator/calibration.yaml with their provenance.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import time
from pathlib import Path

import numpy as np

from infrarsi.backends.simulator import calibration as cal
from infrarsi.backends.simulator.params import SimParams, load_params, save_params
from infrarsi.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the constants and store them")
    ap.add_argument("--dry-run", action="store_true", help="with --fit: print, do not store")
    ap.add_argument("--csv", type=Path, help=f"the table (default: $INFRARSI_DATA_DIR/{cal.TABLE_FILE})")
    args = ap.parse_args(argv)
    try:
        csv = args.csv or cal.data_dir() / cal.TABLE_FILE
        df = cal.load_table(csv)
    except (FileNotFoundError, ConfigError) as e:
        print(e, file=sys.stderr)
        return 2
    params = load_params()
    if args.fit:
        t0 = time.perf_counter()
        params, tinfo = cal.fit_time(df, SimParams())
        params, minfo = cal.fit_memory(df, params)
        print(f"fit took {time.perf_counter() - t0:.1f} s; time {tinfo}; memory {minfo}")
        if not args.dry_run:
            path = save_params(params, {
                "data": cal.TABLE_FILE,
                "sha256": cal.file_sha256(csv),
                "fitted_on": dt.date.today().isoformat(),
                "method": "least_squares(soft_l1) on log tok/s/gpu of ok rows; nnls on gpu_mem_gb "
                          "of ok rows; fragmentation grid-searched for OOM agreement",
                "time_fit": tinfo,
                "memory_fit": minfo,
            })
            print(f"stored {path}")
    report(df, params)
    return 0


def report(df, params: SimParams) -> None:
    rows = cal.fidelity(df, params)
    print(f"\n{'model':>5} {'nodes':>5} {'rows':>5} {'ok':>4} {'spearman':>9} {'oom_acc':>8}"
          f" {'TP':>4} {'FP':>4} {'FN':>4} {'TN':>4}")
    for f in rows:
        rho = "   n/a" if math.isnan(f.spearman) else f"{f.spearman:9.2f}"
        print(f"{f.model:>5} {f.nodes:>5} {f.rows:>5} {f.ok_rows:>4} {rho:>9} {f.oom_accuracy:8.2f}"
              f" {f.tp:>4} {f.fp:>4} {f.fn:>4} {f.tn:>4}")
    rhos = [f.spearman for f in rows if not math.isnan(f.spearman)]
    n = sum(f.rows for f in rows)
    acc = sum(f.tp + f.tn for f in rows) / n
    print(f"\nSpearman over workloads: median {np.median(rhos):.2f}, min {min(rhos):.2f}; "
          f"OOM agreement over {n} rows: {acc:.2f} "
          f"(TP {sum(f.tp for f in rows)}, FP {sum(f.fp for f in rows)}, "
          f"FN {sum(f.fn for f in rows)}, TN {sum(f.tn for f in rows)}); "
          "positive = simulated OOM / measured crashed_or_oom")


if __name__ == "__main__":
    raise SystemExit(main())
