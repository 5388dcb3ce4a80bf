"""Verification: re-measure a candidate interleaved with the untouched baseline (A B A B ...).

Method (the one doctor's noise model assumes): each pair runs the baseline, then the candidate,
on the same resources; the speedup of a pair is baseline step time / candidate step time (each a
trial's median measured step). A Student-t bound on the mean log ratio gives the speedup and its
interval; pairing cancels slow drifts of a shared, noisy machine.

Promotion rule (:func:`judge`): a candidate is promoted when the one-sided lower confidence bound
of the speedup, computed from *this verification's own pairs*, exceeds ``1 + min_effect`` (the
user's minimum worthwhile effect, task spec ``verify.min_effect``, default 3%), and every
candidate trial kept the contract's loss/work invariants (a trial that broke them is not ok and
ends the verification). The bar does not depend on doctor's noise model: the interleaved pairs'
interval already carries the between-run noise the MDE summarizes, so the MDE is a *planning*
figure (how many pairs to run, when to stop), never a second bar.

False promotion rate: at most ``FALSE_PROMOTION_RATE`` (5%, one-sided) for a candidate whose true
speedup is ``1 + min_effect``; a candidate no faster than the baseline (A/A) is promoted less
often still. Sequential looks do not inflate it: the looks are fixed before the first pair
(:func:`look_schedule`: the planned pairs, then about 1.5x more each, up to ``max_pairs``) and
look ``k`` tests at the increment ``alpha(t_k) - alpha(t_{k-1})`` of a Lan-DeMets Pocock-type
spending function ``alpha(t) = FALSE_PROMOTION_RATE * ln(1 + (e - 1) t)`` (``t`` = pairs /
``max_pairs``); by the union bound the looks together promote a null candidate at most
``alpha(1)`` = 5% of the time, however the looks are correlated. Stopping early for futility
(the interval settled below the bar, or the pairs' own noise says even ``max_pairs`` could not
clear it) only lowers that rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scipy import stats

from infrarsi.backends.base import Backend
from infrarsi.space import Config
from infrarsi.stats import DEFAULT_MDE, paired_speedup  # noqa: F401 (re-exported)
from infrarsi.trial import TrialRecord

__all__ = ["DEFAULT_MDE", "DEFAULT_MIN_EFFECT", "FALSE_PROMOTION_RATE", "Verdict", "paired_speedup",
           "verify_candidate"]
# The smallest speedup worth promoting (task spec verify.min_effect): 3% above the baseline.
DEFAULT_MIN_EFFECT = 0.03
# The false-promotion rate the rule targets, one-sided, over all of a verification's looks.
FALSE_PROMOTION_RATE = 0.05
# Each extra look runs about this many times the pairs of the one before.
LOOK_GROWTH = 1.5


def _log_ratio_stats(baseline_s: Sequence[float],
                     candidate_s: Sequence[float]) -> tuple[float, float, int]:
    logs = [math.log(b / c) for b, c in zip(baseline_s, candidate_s, strict=True)]
    n = len(logs)
    if n == 0:
        raise ValueError("no pairs to compare")
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1)) if n > 1 else math.inf
    return mean, sd, n


def spent_alpha(t: float, rate: float = FALSE_PROMOTION_RATE) -> float:
    """Lan-DeMets Pocock-type spending: the false-promotion rate allowed by information
    fraction ``t`` (0..1); front-loaded, so the planned look keeps most of the rate."""
    return rate * math.log1p((math.e - 1.0) * min(max(t, 0.0), 1.0))


def look_schedule(pairs: int, max_pairs: int | None = None) -> list[int]:
    """The pair counts at which a verification looks, fixed before its first pair: ``pairs``,
    then ~1.5x more each time, the last at ``max_pairs``."""
    first = max(int(pairs), 2)
    cap = max(int(max_pairs or first), first)
    looks = [first]
    while looks[-1] < cap:
        looks.append(min(cap, max(looks[-1] + 1, math.ceil(looks[-1] * LOOK_GROWTH))))
    return looks


def look_alphas(looks: Sequence[int], rate: float = FALSE_PROMOTION_RATE) -> list[float]:
    """Each look's one-sided level: its increment of :func:`spent_alpha` (sums to ``rate``)."""
    cap = looks[-1]
    spent = [spent_alpha(n / cap, rate) for n in looks]
    return [spent[0]] + [b - a for a, b in zip(spent, spent[1:], strict=False)]


