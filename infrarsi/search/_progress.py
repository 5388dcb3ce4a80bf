"""The live progress table of ``infrarsi run``.

One line per finished trial, then what it changed against the baseline and the run's elapsed
time and ETA; while a trial runs, its state (starting, building, warm-up k/n, measuring step k
of n) every few seconds; during verification one line per pair with the running interval.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from infrarsi.stats import paired_speedup
from infrarsi.trial import TrialRecord

_COLS = f"{'#':>3}  {'source':<22} {'layout':<16} {'status':<18} {'step':>9} {'speedup':>8} {'best':>6}  {'peak memory':>16} {'cost':>8}"


def layout_label(config: dict[str, Any]) -> str:
    """The parallel layout of a config in a few characters ("dp2", "tp2+sp", "pp2:1f1b"), read
    the way the physics features read it (real knobs and table columns alike)."""
    from infrarsi.models.physics import layout

    c = layout(config)
    parts = [f"{r}{c[r]}" for r in ("dp", "tp", "pp", "cp", "ep") if c[r] > 1]
    if c["tp"] > 1 and config.get("sequence_parallel"):
        parts[parts.index(f"tp{c['tp']}")] += "+sp"
    if c["pp"] > 1:
        sched = str(config.get("pipeline_schedule", c["schedule"]))
        v = f"x{c['vpp']}" if sched.startswith("interleaved") and c["vpp"] > 1 else ""
        parts[parts.index(f"pp{c['pp']}")] += f":{sched.replace('interleaved_', 'i')}{v}"
    return " ".join(parts) or "1 rank"


def fmt_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def knob_changes(config: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    """``micro_batch_size 1->4, precision fp32->bf16`` (``baseline`` when nothing differs)."""
    if not baseline:
        return ", ".join(f"{k}={v}" for k, v in config.items())
    diff = [f"{k} {baseline.get(k)}->{v}" for k, v in config.items()
            if k in baseline and baseline[k] != v]
    diff += [f"{k}={v}" for k, v in config.items() if k not in baseline]
    return ", ".join(diff) or "baseline"


def describe_state(state: dict[str, Any] | None) -> str:
    """A running trial's state from its live file (None: not started measuring yet)."""
    if not state:
        return "starting (waiting for workers)"
    phase, step, of = state.get("phase", ""), state.get("step", 0), state.get("of", 0)
    if phase == "measuring":
        return f"measuring step {step} of {of}"
    if phase == "warm-up":
        return f"warm-up {step}/{of}"
    if phase == "loss reference":
        return f"loss reference step {step} of {of}"
    return phase or "starting"


