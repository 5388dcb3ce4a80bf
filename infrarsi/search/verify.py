"""Verification: re-measure a candidate interleaved with the untouched baseline (A B A B ...).

Method (the one doctor's noise model assumes): each pair runs the baseline, then the candidate,
on the same resources; the speedup of a pair is baseline step time / candidate step time (each a
trial's median measured step). A two-sided Student-t interval on the mean log ratio gives the
speedup and its confidence interval; pairing cancels slow drifts of a shared, noisy machine.
A candidate is promoted only when the interval's lower bound exceeds ``1 + mde`` (the minimum
detectable effect doctor measured) and every candidate trial kept the contract's invariants.

Adaptive length: when the planned pairs leave the verdict open -- the point estimate clears the
bar but the interval still straddles it -- more pairs are run, up to ``max_pairs``. The bar
itself never moves, and a candidate identical to the baseline has a point estimate near 1, so
it is not extended; a real but noisy speedup gets the evidence it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from infrarsi.backends.base import Backend
from infrarsi.space import Config
from infrarsi.stats import DEFAULT_MDE, paired_speedup
from infrarsi.trial import TrialRecord

__all__ = ["DEFAULT_MDE", "Verdict", "paired_speedup", "verify_candidate"]

@dataclass(frozen=True)
class Verdict:
    """The evidence behind promoting (or not) one candidate."""

    config: Config
    promoted: bool
    reason: str
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    mde: float = DEFAULT_MDE
    pairs: list[tuple[float, float]] = field(default_factory=list)
    baseline_trials: list[str] = field(default_factory=list)
    candidate_trials: list[str] = field(default_factory=list)
    invariants: str = "loss and work per step checked on every candidate trial"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_candidate(backend: Backend, baseline: Config, candidate: Config, *, pairs: int,
                     mde: float, tag: str,
                     on_record: Callable[[TrialRecord, str], None] | None = None,
                     max_pairs: int | None = None) -> Verdict:
    """Run ``pairs`` interleaved baseline/candidate trials (up to ``max_pairs`` while the
    verdict is open, see the module docstring) and judge the candidate."""
    base_ids, cand_ids, measured = [], [], []
    bar = 1.0 + mde
    i = 0
    while i < pairs or (i < (max_pairs or pairs) and _open(measured, bar)):
        b = backend.execute(baseline, trial_id=f"{tag}-A{i}")
        c = backend.execute(candidate, trial_id=f"{tag}-B{i}")
        for rec, origin in ((b, "verify:baseline"), (c, "verify:candidate")):
            if on_record is not None:
                on_record(rec, origin)
        base_ids.append(b.trial_id)
        cand_ids.append(c.trial_id)
        if not c.ok:
            return Verdict(candidate, False, f"candidate trial {c.trial_id} was {c.status.value}: "
                           f"{c.error_message or 'no measurement'}", mde=mde, pairs=measured,
                           baseline_trials=base_ids, candidate_trials=cand_ids)
        if b.ok:
            measured.append((b.step_time_s, c.step_time_s))
        i += 1
    if not measured:
        return Verdict(candidate, False, "no baseline trial completed; nothing to compare",
                       mde=mde, baseline_trials=base_ids, candidate_trials=cand_ids)
    s, lo, hi = paired_speedup([m[0] for m in measured], [m[1] for m in measured])
    ok = lo > bar
    reason = (f"speedup {s:.3f}x, 95% CI [{lo:.3f}, {hi:.3f}] over {len(measured)} interleaved "
              f"pairs; lower bound {'clears' if ok else 'does not clear'} the noise floor "
              f"1 + {mde:.3f}")
    return Verdict(candidate, ok, reason, s, lo, hi, mde, measured, base_ids, cand_ids)


def _open(measured: Sequence[tuple[float, float]], bar: float) -> bool:
    """Would more pairs decide? The estimate clears the bar, the interval does not yet."""
    if len(measured) < 2:
        return False
    s, lo, _ = paired_speedup([m[0] for m in measured], [m[1] for m in measured])
    return s > bar >= lo
