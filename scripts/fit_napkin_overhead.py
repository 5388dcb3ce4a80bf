#!/usr/bin/env python
"""Fit the napkin's per-layer, per-micro-batch overhead (physics.LAYER_OVERHEAD_S) on a table.

    INFRARSI_DATA_DIR=/path/to/data .venv/bin/python scripts/fit_napkin_overhead.py \
        --spec configs/tables/ultrascale.yaml --check configs/tables/vtrain.yaml

For each candidate overhead, regresses every ok run's log(device-seconds per token) on
``[1, log napkin device-seconds per token, bubble, comm]`` (pooled over the table's workloads)
and prints the residual std, the napkin's fitted coefficient (1.0 is what the time prior
assumes) and the within-workload slope of the residual on log2 micro-batch (0 when the napkin
carries the micro-batch effect). ``--check`` tables are scored with the same coefficients.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infrarsi.bench._sources import WORKLOAD_SOURCES  # noqa: E402
from infrarsi.models import physics  # noqa: E402


def _rows(spec: str):
    out = []
    for b in WORKLOAD_SOURCES["table"]({"spec": spec}):
        for r in b.records():
            v = b.objective(r)
            if v and v > 0:
                out.append((b.workload_name, r, -math.log(v)))
    return out


def _design(rows, overhead: float):
    physics.LAYER_OVERHEAD_S = overhead
    X, y, mbs, groups = [], [], [], []
    for name, r, t in rows:
        c, w, h = r.config, r.workload, r.hardware
        X.append([1.0, math.log(physics.device_seconds_per_token(c, w, h)),
                  math.log1p(physics.pipeline_bubble(c, w)),
                  math.log1p(physics.communication_ratio(c, w, h))])
        y.append(t)
        mbs.append(math.log2(physics.layout(c)["mbs"]))
        groups.append(name)
    return np.array(X), np.array(y), np.array(mbs), np.array(groups)


def _mbs_slope(resid, mbs, groups) -> float:
    """Pooled within-workload slope of the residual on log2 micro-batch."""
    num = den = 0.0
    for g in set(groups):
        m = groups == g
        if np.ptp(mbs[m]) == 0:
            continue
        dm, dr = mbs[m] - mbs[m].mean(), resid[m] - resid[m].mean()
        num += float(dm @ dr)
        den += float(dm @ dm)
    return num / den if den else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="configs/tables/ultrascale.yaml")
    p.add_argument("--check", default="", help="comma list of table specs scored, not fitted")
    p.add_argument("--grid", default="0,3e-5,1e-4,3e-4,1e-3,3e-3")
    a = p.parse_args()
    fit_rows = _rows(a.spec)
    checks = {s: _rows(s) for s in a.check.split(",") if s}
    print(f"{'overhead_s':>10} {'resid_sd':>9} {'coef':>6} {'mbs_slope':>9}  " +
          " ".join(f"{Path(s).stem}_sd {Path(s).stem}_mbs" for s in checks))
    for o in (float(x) for x in a.grid.split(",")):
        X, y, mbs, g = _design(fit_rows, o)
        # within-workload regression: the level of each workload is its own
        G = np.array([g == k for k in sorted(set(g))], dtype=float).T
        Z = np.hstack([G, X[:, 1:]])
        beta, *_ = np.linalg.lstsq(Z, y, rcond=None)
        resid = y - Z @ beta
        coef = beta[G.shape[1]:]
        line = f"{o:10.0e} {resid.std():9.3f} {coef[0]:6.2f} {_mbs_slope(resid, mbs, g):9.3f}  "
        for rows in checks.values():
            Xc, yc, mc, gc = _design(rows, o)
            rc = yc - Xc[:, 1:] @ coef
            for k in set(gc):  # each workload's level is its own there too
                rc[gc == k] -= rc[gc == k].mean()
            line += f"{rc.std():10.3f} {_mbs_slope(rc, mc, gc):10.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