class Progress:
    def __init__(self, out: Callable[[str], None], baseline_step_s: float | None,
                 baseline_config: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.out = out
        self.baseline_step_s = baseline_step_s
        self.baseline_config = baseline_config
        self.best_step_s: float | None = None
        self.clock = clock
        self.t0 = clock()
        self.budget = 0
        self.done = 0  # trials finished before this driver (a resumed run)
        self.after = 0  # trials to come after the search (verification)
        self._walls: list[float] = []
        self._pairs: list[tuple[float, float]] = []
        self._attempts = 0  # pairs run for the candidate being verified, failed ones included
        self._looks: dict[int, tuple[int, float]] = {}  # pairs -> (look number, its alpha)

    def header(self, budget: int, n_init: int, *, done: int = 0, verify_trials: int = 0) -> None:
        self.budget, self.done, self.after = budget, done, verify_trials
        self.out(f"search: {budget} trials ({n_init} seeds, then model-driven)"
                 + (f"; {done} already done" if done else ""))
        self.out(_COLS)

    def eta_s(self, n: int) -> float | None:
        """Seconds left in the run after ``n`` search trials, from the mean wall time of the
        trials this driver saw (None before the first)."""
        if not self._walls:
            return None
        mean = sum(self._walls) / len(self._walls)
        return (max(self.budget - n, 0) + self.after) * mean

    def progress_line(self, n: int) -> str:
        elapsed = fmt_duration(self.clock() - self.t0)
        eta = self.eta_s(n)
        left = max(self.budget - n, 0)
        return (f"elapsed {elapsed}, ETA {fmt_duration(eta) if eta is not None else '?'} "
                f"({left} search trial(s) + {self.after} verification trial(s) left)")

    def running(self, n: int, origin: str, config: dict[str, Any], state: dict[str, Any] | None,
                started: float) -> None:
        """A line for a trial still running: its number, changes, state and time so far."""
        self.out(f"{n:>3}  {origin[:22]:<22} running: {describe_state(state)} "
                 f"({fmt_duration(self.clock() - started)}); "
                 f"{knob_changes(config, self.baseline_config)}")

    def note(self, text: str) -> None:
        self.out(text)

    def sentinel(self, drift: dict[str, Any], baseline_step_s: float | None = None,
                 window: int = 1) -> None:
        """A baseline sentinel finished (``_session.baseline_drift``): later speedups are against
        ``baseline_step_s`` (the median of the last ``window`` sentinels; this one's by default)."""
        text = f"baseline sentinel: {drift['step_s'] * 1e3:.1f} ms/step"
        if drift.get("drift") is not None:
            text += f", {drift['drift']:+.1%} from doctor's {drift['doctor_step_s'] * 1e3:.1f} ms"
            if drift.get("notable"):
                text += f" (DRIFT: beyond twice one trial's noise {drift['trial_cv']:.1%})"
        if baseline_step_s is None or window <= 1:
            self.out(text + "; speedups below are against this sentinel")
        else:
            self.out(text + f"; speedups below are against the median of the last {window} "
                     f"sentinels, {baseline_step_s * 1e3:.1f} ms")

    def row(self, n: int, r: TrialRecord, origin: str, live: dict[str, Any] | None) -> None:
        status = r.status.value + (f":{r.error_kind.value}" if r.error_kind else "")
        if r.extra.get("stopped_early"):
            status += " (stopped:slow)"
        step = f"{r.step_time_s * 1e3:8.1f}ms" if r.step_time_s else f"{'-':>9}"
        if r.ok and r.step_time_s and (self.best_step_s is None or r.step_time_s < self.best_step_s):
            self.best_step_s = r.step_time_s
        sp = best = f"{'-':>6}"
        if self.baseline_step_s and r.ok and r.step_time_s:
            sp = f"{self.baseline_step_s / r.step_time_s:5.2f}x"
        if self.baseline_step_s and self.best_step_s:
            best = f"{self.baseline_step_s / self.best_step_s:5.2f}x"
        if r.peak_memory_max_bytes:
            mem = f"{r.peak_memory_max_bytes / 2**20:,.0f} MiB"
        elif r.memory_censor_bytes:
            mem = f"OOM >{r.memory_censor_bytes / 2**20:,.0f} MiB"
        else:
            mem = "-"
        self.out(f"{n:>3}  {origin[:22]:<22} {layout_label(r.config)[:16]:<16} {status[:18]:<18} {step:>9} {sp:>8} {best:>6}  "
                 f"{mem:>16} {r.device_seconds:7.0f}s")
        if r.wall_seconds:
            self._walls.append(r.wall_seconds)
        self.out(f"     vs baseline: {knob_changes(r.config, self.baseline_config)}; "
                 + self.progress_line(n))
        if r.extra.get("patches"):
            self.out(f"     patched: {', '.join(r.extra['patches'])}")
        if r.error_message and not r.ok:
            self.out(f"     {r.error_message.splitlines()[0][:150]}")

    def verify_start(self, index: int, total: int, pairs: int, config: dict[str, Any],
                     looks: list[int] | None = None, alphas: list[float] | None = None) -> None:
        """A candidate's verification begins; ``looks``/``alphas`` are the verification's own
        (``verify.look_schedule``/``look_alphas``): the pair lines judge only there, as it does."""
        self._pairs, self._attempts = [], 0
        self._looks = {n: (k + 1, a) for k, (n, a) in enumerate(zip(looks or [], alphas or [],
                                                                    strict=True))}
        self.out(f"verifying candidate {index}/{total} with {pairs} interleaved pairs: "
                 f"{knob_changes(config, self.baseline_config)}")

    def verify_pair(self, base: TrialRecord, cand: TrialRecord, bar: float,
                    replayed: bool = False) -> None:
        """One finished pair and the interval of all this candidate's pairs so far."""
        self._attempts += 1
        k = self._attempts
        tag = " (kept from the earlier driver)" if replayed else ""
        if not (base.ok and cand.ok and base.step_time_s and cand.step_time_s):
            bad = cand if not cand.ok else base
            self.out(f"  pair {k}: {bad.trial_id} was {bad.status.value}{tag}")
            return
        self._pairs.append((base.step_time_s, cand.step_time_s))
        s, lo, hi = paired_speedup([p[0] for p in self._pairs], [p[1] for p in self._pairs])
        ci = (f"95% CI [{lo:.3f}, {hi:.3f}]" if math.isfinite(hi) else "no interval yet")
        self.out(f"  pair {k}: baseline {base.step_time_s * 1e3:.1f}ms, candidate "
                 f"{cand.step_time_s * 1e3:.1f}ms ({base.step_time_s / cand.step_time_s:.3f}x); "
                 f"so far {s:.3f}x, {ci}{self._look_text(k, bar)}{tag}; "
                 f"elapsed {fmt_duration(self.clock() - self.t0)}")

    def _look_text(self, k: int, bar: float) -> str:
        """At a look of the verification: its one-sided bound at that look's level against the
        bar (what the verdict tests); between looks the bar is not tested, so nothing is said."""
        from infrarsi.search.verify import judge

        if k not in self._looks or len(self._pairs) < 2:
            return f"; next look at {min((n for n in self._looks if n > k), default=k)} pairs" \
                if self._looks else ""
        look, alpha = self._looks[k]
        _, _, lo, _ = judge(self._pairs, min_effect=bar - 1.0, alpha=alpha, final=True, cap=k)
        return (f"; look {look} of {len(self._looks)}: one-sided {1 - alpha:.1%} lower bound "
                f"{lo:.3f} {'clears' if lo > bar else 'below'} the bar {bar:.3f}")

    def summary(self, outcome: Any) -> None:
        self.out(f"trials: {outcome.trials}")
        if outcome.promoted is not None:
            # the report's headline in the same words and figures (its verdict_line)
            v = outcome.promoted
            self.out(f"promoted: {v.speedup:.3f}x faster per step ({v.confidence:.0%} CI "
                     f"[{v.ci_low:.3f}, {v.ci_high:.3f}], {len(v.pairs)} interleaved A/B pairs "
                     f"against the untouched baseline; minimum worthwhile effect 1 + "
                     f"{v.min_effect:.3f}) with {knob_changes(v.config, self.baseline_config)}")
        elif outcome.verdicts:
            self.out("promoted: nothing; " + outcome.verdicts[0].reason)
        else:
            self.out("promoted: nothing (no candidate to verify)")
