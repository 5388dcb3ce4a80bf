"""The live progress table of ``infrarsi run``: one line per finished trial."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infrarsi.trial import TrialRecord

_COLS = f"{'#':>3}  {'source':<22} {'status':<18} {'step':>9} {'speedup':>8} {'best':>6}  {'peak memory':>16} {'cost':>8}"


class Progress:
    def __init__(self, out: Callable[[str], None], baseline_step_s: float | None) -> None:
        self.out = out
        self.baseline_step_s = baseline_step_s
        self.best_step_s: float | None = None

    def header(self, budget: int, n_init: int) -> None:
        self.out(f"search: {budget} trials ({n_init} seeds, then model-driven)")
        self.out(_COLS)

    def note(self, text: str) -> None:
        self.out(text)

    def sentinel(self, drift: dict[str, Any]) -> None:
        """A baseline sentinel finished (``_session.baseline_drift``): later speedups use it."""
        text = f"baseline sentinel: {drift['step_s'] * 1e3:.1f} ms/step"
        if drift.get("drift") is not None:
            text += f", {drift['drift']:+.1%} from doctor's {drift['doctor_step_s'] * 1e3:.1f} ms"
            if drift.get("notable"):
                text += f" (DRIFT: beyond twice one trial's noise {drift['trial_cv']:.1%})"
        self.out(text + "; speedups below are against this sentinel")

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
        self.out(f"{n:>3}  {origin[:22]:<22} {status[:18]:<18} {step:>9} {sp:>8} {best:>6}  "
                 f"{mem:>16} {r.device_seconds:7.0f}s")
        if r.extra.get("patches"):
            self.out(f"     patched: {', '.join(r.extra['patches'])}")
        if r.error_message and not r.ok:
            self.out(f"     {r.error_message.splitlines()[0][:150]}")

    def summary(self, outcome: Any) -> None:
        self.out(f"trials: {outcome.trials}")
        if outcome.promoted is not None:
            v = outcome.promoted
            changed = {k: x for k, x in v.config.items()}
            self.out(f"promoted: {v.speedup:.3f}x faster (95% CI {v.ci_low:.3f}-{v.ci_high:.3f}) "
                     f"with {changed}")
        elif outcome.verdicts:
            self.out("promoted: nothing; " + outcome.verdicts[0].reason)
        else:
            self.out("promoted: nothing (no candidate to verify)")
