"""Statistics of noise and paired speedups: the one place doctor and the search share.

Low level on purpose (it imports nothing of InfraRSI): doctor measures the noise model, the
run stage's verifier judges candidates with :func:`paired_speedup` against the floor
:func:`mde_at_pairs` gives, and both speak of the same method and defaults.

The noise model: how much a baseline's step time moves, and the smallest effect to trust.

Model (on log step times, so a CV and a log-SD are the same number for small noise):

* within-run: step-to-step jitter, ``sigma_w`` = pooled robust SD (1.4826 x median absolute
  deviation) of log step times inside each trial, so one stalled step does not set it;
* between-run: trial-to-trial shift, ``sigma_b``. A trial is summarized by its median measured
  step (as :class:`~infrarsi.trial.TrialRecord` does), whose log has variance
  ``sigma_b**2 + (pi/2) * sigma_w**2 / m`` for ``m`` measured steps (the median's efficiency
  under normal noise). ``between_cv`` is the observed SD of the trials' log medians;
  ``sigma_b`` is what is left of its variance after the within-run part.

Comparison method (:func:`paired_speedup`, used by ``infrarsi.search.verify``): ``pairs`` interleaved baseline/candidate
trials, a two-sided Student-t interval on the mean log ratio. For a null effect that interval
has half-width ``t(0.975, pairs-1) * sqrt(2) * sigma_trial(m) / sqrt(pairs)``; the minimum
detectable effect ``mde`` is ``exp(half-width) - 1``: a speedup smaller than this cannot be told
from this machine's noise with that many pairs of ``m``-step trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scipy import stats

__all__ = ["DEFAULT_MDE", "DEFAULT_PAIRS", "MIN_PAIRS", "MEDIAN_EFFICIENCY", "mde_at_pairs", "mde_for",
           "noise_model", "paired_speedup", "required_pairs", "required_steps"]

MEDIAN_EFFICIENCY = math.pi / 2  # variance of a normal sample's median / variance of its mean
MAX_PAIRS = 50
# Verification pairs by default (doctor's figure and `infrarsi run`): with 3 pairs the t
# quantile alone (4.30) makes the floor ~2.3x what 5 pairs (2.78) give at the same noise.
DEFAULT_PAIRS = 5
# The fewest verification pairs `infrarsi run` accepts: one pair has no interval; two leave the
# t interval one degree of freedom (95% quantile 12.7 against 4.3 for three), so the lower bound
# clears the noise floor only for a candidate about exp(2 * 12.7 * sd / sqrt 2) faster (1.4x at
# a 2% pair-to-pair noise): on measured machines, nothing is promoted.
MIN_PAIRS = 3
# The noise floor (a fraction) when no doctor run measured one, and doctor's default target.
DEFAULT_MDE = 0.05
MAX_STEPS = 10_000
METHOD = ("interleaved baseline/candidate pairs (A B A B ...), speedup per pair = baseline / "
          "candidate median step; two-sided Student-t 95% interval on the mean log ratio "
          "(infrarsi.stats.paired_speedup)")


def _sd(xs: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mean = sum(xs) / n
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))


def paired_speedup(baseline_s: Sequence[float], candidate_s: Sequence[float],
                   confidence: float = 0.95) -> tuple[float, float, float]:
    """(speedup, lower, upper) from paired step times; a single pair has an infinite interval."""
    logs = [math.log(b / c) for b, c in zip(baseline_s, candidate_s, strict=True)]
    n = len(logs)
    if n == 0:
        raise ValueError("no pairs to compare")
    mean = sum(logs) / n
    if n == 1:
        return math.exp(mean), 0.0, math.inf
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _t(pairs: int, confidence: float) -> float:
    return float(stats.t.ppf(0.5 + confidence / 2, max(pairs - 1, 1)))


def trial_sigma(sigma_b: float, sigma_w: float, steps: int) -> float:
    """SD of one trial's log median step for ``steps`` measured steps."""
    return math.sqrt(sigma_b**2 + MEDIAN_EFFICIENCY * sigma_w**2 / max(steps, 1))


