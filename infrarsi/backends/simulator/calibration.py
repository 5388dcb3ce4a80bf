"""Calibrate the simulator against measured runs and report its fidelity.

Method. Every measured row of the Ultra-Scale Playbook table (Llama 1B-80B, seq 4096, 1-64
nodes of 8xH100) is simulated with the row's own dp, tp, pp, micro-batch, accumulation and
ZeRO stage (the other knobs at the table's setting: bf16, no checkpointing, no compile,
1F1B, overlapped data-parallel sync). Then

* time: ``scipy.optimize.least_squares`` (soft-L1 loss, bounds) fits the constants in
  :data:`~infrarsi.backends.simulator.params.FITTED_TIME` on ``log(simulated tok/s/gpu) -
  log(measured)`` over the ok rows;
* memory: non-negative least squares of the measured ``gpu_mem_gb`` of ok rows on the model's
  components (states, activations, logits, constant) gives the activation and logit scales
  and the framework constant; a fragmentation share is then chosen on a grid to maximise
  agreement with the table's crashed_or_oom rows.

Fidelity per workload (model, nodes): Spearman of simulated vs measured tokens/s per GPU over
ok rows, and the confusion of simulated OOM vs measured crashed_or_oom over all rows.
The data are read in place from ``$INFRARSI_DATA_DIR`` (or an explicit path); never copied.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from infrarsi import _home
from infrarsi.backends.simulator._plan import Plan, make_plan
from infrarsi.backends.simulator.hardware import GPUS, Cluster
from infrarsi.backends.simulator.memory import stage_memory
from infrarsi.backends.simulator.models import MODELS
from infrarsi.backends.simulator.params import FITTED_TIME, SimParams
from infrarsi.backends.simulator.timing import step_phases

__all__ = [
    "TABLE_FILE",
    "TABLE_MODELS",
    "data_dir",
    "load_table",
    "table_plans",
    "fit_time",
    "fit_memory",
    "fidelity",
    "Fidelity",
]

TABLE_FILE = "ultrascale_playbook_benchmarks.csv"
TABLE_MODELS = {"1B": "llama-3.2-1b", "3B": "llama-3.2-3b", "8B": "llama-3.1-8b", "80B": "llama-80b"}
TABLE_SEQ_LEN = 4096
GiB = 2**30


def data_dir() -> Path:
    """``$INFRARSI_DATA_DIR``; a ConfigError naming the variable when it is unset."""
    return _home.data_dir(TABLE_FILE)


def load_table(path: Path | None = None) -> pd.DataFrame:
    """The measured table: ``path``, else ``$INFRARSI_DATA_DIR/<TABLE_FILE>``."""
    path = Path(path) if path else data_dir() / TABLE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: measured table not found; set INFRARSI_DATA_DIR to the folder holding "
            f"{TABLE_FILE}"
        )
    return pd.read_csv(path)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def table_plans(df: pd.DataFrame) -> list[Plan]:
    """One simulator plan per table row (its own grad_acc; tp may exceed a node here)."""
    plans = []
    for r in df.itertuples(index=False):
        cluster = Cluster(GPUS["H100-80GB"], int(r.nodes))
        config = {
            "data_parallel_degree": int(r.dp),
            "tensor_parallel_degree": int(r.tp),
            "pipeline_parallel_degree": int(r.pp),
            "micro_batch_size": int(r.mbs),
            "zero_stage": int(r.zero),
        }
        plans.append(make_plan(config, MODELS[TABLE_MODELS[r.model]], cluster,
                               seq_len=TABLE_SEQ_LEN, grad_acc=int(r.grad_acc)))
    return plans


def sim_tok_s_gpu(plan: Plan, params: SimParams) -> float:
    tokens = plan.dp * plan.mbs * plan.grad_acc * plan.seq_len
    return tokens / step_phases(plan, params)["total"] / plan.cluster.num_devices


def _components(plan: Plan, params: SimParams) -> np.ndarray:
    """Per-stage [states, activations, logits, transient] at unit scales; the peak stage's."""
    unit = params.replace(activation_scale=1.0, logits_bytes_per_elem=1.0, fragmentation=0.0,
                          framework_bytes=0.0)
    rows = []
    for s in range(plan.pp):
        b = stage_memory(plan, s, unit)
        rows.append([b.states, b.activations, b.logits, b.transient])
    rows = np.array(rows)
    scaled = rows @ np.array([1.0, params.activation_scale, params.logits_bytes_per_elem, 1.0])
    return rows[int(np.argmax(scaled))]