def lower_bound(mean: float, sd: float, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) lower confidence bound of exp(mean log ratio) from ``n`` pairs."""
    if n < 2 or not math.isfinite(sd):
        return 0.0
    return math.exp(mean - stats.t.ppf(1.0 - alpha, n - 1) * sd / math.sqrt(n))


def pairs_needed(mean: float, sd: float, bar: float, alpha: float, cap: int) -> int | None:
    """Fewest pairs whose lower bound at level ``alpha`` would clear ``bar`` if the pairs so far
    (log-ratio ``mean`` and ``sd``) are typical: the MDE re-estimated from the verification's own
    pairs. None when the estimate does not clear the bar or more than ``cap`` pairs are needed."""
    if mean <= math.log(bar):
        return None
    for n in range(2, cap + 1):
        if lower_bound(mean, sd, n, alpha) > bar:
            return n
    return None


@dataclass(frozen=True)
class Verdict:
    """The evidence behind promoting (or not) one candidate.

    ``ci_low``/``ci_high``: the decision interval, two-sided at ``confidence`` = 1 - 2 alpha of
    the look that ended the verification (its lower end is the one-sided bound the rule tests).
    ``mde`` is doctor's planning figure for the planned pairs, not a bar; ``min_effect`` is."""

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
    min_effect: float = DEFAULT_MIN_EFFECT
    confidence: float = 1.0 - 2 * FALSE_PROMOTION_RATE
    alpha: float = FALSE_PROMOTION_RATE
    looks: list[int] = field(default_factory=list)
    false_promotion_rate: float = FALSE_PROMOTION_RATE
    measured_steps: int | None = None  # per trial, when the verification chose the length

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The pairs' own SD is trusted for a futility stop from this many pairs on (from 3 it is too
# rough: a noisy but real 1.5x was refused early in 2 of 5 toy verifications).
FUTILITY_FROM = 5
# ...and only when even this many times the cap would not clear the bar: the re-estimate takes
# the point estimate as the truth, which a noisy 5-pair estimate is not.
FUTILITY_REACH = 2


def judge(measured: Sequence[tuple[float, float]], *, min_effect: float, alpha: float,
          final: bool, cap: int, final_alpha: float | None = None) -> tuple[str, float, float, float]:
    """One look at the pairs so far: ``("promote" | "refuse" | "continue", speedup, lo, hi)``.

    Promote when the one-sided (1 - alpha) lower bound clears ``1 + min_effect``; refuse at the
    last look, or earlier when the verdict is settled below the bar: the estimate does not
    clear it, or (from ``FUTILITY_FROM`` pairs) the pairs' own noise says even twice ``cap`` pairs at
    the last look's level ``final_alpha`` could not."""
    mean, sd, n = _log_ratio_stats([m[0] for m in measured], [m[1] for m in measured])
    bar = 1.0 + min_effect
    lo = lower_bound(mean, sd, n, alpha)
    hi = math.exp(2 * mean) / lo if lo > 0 else math.inf
    if lo > bar:
        return "promote", math.exp(mean), lo, hi
    futile = mean <= math.log(bar) or (
        n >= FUTILITY_FROM
        and pairs_needed(mean, sd, bar, final_alpha or alpha, FUTILITY_REACH * cap) is None)
    if final or futile:
        return "refuse", math.exp(mean), lo, hi
    return "continue", math.exp(mean), lo, hi


def verify_candidate(backend: Backend, baseline: Config, candidate: Config, *, pairs: int,
                     tag: str, mde: float = DEFAULT_MDE,
                     min_effect: float = DEFAULT_MIN_EFFECT,
                     on_record: Callable[[TrialRecord, str], None] | None = None,
                     max_pairs: int | None = None, measured_steps: int | None = None) -> Verdict:
    """Run interleaved baseline/candidate pairs and judge the candidate (module docstring):
    look at ``pairs`` pairs, then at the later looks of :func:`look_schedule` up to
    ``max_pairs`` while the verdict is open. ``mde`` (doctor's planning figure) and
    ``measured_steps`` (the trial length ``backend`` runs, :func:`plan_trial_length`) are
    recorded."""
    looks = look_schedule(pairs, max_pairs)
    alphas = look_alphas(looks)
    base_ids: list[str] = []
    cand_ids: list[str] = []
    measured: list[tuple[float, float]] = []
    common = {"mde": mde, "min_effect": min_effect, "looks": looks,
              "measured_steps": measured_steps}
    i = 0
    for k, (n_look, alpha) in enumerate(zip(looks, alphas, strict=True)):
        while i < n_look:
            b = backend.execute(baseline, trial_id=f"{tag}-A{i}")
            c = backend.execute(candidate, trial_id=f"{tag}-B{i}")
            for rec, origin in ((b, "verify:baseline"), (c, "verify:candidate")):
                if on_record is not None:
                    on_record(rec, origin)
            base_ids.append(b.trial_id)
            cand_ids.append(c.trial_id)
            i += 1
            if not c.ok:
                return Verdict(candidate, False,
                               f"candidate trial {c.trial_id} was {c.status.value}: "
                               f"{c.error_message or 'no measurement'}", pairs=measured,
                               baseline_trials=base_ids, candidate_trials=cand_ids, **common)
            if b.ok:
                measured.append((b.step_time_s, c.step_time_s))
        if len(measured) < 2:
            if k == len(looks) - 1:
                break
            continue
        final = k == len(looks) - 1
        decision, s, lo, hi = judge(measured, min_effect=min_effect, alpha=alpha, final=final,
                                    cap=looks[-1], final_alpha=alphas[-1])
        if decision != "continue":
            ok = decision == "promote"
            reason = (f"speedup {s:.3f}x, one-sided {1 - alpha:.1%} lower bound {lo:.3f} over "
                      f"{len(measured)} interleaved pairs (look {k + 1} of {len(looks)}); "
                      f"{'clears' if ok else 'does not clear'} the minimum worthwhile effect "
                      f"1 + {min_effect:.3f}"
                      + ("" if ok or final else "; stopped early: more pairs would not clear it"))
            return Verdict(candidate, ok, reason, s, lo, hi, pairs=measured,
                           baseline_trials=base_ids, candidate_trials=cand_ids,
                           confidence=1 - 2 * alpha, alpha=alpha, **common)
    return Verdict(candidate, False, "fewer than two baseline trials completed; nothing to "
                   "compare", pairs=measured, baseline_trials=base_ids, candidate_trials=cand_ids,
                   **common)


