"""Benchmark the cost models on the Ultra-Scale Playbook table (prints tables; --out writes JSON).

Per workload (model, nodes), per seed: fit on a random 20% of its rows, score the other 80%.

OOM prediction (AUC, Brier) and peak-memory error on ok rows (MdAPE of the median), for
  a  censored AFT (crashed rows right-censored at 80 GB), physics priors on
  a0 the same without physics (ablation)
  b  the same AFT fit on ok rows only (OOMs dropped)
  c  OOM rows imputed at capacity as observed
  d  a plain classifier (logistic regression on the same features)
Step time (on ok rows, step = 256 * 4096 / (tok_s_gpu * gpus)): Spearman, MdAPE, coverage of
the 80% interval and Gaussian NLL, for the model families we chose between:
  blr+gp (StepTimeModel default), blr (linear base only), gp (GP alone), gbm (bagged boosting)
Cost: fit time at 200 / 2,000 / 10,000 trials and time to score 10,000 candidates.

    .venv/bin/python scripts/bench_models.py [--seeds 3] [--joint] [--out bench_models.json]

The CSV is read in place from --csv or $INFRARSI_DATA_DIR (never copied into the project).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm, spearmanr
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from infrarsi._home import data_dir
from infrarsi.errors import ConfigError, ModelFallbackWarning
from infrarsi.models import FeatureEncoder, PeakMemoryModel, StepTimeModel
from infrarsi.models._gp import LeanGP
from infrarsi.models.crash import CrashModel
from infrarsi.space import Knob, SearchSpace
from infrarsi.trial import HardwareFingerprint, WorkloadSignature

DATA = "ultrascale_playbook_benchmarks.csv"
KNOBS = ("dp", "tp", "pp", "mbs", "grad_acc", "zero")
CAP_GB = 80.0
MODELS = {  # name: (params, layers, hidden, heads)
    "1B": (1.24e9, 16, 2048, 32), "3B": (3.21e9, 28, 3072, 24),
    "8B": (8.03e9, 32, 4096, 32), "80B": (80e9, 80, 8192, 64),
}


def build_space(df: pd.DataFrame) -> SearchSpace:
    knobs = [Knob(k, tuple(sorted(int(v) for v in df[k].unique())), 0 if k == "zero" else 1,
                  "ordinal") for k in KNOBS]
    return SearchSpace(tuple(knobs))


def contexts(model: str, nodes: int) -> tuple[WorkloadSignature, HardwareFingerprint]:
    params, layers, hidden, heads = MODELS[model]
    wl = WorkloadSignature("dense", int(params), layers, hidden, heads, 4096, 256, name=model)
    hw = HardwareFingerprint("H100-80GB", int(CAP_GB * 1e9), 8, nodes, "infiniband", 989e12)
    return wl, hw


def encode(enc: FeatureEncoder, df: pd.DataFrame) -> np.ndarray:
    if len(df) == 0:
        return np.zeros((0, enc.n_features_out_))
    cfgs = df[list(KNOBS)].astype(int).to_dict("records")
    wls, hws = zip(*(contexts(m, n) for m, n in zip(df.model, df.nodes, strict=True)), strict=True)
    return enc.transform(cfgs, list(wls), list(hws))


# ---- memory -------------------------------------------------------------------------------------

def memory_variants(enc, Xtr, tr):
    ok = (tr.status == "ok").to_numpy()
    mem = np.where(ok, tr.gpu_mem_gb.to_numpy(), CAP_GB)
    out = {}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", ModelFallbackWarning)
        out["a"] = PeakMemoryModel.from_priors(enc, capacity=CAP_GB).fit(Xtr, mem, ok)
        out["a0"] = PeakMemoryModel(capacity=CAP_GB, encoder=enc).fit(Xtr, mem, ok)
        out["b"] = PeakMemoryModel.from_priors(enc, capacity=CAP_GB).fit(Xtr[ok], mem[ok])
        out["c"] = PeakMemoryModel.from_priors(enc, capacity=CAP_GB).fit(Xtr, mem)
    fallbacks = sum(issubclass(x.category, ModelFallbackWarning) for x in w)
    return out, fallbacks


def classifier_p(Xtr, ytr, Xte):
    if ytr.min() == ytr.max():
        return np.full(len(Xte), float(ytr[0]))
    keep = Xtr.std(axis=0) > 1e-9
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
    return clf.fit(Xtr[:, keep], ytr).predict_proba(Xte[:, keep])[:, 1]


def mdape(pred, true) -> float:
    return float(np.median(np.abs(pred - true) / true) * 100) if len(true) else float("nan")


def score_memory(models, Xtr, tr, Xte, te) -> dict:
    y = (te.status != "ok").to_numpy().astype(float)
    ok = y == 0
    res = {}
    probs = {k: m.p_oom(Xte, CAP_GB) for k, m in models.items()}
    probs["d"] = classifier_p(Xtr, (tr.status != "ok").to_numpy().astype(int), Xte)
    for k, p in probs.items():
        res[f"auc_{k}"] = roc_auc_score(y, p) if 0 < y.mean() < 1 else float("nan")
        res[f"brier_{k}"] = float(np.mean((p - y) ** 2))
    for k, m in models.items():
        res[f"peak_{k}"] = mdape(m.predict(Xte[ok]), te.gpu_mem_gb.to_numpy()[ok])
    return res


# ---- step time ----------------------------------------------------------------------------------

def step_log(df: pd.DataFrame) -> np.ndarray:
    return np.log(256 * 4096 / (df.tok_s_gpu.to_numpy() * df.gpus.to_numpy()))


class _GPOnly:
    def fit(self, X, y):
        self.keep = X.std(axis=0) > 1e-9
        self.mu, self.sd = X[:, self.keep].mean(0), X[:, self.keep].std(0)
        self.ym = y.mean()
        self.gp = LeanGP().fit((X[:, self.keep] - self.mu) / self.sd, y - self.ym)
        return self

    def predict(self, X, return_std=True):
        m, s = self.gp.predict((X[:, self.keep] - self.mu) / self.sd)
        return m + self.ym, s


class _Bagged:
    def fit(self, X, y, n=5):
        rng = np.random.default_rng(0)
        self.ms = []
        for _ in range(n):
            i = rng.integers(0, len(y), len(y))
            self.ms.append(GradientBoostingRegressor(n_estimators=100, max_depth=3,
                                                     min_samples_leaf=2).fit(X[i], y[i]))
        self.noise = float(np.var(y - np.mean([m.predict(X) for m in self.ms], axis=0)))
        return self

    def predict(self, X, return_std=True):
        P = np.array([m.predict(X) for m in self.ms])
        return P.mean(0), np.sqrt(P.var(0) + self.noise)


def time_families():
    return {"blr+gp": lambda: StepTimeModel(), "blr": lambda: StepTimeModel(residual="none"),
            "gp": _GPOnly, "gbm": _Bagged}


def score_time(Xtr, ytr, Xte, yte) -> dict:
    res = {}
    for name, make in time_families().items():
        if len(ytr) < 3 or len(yte) < 3:
            res.update({f"{k}_{name}": float("nan") for k in ("rho", "mdape", "cov80", "nll")})
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mu, sd = make().fit(Xtr, ytr).predict(Xte, return_std=True)
            res[f"rho_{name}"] = float(spearmanr(mu, yte).statistic)
        res[f"mdape_{name}"] = mdape(np.exp(mu), np.exp(yte))
        res[f"cov80_{name}"] = float(np.mean(np.abs(yte - mu) <= 1.2816 * sd))
        res[f"nll_{name}"] = float(-np.mean(norm.logpdf(yte, mu, sd)))
    return res


# ---- protocol -----------------------------------------------------------------------------------

def split(df, frac, rng):
    n_tr = max(int(round(frac * len(df))), 4)
    idx = rng.permutation(len(df))
    return df.iloc[idx[:n_tr]], df.iloc[idx[n_tr:]]


def run_per_workload(df, enc, seeds, frac) -> pd.DataFrame:
    rows = []
    for (model, nodes), g in df.groupby(["model", "nodes"], sort=False):
        for seed in range(seeds):
            tr, te = split(g, frac, np.random.default_rng(seed))
            Xtr, Xte = encode(enc, tr), encode(enc, te)
            t0 = time.perf_counter()
            models, fb = memory_variants(enc, Xtr, tr)
            row = {"workload": f"{model}/{nodes}n", "seed": seed, "n": len(g),
                   "oom": float((g.status != "ok").mean()), "fallbacks": fb,
                   "fit_s": time.perf_counter() - t0, "dist": models["a"].dist_}
            row.update(score_memory(models, Xtr, tr, Xte, te))
            oktr, okte = tr[tr.status == "ok"], te[te.status == "ok"]
            row.update(score_time(encode(enc, oktr), step_log(oktr), encode(enc, okte), step_log(okte)))
            rows.append(row)
        print(f"  {model}/{nodes}n done", flush=True)
    return pd.DataFrame(rows)


def run_joint(df, enc, seeds, frac) -> pd.DataFrame:
    """One global model trained on 20% of every workload at once, scored per workload."""
    rows = []
    for seed in range(seeds):
        rng = np.random.default_rng(1000 + seed)
        parts = [split(g, frac, rng) for _, g in df.groupby(["model", "nodes"], sort=False)]
        tr = pd.concat([p[0] for p in parts])
        Xtr = encode(enc, tr)
        models, _ = memory_variants(enc, Xtr, tr)
        oktr = tr[tr.status == "ok"]
        time_models = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, make in time_families().items():
                time_models[name] = make().fit(encode(enc, oktr), step_log(oktr))
        for _, te in parts:
            Xte = encode(enc, te)
            row = {"workload": f"{te.model.iloc[0]}/{te.nodes.iloc[0]}n", "seed": seed}
            row.update(score_memory(models, Xtr, tr, Xte, te))
            okte = te[te.status == "ok"]
            if len(okte) >= 3:
                Xo, yo = encode(enc, okte), step_log(okte)
                for name, m in time_models.items():
                    mu, sd = m.predict(Xo, return_std=True)
                    row[f"rho_{name}"] = float(spearmanr(mu, yo).statistic)
                    row[f"mdape_{name}"] = mdape(np.exp(mu), np.exp(yo))
                    row[f"cov80_{name}"] = float(np.mean(np.abs(yo - mu) <= 1.2816 * sd))
                    row[f"nll_{name}"] = float(-np.mean(norm.logpdf(yo, mu, sd)))
            rows.append(row)
    return pd.DataFrame(rows)


def run_loo(df, enc) -> pd.DataFrame:
    """P(OOM) of each workload from a model fitted on every *other* workload (how a search's
    experience sees a new one): AUC and Brier of the censored AFT with peaks (a), of the same
    model from ok/OOM labels alone (l: ok rows left-censored at the capacity, the interval
    fit), and of the classifier (d); P(fail) as a search with experience predicts it (f):
    1 - (1 - P(OOM) of (a)) (1 - P(crash)), the crash model's trees fitted on every training
    failure as one label (``oom_fails``); plus the labels-only fit's time."""
    rows = []
    for (model, nodes), te in df.groupby(["model", "nodes"], sort=False):
        tr = df[~((df.model == model) & (df.nodes == nodes))]
        Xtr, Xte = encode(enc, tr), encode(enc, te)
        ok = (tr.status == "ok").to_numpy()
        y = (te.status != "ok").to_numpy().astype(float)
        row = {"workload": f"{model}/{nodes}n", "oom": float(y.mean()), "n": len(te)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = PeakMemoryModel.from_priors(enc, capacity=CAP_GB).fit(
                Xtr, np.where(ok, tr.gpu_mem_gb.to_numpy(), CAP_GB), ok)
            bounds = np.column_stack([np.where(ok, 0.0, CAP_GB), np.where(ok, CAP_GB, np.inf)])
            t0 = time.perf_counter()
            lab = PeakMemoryModel.from_priors(enc, capacity=CAP_GB).fit(Xtr, bounds)
            row["labels_fit_s"] = time.perf_counter() - t0
        p_crash = CrashModel(random_state=0).fit(Xtr, ~ok).p_crash(Xte)
        probs = {"a": a.p_oom(Xte), "l": lab.p_oom(Xte),
                 "d": classifier_p(Xtr, (~ok).astype(int), Xte)}
        probs["f"] = 1.0 - (1.0 - probs["a"]) * (1.0 - p_crash)
        for k, p in probs.items():
            row[f"auc_{k}"] = roc_auc_score(y, p) if 0 < y.mean() < 1 else float("nan")
            row[f"brier_{k}"] = float(np.mean((p - y) ** 2))
        rows.append(row)
    return pd.DataFrame(rows)


def cost(df, enc) -> list[dict]:
    """Fit at 200 / 2,000 / 10,000 trials (rows resampled from the whole table, jittered)."""
    rng = np.random.default_rng(0)
    out = []
    cand = df.sample(10_000, replace=True, random_state=1)
    for n in (200, 2000, 10_000):
        s = df.sample(n, replace=True, random_state=n)
        ok = (s.status == "ok").to_numpy()
        mem = np.where(ok, s.gpu_mem_gb.to_numpy() * np.exp(0.02 * rng.normal(size=n)), CAP_GB)
        X = encode(enc, s)
        row = {"n": n}
        for name, fit in (
            ("memory_fit", lambda X=X, mem=mem, ok=ok: PeakMemoryModel.from_priors(
                enc, capacity=CAP_GB).fit(X, mem, ok)),
            ("time_fit", lambda X=X, ok=ok, s=s: StepTimeModel().fit(
                X[ok], step_log(s[ok]) + 0.02 * rng.normal(size=ok.sum()))),
        ):
            w0, c0 = time.perf_counter(), time.process_time()
            model = fit()
            row[f"{name}_wall_s"] = time.perf_counter() - w0
            row[f"{name}_cpu_s"] = time.process_time() - c0
            row[f"{name.split('_')[0]}_model"] = model
        w0 = time.perf_counter()
        Xc = encode(enc, cand)
        row["encode_10k_s"] = time.perf_counter() - w0
        w0 = time.perf_counter()
        row["memory_model"].p_oom(Xc)
        row["p_oom_10k_s"] = time.perf_counter() - w0
        w0 = time.perf_counter()
        row["time_model"].predict(Xc, return_std=True)
        row["time_predict_10k_s"] = time.perf_counter() - w0
        row["dist"] = row.pop("memory_model").dist_
        row.pop("time_model")
        out.append(row)
    return out


def summarize(per: pd.DataFrame, label: str) -> dict:
    w = per.groupby("workload", sort=False).mean(numeric_only=True)
    s = {"label": label, "workloads": len(w)}
    both = w["auc_a"].notna()
    s["a_beats_b_brier"] = int((w.brier_a < w.brier_b).sum())
    s["a_beats_c_brier"] = int((w.brier_a < w.brier_c).sum())
    s["a_within_0.02_of_d_brier"] = int((w.brier_a <= w.brier_d + 0.02).sum())
    for k in ("a", "a0", "b", "c", "d"):
        s[f"median_auc_{k}"] = float(w.loc[both, f"auc_{k}"].median())
        s[f"mean_brier_{k}"] = float(w[f"brier_{k}"].mean())
    for k in ("a", "a0", "b", "c"):
        s[f"median_peak_mdape_{k}"] = float(w[f"peak_{k}"].median())
    s["auc_a_ge_0.9"] = f"{int((w.loc[both, 'auc_a'] >= 0.9).sum())}/{int(both.sum())}"
    for f in time_families():
        ok = w[f"rho_{f}"].notna()
        s[f"time_{f}"] = {
            "median_spearman": float(w.loc[ok, f"rho_{f}"].median()),
            "spearman_ge_0.85": f"{int((w.loc[ok, f'rho_{f}'] >= 0.85).sum())}/{int(ok.sum())}",
            "median_mdape_pct": float(w.loc[ok, f"mdape_{f}"].median()),
            "mean_cov80": float(w.loc[ok, f"cov80_{f}"].mean()),
            "mean_nll": float(w.loc[ok, f"nll_{f}"].mean()),
        }
    return s


def print_tables(per: pd.DataFrame, label: str) -> None:
    w = per.groupby("workload", sort=False).mean(numeric_only=True)
    cols = {"oom": "oom%", "auc_a": "AUC a", "auc_b": "AUC b", "auc_c": "AUC c", "auc_d": "AUC d",
            "brier_a": "Br a", "brier_a0": "Br a0", "brier_b": "Br b", "brier_c": "Br c",
            "brier_d": "Br d", "peak_a": "pk% a", "peak_b": "pk% b", "peak_c": "pk% c",
            "rho_blr+gp": "rho", "mdape_blr+gp": "t%", "cov80_blr+gp": "cov80"}
    t = w[[c for c in cols if c in w]].rename(columns=cols)
    if "oom%" in t:
        t["oom%"] *= 100
    print(f"\n== {label}: per workload (mean over seeds) ==")
    print(t.to_string(float_format=lambda v: f"{v:.3f}" if abs(v) < 10 else f"{v:.0f}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", "--data", dest="data", type=Path,
                    help=f"the table (default: $INFRARSI_DATA_DIR/{DATA})")
    ap.add_argument("--seeds", type=int, default=3, help="random 20%% splits per workload")
    ap.add_argument("--frac", type=float, default=0.2)
    ap.add_argument("--joint", action="store_true", help="also fit one global model on all workloads")
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--loo", action="store_true",
                    help="only the leave-one-workload-out P(OOM) table (peaks vs labels alone)")
    ap.add_argument("--cost-only", action="store_true",
                    help="only the fit/predict cost table (time it under the shared bench lock)")
    ap.add_argument("--out", type=Path, help="write every figure as JSON here")
    a = ap.parse_args()
    threadpool_limits(1)  # small matrices: threads only contend on a shared 2-core box
    try:
        df = pd.read_csv(a.data or data_dir(DATA) / DATA)
    except (ConfigError, FileNotFoundError) as e:
        raise SystemExit(str(e)) from None
    enc = FeatureEncoder(build_space(df)).fit()
    report = {"command": "scripts/bench_models.py", "seeds": a.seeds, "frac": a.frac}
    if a.cost_only:
        print(pd.DataFrame(cost(df, enc)).to_string(float_format=lambda v: f"{v:.3f}"))
        return
    if a.loo:
        loo = run_loo(df, enc)
        print("\n== leave one workload out: P(OOM) of the held-out workload ==")
        print(loo.to_string(float_format=lambda v: f"{v:.3f}"))
        both = loo["auc_a"].notna()
        for k in ("a", "l", "d", "f"):
            print(f"{k}: AUC >= 0.9 in {int((loo.loc[both, f'auc_{k}'] >= 0.9).sum())}/"
                  f"{int(both.sum())} workloads with both outcomes, median "
                  f"{loo.loc[both, f'auc_{k}'].median():.3f}, Brier {loo[f'brier_{k}'].mean():.3f}")
        print(f"labels-only fit: median {loo.labels_fit_s.median():.2f} s "
              f"on ~{len(df) - len(df) // len(loo)} rows")
        if a.out:
            a.out.write_text(json.dumps(loo.to_dict("records"), indent=1, default=float))
        return
    per = run_per_workload(df, enc, a.seeds, a.frac)
    print_tables(per, "per-workload fits")
    report["per_workload"] = summarize(per, "per-workload")
    report["per_workload_rows"] = per.to_dict("records")
    if a.joint:
        joint = run_joint(df, enc, a.seeds, a.frac)
        print_tables(joint, "one global model (20% of every workload)")
        report["joint"] = summarize(joint, "joint")
        report["joint_rows"] = joint.to_dict("records")
    print("\n== summary ==")
    for key in ("per_workload", "joint"):
        if key in report:
            print(json.dumps(report[key], indent=1))
    if not a.no_cost:
        report["cost"] = cost(df, enc)
        print("\n== cost (2-core shared box; wall and CPU seconds) ==")
        print(pd.DataFrame(report["cost"]).to_string(float_format=lambda v: f"{v:.3f}"))
    if a.out:
        a.out.write_text(json.dumps(report, indent=1, default=float))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