def fit_time(df: pd.DataFrame, params: SimParams) -> tuple[SimParams, dict]:
    from scipy.optimize import least_squares

    ok = df[df.status == "ok"]
    plans = table_plans(ok)
    y = np.log(ok.tok_s_gpu.to_numpy(float))
    groups = ok.groupby(["model", "nodes"]).ngroup().to_numpy()
    counts = np.bincount(groups)
    x0 = np.log([getattr(params, k) for k in FITTED_TIME])
    lo = np.log([0.2, 256, 128, 1e-6, 1e-5, 1e-5, 0.05, 0.02, 1e-3])
    hi = np.log([0.9, 1e5, 1e5, 2e-2, 0.5, 0.5, 1.0, 1.0, 2.0])

    def resid(z):
        p = params.replace(**dict(zip(FITTED_TIME, np.exp(z), strict=True)))
        r = np.log([sim_tok_s_gpu(pl, p) for pl in plans]) - y
        # within-workload shape (what ranking needs) plus half weight on the workload level
        level = np.bincount(groups, weights=r) / counts
        return r - 0.5 * level[groups]

    sol = least_squares(resid, np.clip(x0, lo + 1e-9, hi - 1e-9), bounds=(lo, hi),
                        loss="soft_l1", f_scale=0.3, max_nfev=60, diff_step=1e-3)
    fitted = params.replace(**dict(zip(FITTED_TIME, map(float, np.exp(sol.x)), strict=True)))
    r = np.log([sim_tok_s_gpu(pl, fitted) for pl in plans]) - y
    return fitted, {"rows": len(ok), "rmse_log": float(np.sqrt(np.mean(r**2))),
                    "median_abs_log": float(np.median(np.abs(r)))}


def fit_memory(df: pd.DataFrame, params: SimParams) -> tuple[SimParams, dict]:
    from scipy.optimize import nnls

    ok = df[(df.status == "ok") & df.gpu_mem_gb.notna()]
    comps = np.array([_components(p, params) for p in table_plans(ok)])
    y = ok.gpu_mem_gb.to_numpy(float) * GiB - comps[:, 0] - comps[:, 3]
    a = np.column_stack([comps[:, 1], comps[:, 2], np.ones(len(ok))])
    coef, _ = nnls(a, y)
    act, logit, const = float(max(coef[0], 0.3)), float(max(coef[1], 2.0)), float(coef[2])
    fitted = params.replace(activation_scale=act, logits_bytes_per_elem=logit,
                            framework_bytes=max(const, 0.5 * GiB))
    pred = np.array([_peak(p, fitted) for p in table_plans(ok)]) / GiB
    info = {"rows": len(ok), "mae_gib": float(np.mean(np.abs(pred - ok.gpu_mem_gb)))}
    # fragmentation: best agreement with crashed_or_oom rows over a grid
    plans = table_plans(df)
    measured_oom = (df.status != "ok").to_numpy()
    best = (-1.0, 0.0)
    for frag in np.linspace(0.0, 0.5, 26):
        p = fitted.replace(fragmentation=float(frag))
        sim_oom = np.array([_peak(pl, p) > pl.cluster.gpu.memory_bytes for pl in plans])
        acc = float(np.mean(sim_oom == measured_oom))
        if acc > best[0] + 1e-9:
            best = (acc, float(frag))
    info["oom_accuracy"], info["fragmentation"] = best
    return fitted.replace(fragmentation=best[1]), info


def _peak(plan: Plan, params: SimParams) -> float:
    return max(stage_memory(plan, s, params).total for s in range(plan.pp))


@dataclass(frozen=True)
class Fidelity:
    """Agreement of the simulator with one measured workload."""

    model: str
    nodes: int
    rows: int
    ok_rows: int
    spearman: float  # nan when fewer than 3 ok rows
    oom_accuracy: float
    tp: int  # simulated OOM, measured crashed_or_oom
    fp: int  # simulated OOM, measured ok
    fn: int  # simulated fits, measured crashed_or_oom
    tn: int


def fidelity(df: pd.DataFrame, params: SimParams) -> list[Fidelity]:
    from scipy.stats import spearmanr

    out = []
    for (model, nodes), g in df.groupby(["model", "nodes"], sort=False):
        plans = table_plans(g)
        sim_oom = np.array([_peak(p, params) > p.cluster.gpu.memory_bytes for p in plans])
        meas_oom = (g.status != "ok").to_numpy()
        ok = ~meas_oom
        rho = math.nan
        if ok.sum() >= 3:
            sim = [sim_tok_s_gpu(p, params) for p, k in zip(plans, ok, strict=True) if k]
            rho = float(spearmanr(sim, g.tok_s_gpu[ok]).statistic)
        out.append(Fidelity(
            str(model), int(nodes), len(g), int(ok.sum()), rho,
            float(np.mean(sim_oom == meas_oom)),
            int(np.sum(sim_oom & meas_oom)), int(np.sum(sim_oom & ~meas_oom)),
            int(np.sum(~sim_oom & meas_oom)), int(np.sum(~sim_oom & ~meas_oom)),
        ))
    return out