def plan_pairs(noise: dict[str, Any] | None, *, min_effect: float, expected_speedup: float | None,
               default: int, cap: int, steps: int | None = None) -> int:
    """Pairs to plan for the first look: the fewest whose lower bound would clear
    ``1 + min_effect`` at doctor's per-trial noise (for trials of ``steps`` measured steps,
    default doctor's length) if the search's estimate ``expected_speedup`` holds (at least
    ``default``, at most ``cap``). Planning only: the verdict never uses it."""
    from infrarsi.stats import trial_sigma

    if not noise or not expected_speedup or noise.get("within_cv") is None:
        return default
    sigma_b = noise.get("sigma_between") or 0.0
    sigma = trial_sigma(0.0 if math.isnan(sigma_b) else sigma_b, float(noise["within_cv"]),
                        int(steps or noise.get("measured_steps") or 1))
    alpha = look_alphas(look_schedule(default, cap))[0]
    need = pairs_needed(math.log(expected_speedup), math.sqrt(2) * sigma, 1.0 + min_effect,
                        alpha, cap)
    return min(max(default, need or default), cap)


# A verification trial measures at most this many times the contract's measured steps: the
# cost-optimal length grows without bound as the between-run noise goes to zero, and a long
# trial is one a shifting machine can hit halfway.
MAX_LENGTHEN = 4


def trial_overhead_steps(records: Sequence[TrialRecord]) -> float | None:
    """A trial's fixed cost (start-up, warm-up, loss-reference steps: its wall time outside the
    measured steps) in units of its median step, the median over ``records`` that ran."""
    vals = sorted((r.wall_seconds - sum(r.step_times_s)) / r.step_time_s for r in records
                  if r.ok and r.step_time_s and r.step_times_s and r.wall_seconds)
    return vals[len(vals) // 2] if vals else None


def plan_trial_length(noise: dict[str, Any] | None, *, steps: int, overhead_steps: float | None,
                      max_steps: int | None = None) -> tuple[int, str]:
    """Measured steps per verification trial that make a verdict cheapest, and why.

    A trial of ``m`` measured steps costs ``(o + m)`` steps (``o``: its fixed cost,
    :func:`trial_overhead_steps`); its log median has variance ``sb^2 + c sw^2 / m``
    (``c`` = pi/2, doctor's noise model), and the pairs a verdict needs scale with that
    variance, so the device time of a verdict goes as ``(o + m)(sb^2 + c sw^2 / m)``. Its
    minimum is at ``m* = sw sqrt(c o) / sb``: when the step-to-step jitter dominates (``m*``
    above the contract's ``steps``) the trials run longer, up to ``max_steps`` (default
    ``MAX_LENGTHEN`` x ``steps``); when the between-run shifts dominate (``m*`` at or below it)
    the length stays and the planner adds pairs instead (:func:`plan_pairs`). Never shorter than
    the contract's ``steps``: they are what the harness times per step, and a longer trial
    times every step the same way (same warm-up, clock and loss check; only more steps)."""
    from infrarsi.stats import MEDIAN_EFFICIENCY

    cap = max(steps, int(max_steps) if max_steps else MAX_LENGTHEN * steps)
    if not noise or noise.get("within_cv") is None or overhead_steps is None:
        return steps, "no noise model: the contract's trial length"
    sw = float(noise["within_cv"])
    sb = noise.get("sigma_between")
    sb = 0.0 if sb is None or math.isnan(sb) else float(sb)
    within, between = MEDIAN_EFFICIENCY * sw**2 / steps, sb**2
    if sw <= 0.0 or within <= between:
        return steps, (f"between-run shifts dominate (trial-to-trial {sb:.1%} vs step jitter "
                       f"{math.sqrt(within):.1%} at {steps} steps): more pairs, not longer trials")
    best = cap if sb <= 0.0 else sw * math.sqrt(MEDIAN_EFFICIENCY * max(overhead_steps, 0.0)) / sb
    chosen = min(cap, max(steps, math.ceil(best)))
    return chosen, (f"step jitter dominates ({math.sqrt(within):.1%} at {steps} steps vs "
                    f"trial-to-trial {sb:.1%}): {chosen} measured steps per trial "
                    f"(cost-optimal {best:.0f}, cap {cap})")