def mde_for(sigma_b: float, sigma_w: float, steps: int, pairs: int,
            confidence: float = 0.95) -> float:
    """Minimum detectable effect (a fraction) of ``pairs`` pairs of ``steps``-step trials."""
    if pairs < 2:
        return math.inf  # one pair has no interval (paired_speedup gives [0, inf])
    half = _t(pairs, confidence) * math.sqrt(2) * trial_sigma(sigma_b, sigma_w, steps) / math.sqrt(pairs)
    return math.expm1(half)


def mde_at_pairs(noise: dict[str, Any], pairs: int, confidence: float = 0.95) -> float:
    """The MDE of a :func:`noise_model` payload for a verification of ``pairs`` pairs (the
    payload's own ``mde`` is for the pairs doctor planned with). A payload without the noise
    components (older banks) keeps its own figure."""
    if noise.get("within_cv") is None or not noise.get("measured_steps"):
        return float(noise["mde"])
    sigma_b = noise.get("sigma_between")
    sigma_b = 0.0 if sigma_b is None or math.isnan(sigma_b) else float(sigma_b)
    return mde_for(sigma_b, float(noise["within_cv"]), int(noise["measured_steps"]), pairs,
                   confidence)


def required_steps(sigma_b: float, sigma_w: float, pairs: int, target: float,
                   confidence: float = 0.95) -> int | None:
    """Fewest measured steps whose MDE is at most ``target``; None if no length reaches it
    (the between-run part alone is too large: more pairs are needed, not longer trials)."""
    if pairs < 2:
        return None
    limit = math.log1p(target) * math.sqrt(pairs) / (_t(pairs, confidence) * math.sqrt(2))
    room = limit**2 - sigma_b**2
    if room <= 0:
        return None
    steps = max(2, math.ceil(MEDIAN_EFFICIENCY * sigma_w**2 / room))
    return steps if steps <= MAX_STEPS else None


def required_pairs(sigma_b: float, sigma_w: float, steps: int, target: float,
                   confidence: float = 0.95) -> int | None:
    """Fewest verification pairs whose MDE at ``steps`` is at most ``target`` (None: > 50);
    never below ``MIN_PAIRS``, the fewest `infrarsi run` accepts."""
    for n in range(MIN_PAIRS, MAX_PAIRS + 1):
        if mde_for(sigma_b, sigma_w, steps, n, confidence) <= target:
            return n
    return None


def noise_model(series: Sequence[Sequence[float]], *, pairs: int = DEFAULT_PAIRS, target_mde: float = DEFAULT_MDE,
                confidence: float = 0.95) -> dict[str, Any]:
    """The noise model of repeated baseline trials (``series``: each trial's measured steps).

    Returns the payload's ``noise`` dict: ``mde`` (the threshold the verifier uses),
    ``within_cv``, ``between_cv``, ``sigma_between``, ``method``, ``pairs``, ``measured_steps``,
    ``repeats``, ``target_mde``, ``too_noisy``, ``required_measured_steps``,
    ``required_pairs``, ``required_measured_steps_within_only``, ``advice``.
    """
    trials = [[float(x) for x in s if x > 0] for s in series]
    trials = [s for s in trials if len(s) >= 2]
    if not trials:
        raise ValueError("the noise model needs at least one trial with two measured steps")
    sigma_w = _robust_within_sd([[math.log(x) for x in s] for s in trials])
    steps = round(sum(len(s) for s in trials) / len(trials))
    medians = [_median(s) for s in trials]
    between = _sd([math.log(m) for m in medians])
    sigma_b = math.sqrt(max(between**2 - MEDIAN_EFFICIENCY * sigma_w**2 / steps, 0.0))
    if len(trials) < 2:
        between = sigma_b = float("nan")
    sb = 0.0 if math.isnan(sigma_b) else sigma_b
    mde = mde_for(sb, sigma_w, steps, pairs, confidence)
    need_steps = required_steps(sb, sigma_w, pairs, target_mde, confidence)
    need_pairs = required_pairs(sb, sigma_w, steps, target_mde, confidence)
    too_noisy = mde > target_mde
    model = {
        "mde": mde,
        "within_cv": sigma_w,
        "between_cv": between,
        "sigma_between": sigma_b,
        "trial_cv": trial_sigma(sb, sigma_w, steps),
        "method": METHOD,
        "confidence": confidence,
        "pairs": pairs,
        "measured_steps": steps,
        "repeats": len(trials),
        "trial_medians_s": medians,
        "target_mde": target_mde,
        "too_noisy": too_noisy,
        "required_measured_steps": need_steps,
        "required_pairs": need_pairs,
        # What trial length the step-to-step jitter alone asks for (a machine quiet between runs).
        "required_measured_steps_within_only": required_steps(0.0, sigma_w, pairs, target_mde,
                                                              confidence),
    }
    # the same answer doctor and the report give (verification_advice)
    model["advice"] = verification_advice(model, target=target_mde, pairs=pairs,
                                          confidence=confidence)["text"]
    return model


