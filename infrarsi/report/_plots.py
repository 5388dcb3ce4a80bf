"""The report's plots: matplotlib (Agg) figures returned as PNG bytes.

Each function takes :class:`ReportData` and returns PNG bytes, or raises :class:`NoPlot` with
a sentence the report shows in the plot's place (too few trials, no doctor profile, ...).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from infrarsi.report._data import PATCH_PREFIX, ReportData  # noqa: E402
from infrarsi.trial import TrialStatus  # noqa: E402

MiB = 2**20
_ORIGIN_COLORS = {"seed": "#1f77b4", "model": "#2ca02c", "pairing": "#9467bd",
                  "proposer": "#ff7f0e", "verify": "#7f7f7f", "patch": "#8c564b"}


class NoPlot(Exception):  # noqa: N818 - a plain signal, not an error a user sees as such
    """The plot cannot be drawn; the message says why."""


def origin_family(origin: str) -> str:
    head = (origin or "other").split(":")[0]
    return head if head in _ORIGIN_COLORS else "other"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def best_so_far(data: ReportData) -> bytes:
    """Best speedup found so far against trials spent and against device-seconds spent."""
    base = data.baseline_step_s()
    recs = data.search_records()
    if not base or not recs:
        raise NoPlot("no baseline step time and search trials yet")
    best, curve, cost, costs = 0.0, [], 0.0, []
    for r in recs:
        cost += r.device_seconds
        if r.ok and r.step_time_s:
            best = max(best, base / r.step_time_s)
        curve.append(best or np.nan)
        costs.append(cost)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, x, xlabel in ((axes[0], np.arange(1, len(recs) + 1), "search trials"),
                          (axes[1], np.array(costs), "device-seconds spent")):
        ax.step(x, curve, where="post", color="#1f77b4", lw=2, label="best so far (single trial)")
        fails = [i for i, r in enumerate(recs) if not r.ok]
        ax.scatter(x[fails], np.array(curve)[fails], marker="x", color="#d62728", zorder=3,
                   label="failed trial (OOM/error)")
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        _verified_band(ax, data)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup vs baseline (x)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Best-so-far speedup", fontsize=11)
    return _png(fig)


def _verified_band(ax, data: ReportData) -> None:
    v = data.promoted
    if v and v.get("speedup") and v.get("ci_low") is not None:
        hi = v["ci_high"] if v.get("ci_high") not in (None, float("inf")) else v["speedup"]
        ax.axhspan(v["ci_low"], hi, color="#2ca02c", alpha=0.15, label="verified 95% CI")
        ax.axhline(v["speedup"], color="#2ca02c", lw=1.2, ls="--")


def time_vs_memory(data: ReportData) -> bytes:
    """Step time against peak memory; OOM trials as censored marks at the capacity line."""
    base = data.baseline_step_s()
    ok = [r for r in data.records if r.ok and r.step_time_s and r.peak_memory_max_bytes]
    oom = [r for r in data.records if r.status is TrialStatus.OOM]
    if not ok and not oom:
        raise NoPlot("no trial measured memory yet")
    cap = data.capacity_bytes
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for fam in sorted({origin_family(data.origin(r)) for r in ok}):
        rs = [r for r in ok if origin_family(data.origin(r)) == fam]
        ax.scatter([r.peak_memory_max_bytes / MiB for r in rs], [r.step_time_s * 1e3 for r in rs],
                   color=_ORIGIN_COLORS.get(fam, "#333333"), label=fam, alpha=0.8, s=30)
    ys = [r.step_time_s * 1e3 for r in ok] or [base * 1e3 if base else 1.0]
    top = max(ys) * 1.12
    if oom:
        x = [(r.memory_censor_bytes or cap or 0) / MiB for r in oom]
        jitter = top * (1.0 + 0.015 * (np.arange(len(oom)) % 4))
        ax.scatter(x, jitter, marker=">", s=70, color="#d62728",
                   label=f"OOM ({len(oom)}): peak > capacity, no step time")
        ax.annotate(f"{len(oom)} OOM (censored)", (x[0], jitter[0]), xytext=(-8, 0),
                    textcoords="offset points", ha="right", va="center", color="#d62728", fontsize=8)
    if cap:
        ax.axvline(cap / MiB, color="#d62728", ls="--", lw=1.2)
        ax.text(cap / MiB, ax.get_ylim()[0], " capacity", color="#d62728", va="bottom", fontsize=8)
    if base:
        ax.axhline(base * 1e3, color="black", ls=":", lw=0.8)
        ax.text(ax.get_xlim()[0], base * 1e3, " baseline", va="bottom", fontsize=8)
    w = data.winner_config
    wins = [r for r in ok if w and _matches(r.config, w)]
    if wins:
        ax.scatter([r.peak_memory_max_bytes / MiB for r in wins], [r.step_time_s * 1e3 for r in wins],
                   s=140, facecolors="none", edgecolors="#2ca02c", lw=2, label="promoted config")
    ax.set_xlabel("peak memory per device (MiB)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("Step time vs peak memory (every trial)", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def _matches(config: dict[str, Any], target: dict[str, Any]) -> bool:
    return all(config.get(k, False if k.startswith(PATCH_PREFIX) else None) == v
               for k, v in target.items())


def memory_calibration(data: ReportData) -> bytes:
    """The censored peak-memory model, fitted on this run, predicted against measured."""
    from infrarsi.models import FeatureEncoder, PeakMemoryModel
    from infrarsi.space import Knob
    from infrarsi.workloads.knobs import build_torch_space

    recs = [r for r in data.records if r.memory_observation is not None]
    if len(recs) < 3:
        raise NoPlot(f"{len(recs)} trial(s) with a memory observation; the model needs 3")
    space = build_torch_space(data.spec)
    extra = sorted({k for r in recs for k in r.config if k not in space.names})
    space = space.with_knobs([Knob(k, (False, True), False, "bool") for k in extra])
    enc = FeatureEncoder(space).fit()
    X, mem, obs = enc.memory_dataset(recs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeakMemoryModel.from_priors(enc, capacity=data.capacity_bytes).fit(X, mem, obs)
        q = model.predict_quantiles(X, (0.1, 0.5, 0.9))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    pred, lo, hi = q[:, 1] / MiB, q[:, 0] / MiB, q[:, 2] / MiB
    m = mem / MiB
    ax.errorbar(m[obs], pred[obs], yerr=[pred[obs] - lo[obs], hi[obs] - pred[obs]], fmt="o",
                color="#1f77b4", ms=5, alpha=0.8, label="observed peak (80% interval)")
    if (~obs).any():
        ax.errorbar(m[~obs], pred[~obs], yerr=[pred[~obs] - lo[~obs], hi[~obs] - pred[~obs]],
                    fmt=">", color="#d62728", ms=8, alpha=0.9,
                    label=f"OOM ({int((~obs).sum())}): censored, true peak > capacity (right of mark)")
    span = [min(m.min(), lo.min()) * 0.9, max(m.max(), hi.max()) * 1.1]
    ax.plot(span, span, color="black", lw=0.8, ls=":", label="perfect calibration")
    if data.capacity_bytes:
        ax.axvline(data.capacity_bytes / MiB, color="#d62728", ls="--", lw=1)
        ax.axhline(data.capacity_bytes / MiB, color="#d62728", ls="--", lw=0.6, alpha=0.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured peak memory (MiB; OOM: the capacity it exceeded)")
    ax.set_ylabel("model prediction (MiB)")
    fam = "fallback to priors" if getattr(model, "fallen_back_", False) else "lifelines AFT"
    ax.set_title(f"Peak-memory model calibration (in-sample, {len(recs)} trials, {fam})", fontsize=11)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def prior_vs_measured(data: ReportData) -> bytes:
    """Each knob setting's prior effect next to the effect the run measured."""
    revs = sorted(data.engine.get("revisions") or [], key=lambda r: r.get("target") != "time")
    if not revs:
        raise NoPlot("the searcher recorded no prior revisions (no priors, or too few trials)")
    revs = revs[:24]
    fig, ax = plt.subplots(figsize=(10, max(2.6, 0.34 * len(revs) + 1.2)))
    y = np.arange(len(revs))
    for i, r in enumerate(revs):
        flagged = bool(r.get("flagged"))
        ax.errorbar(_f(r, "prior_mean", "prior"), i + 0.15, xerr=1.96 * _f(r, "prior_std"),
                    fmt="s", color="#ff7f0e", ms=5, label="prior (95%)" if i == 0 else None)
        ax.errorbar(_f(r, "posterior_mean", "posterior"), i - 0.15,
                    xerr=1.96 * _f(r, "posterior_std"), fmt="o",
                    color="#d62728" if flagged else "#1f77b4", ms=6,
                    label="measured (posterior, 95%)" if i == 0 else None)
    labels = [f"{'! ' if r.get('flagged') else ''}{r.get('knob')}={r.get('setting')} "
              f"[{r.get('target', '')}, n={r.get('evidence_n', r.get('n', '?'))}]" for r in revs]
    ax.set_yticks(y, labels, fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), revs, strict=True):
        if r.get("flagged"):
            tick.set_color("#d62728")
            tick.set_fontweight("bold")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("effect on log step time / log peak memory vs the knob's default "
                  "(negative = faster / smaller)")
    ax.set_title("Prior vs measured effect per knob setting (red: miscalibrated prior)", fontsize=11)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.invert_yaxis()
    return _png(fig)