def _robust_within_sd(logs: Sequence[Sequence[float]]) -> float:
    """Step-to-step SD of log step times, robust to a stray step.

    A trial is summarized by its *median* step, which a single stalled step (a GC pause, a
    scheduler hiccup, a page-cache miss) barely moves; a plain SD would let that one step set
    the noise floor (measured on this 2-core box: one 3x step in 15 made the SD 42% and the
    MDE 129%, while the verifier's interleaved pairs then agreed within +-3%). So: 1.4826 x
    the median absolute deviation from each trial's median (consistent for normal noise),
    pooled over trials, the odd trials' own medians (deviation 0 by construction) left out.
    """
    devs: list[float] = []
    for s in logs:
        m = _median(s)
        d = sorted(abs(y - m) for y in s)
        devs += d[1:] if len(s) % 2 else d
    return 1.4826 * _median(devs) if devs else 0.0


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def verification_advice(noise: dict[str, Any] | None, *, target: float, pairs: int,
                        steps: int | None = None, confidence: float | None = None
                        ) -> dict[str, Any]:
    """``{"remedy", "mde", "required_pairs", "required_steps", "text"}`` for resolving an effect
    of ``target`` (a fraction) with ``pairs`` interleaved pairs of ``steps`` measured steps
    (default: doctor's trial length) under ``noise`` (doctor's :func:`noise_model` payload)."""
    if not noise or noise.get("within_cv") is None or not noise.get("measured_steps"):
        return {"remedy": "unknown", "mde": None, "required_pairs": None, "required_steps": None,
                "text": "no doctor noise model with its components: run `infrarsi doctor` to "
                        "learn whether more pairs or longer trials would resolve it"}
    sb = noise.get("sigma_between")
    sb = 0.0 if sb is None or math.isnan(sb) else float(sb)
    sw = float(noise["within_cv"])
    steps = int(steps or noise["measured_steps"])
    conf = float(confidence or noise.get("confidence") or 0.95)
    mde = mde_for(sb, sw, steps, pairs, conf)
    need_pairs = required_pairs(sb, sw, steps, target, conf)
    need_steps = required_steps(sb, sw, pairs, target, conf)
    text = (f"with {pairs} verification pairs of {steps}-step trials the smallest trustworthy "
            f"speedup is {mde:.1%}")
    if (noise.get("repeats") or 2) < 2:
        text += " (between-run noise unmeasured: one repeat; run doctor with --repeats 3)"
    if mde <= target:
        return {"remedy": "none", "mde": mde, "required_pairs": need_pairs,
                "required_steps": need_steps, "text": text + f", within {target:.1%}."}
    fix = []
    if need_steps is not None:
        fix.append(f"set timing.measured_steps to {need_steps} in the task spec (and re-run init)")
    if need_pairs is not None:
        fix.append(f"verify with --pairs {need_pairs}")
    if not fix:
        return {"remedy": "quiet", "mde": mde, "required_pairs": None, "required_steps": None,
                "text": text + f": too noisy for {target:.1%}; neither longer trials nor up to "
                               f"{MAX_PAIRS} pairs reach it: the trial-to-trial shifts "
                               "(between-run noise) dominate. Quiet the machine (other jobs "
                               "share it) or accept a larger effect."}
    remedy = "pairs_or_steps" if len(fix) == 2 else ("steps" if need_steps else "pairs")
    return {"remedy": remedy, "mde": mde, "required_pairs": need_pairs,
            "required_steps": need_steps,
            "text": text + f": too noisy for {target:.1%}. To reach it: " + ", or ".join(fix) + "."}