def _f(d: dict[str, Any], *keys: str) -> float:
    for k in keys:
        if d.get(k) is not None:
            return float(d[k])
    return 0.0


def phase_profile(data: ReportData) -> bytes:
    """Fractions of a step by phase: doctor's baseline profile, and the winner's if measured."""
    bars = []
    before = _fractions(data.doctor.profile if data.doctor else {})
    if not before:
        before = _record_fractions(data, data.before.trials if data.before else ())
    if before:
        bars.append(("baseline", before))
    after = _record_fractions(data, data.after.trials if data.after and data.promoted else ())
    if after:
        bars.append(("promoted", after))
    if not bars:
        raise NoPlot("no phase profile: run `infrarsi doctor` to profile the baseline")
    phases = list(dict.fromkeys(p for _, f in bars for p in f))
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.7 * len(bars)))
    cmap = plt.get_cmap("tab10")
    for j, (_label, frac) in enumerate(bars):
        left = 0.0
        for i, p in enumerate(phases):
            w = frac.get(p, 0.0)
            ax.barh(j, w, left=left, color=cmap(i % 10), label=p if j == 0 else None)
            if w > 0.06:
                ax.text(left + w / 2, j, f"{p}\n{w:.0%}", ha="center", va="center", fontsize=7)
            left += w
    ax.set_yticks(range(len(bars)), [b[0] for b in bars])
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of step time")
    ax.set_title("Where a step's time goes", fontsize=11)
    ax.legend(fontsize=7, ncol=min(len(phases), 7), loc="upper center", bbox_to_anchor=(0.5, -0.45))
    ax.invert_yaxis()
    return _png(fig)


def _fractions(profile: dict[str, Any]) -> dict[str, float]:
    src = profile.get("fractions") if isinstance(profile.get("fractions"), dict) else profile
    vals = {k: float(v) for k, v in src.items() if isinstance(v, int | float) and v >= 0}
    total = sum(vals.values())
    return {k: v / total for k, v in vals.items()} if total > 0 else {}


def _record_fractions(data: ReportData, trial_ids) -> dict[str, float]:
    recs = [r for r in data.records if r.trial_id in set(trial_ids) and r.phase_times_s]
    if not recs:
        return {}
    keys = list(dict.fromkeys(k for r in recs for k in r.phase_times_s))
    return _fractions({k: float(np.mean([r.phase_times_s.get(k, 0.0) for r in recs])) for k in keys})


PLOTS = {
    "best_so_far": ("Best-so-far speedup", best_so_far),
    "time_vs_memory": ("Step time vs peak memory", time_vs_memory),
    "memory_calibration": ("Memory model calibration", memory_calibration),
    "prior_vs_measured": ("Prior vs measured effect per knob setting", prior_vs_measured),
    "phase_profile": ("Phase profile", phase_profile),
}


def render_all(data: ReportData) -> dict[str, tuple[str, bytes | None, str]]:
    """name -> (title, png or None, why not). A plot that fails never fails the report."""
    out = {}
    for name, (title, fn) in PLOTS.items():
        try:
            out[name] = (title, fn(data), "")
        except NoPlot as e:
            out[name] = (title, None, str(e))
        except Exception as e:  # noqa: BLE001 - a broken plot is reported, not fatal
            out[name] = (title, None, f"could not draw ({type(e).__name__}: {e})")
        finally:
            plt.close("all")
    return out
