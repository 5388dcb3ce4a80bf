"""Acquisition: which pool candidate to run next, given the fitted models.

Expected improvement of log throughput over the best measured, times P(the trial measures
anything); capped predicted risk (with one late exception for a large expected gain); pairing a
likely-OOM candidate with a memory-saving neighbour; the seeds' joint choice; the lightest
probes; the local penalty around configs still running. Pure functions of arrays aligned with
the candidate pool (``pool``, its encoding ``X_pool``, its knob-value codes ``codes``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import norm

from infrarsi.models import FeatureEncoder
from infrarsi.models.priors import monotone_signs
from infrarsi.search._fitting import Fit
from infrarsi.search._policy import (
    EXPLORATION_MARGIN,
    FAIL_ALLOWANCE,
    NO_FIT_MIN_TRIALS,
    NO_FIT_P,
    RISK_FROM,
    RISK_GAIN_RATIO,
    RISK_MIN_GAIN,
    SUSPECT_FIT,
)
from infrarsi.search._pool import maximin
from infrarsi.space import Config, config_key


@dataclass
class Suggestion:
    """A config to try, where it came from, and what the models expected of it."""

    config: Config
    origin: str
    predicted: dict[str, float] = field(default_factory=dict)
    pairing: dict[str, Any] | None = None
    # the trial may stop once its measured steps are all slower than this (see Backend.execute)
    stop_slower_than_s: float | None = None


def predicted(fit: Fit, i: int) -> dict[str, float]:
    """What the models expect of pool candidate ``i`` (for the suggestion's record)."""
    out = {"objective": float(math.exp(-fit.mu[i])), "log_sd": float(fit.sd[i]),
           "p_oom": float(fit.p_oom[i]), "p_crash": float(fit.p_crash[i])}
    if fit.mem_median is not None:
        out["peak_memory_bytes"] = float(fit.mem_median[i])
    return out


def oom_risk_cap(max_risk: float, final_risk: float, spent: float) -> float:
    """The largest P(fail) a model-driven trial may carry: ``max_risk`` at first, shrinking
    linearly to ``final_risk`` as the share ``spent`` of the budget goes (early, a risky trial
    also teaches the memory model; late, only what it finds counts)."""
    return max_risk + (final_risk - max_risk) * min(1.0, spent)


def seed_picks(fit: Fit, X_pool: np.ndarray, pool: Sequence[Config], taken: set[str], k: int,
               max_risk: float, seed: int = 0) -> list[int]:
    """``k`` informed seeds: the best predicted candidates likely to fit (or, when none is, the
    least risky fifth), spread out by maximin distance among a ``seed``-drawn half of the top
    ``5 k``, from that half's best. Why the draw: with one fixed set, ten search seeds were one
    search (1-1.5 distinct trajectories in ten); every pick is still among the top ``5 k``."""
    safe = fit.p_fail <= max_risk
    if not safe.any():
        safe = fit.p_fail <= np.quantile(fit.p_fail, 0.2)
    safe &= np.array([config_key(c) not in taken for c in pool])
    idx = np.flatnonzero(safe)
    top = idx[np.argsort(fit.mu[idx])[: max(5 * k, k)]]
    half = np.sort(np.random.default_rng(seed).permutation(len(top))[: max(k, len(top) // 2)])
    top = top[half]
    return [int(top[j]) for j in maximin(X_pool[top], k, start=0)]


def space_filling_picks(X_pool: np.ndarray, k: int, seed: int) -> list[int]:
    """``k`` cold seeds: a maximin design from a seeded random start."""
    rng = random.Random(seed)
    start = rng.randrange(len(X_pool))
    return list(maximin(X_pool, k, start=start))


def lightest(fit: Fit, X_pool: np.ndarray, encoder: FeatureEncoder, free: np.ndarray) -> int:
    """The free candidate with the smallest predicted peak; where the memory model cannot tell
    candidates apart (no observed peak, no prior slopes), the physics signs decide (smallest
    micro-batch, most checkpointing and sharding)."""
    physics = X_pool @ monotone_signs(encoder)
    if fit.mem_median is not None:
        logm = np.log(np.maximum(fit.mem_median, 1e-30))
        if float(np.ptp(logm[free])) > 0.01:
            return int(np.argmin(np.where(free, logm + 1e-6 * physics, np.inf)))
    return int(np.argmin(np.where(free, physics, np.inf)))


def pair(i: int, fit: Fit, codes: np.ndarray, safe: np.ndarray) -> int | None:
    """Best memory-saving partner of candidate ``i`` (one or two knobs changed): the lowest time
    price per GiB saved."""
    if fit.mem_median is None:
        return None
    diff = (codes != codes[i]).sum(axis=1)
    saved = (fit.mem_median[i] - fit.mem_median) / 2**30
    near = safe & (diff >= 1) & (diff <= 2) & (saved > 0)
    if not near.any():
        return None
    price = np.where(near, np.maximum(fit.mu - fit.mu[i], 0.0) / np.where(near, saved, 1.0),
                     np.inf)
    return int(np.argmin(price))  # the first of equal prices, as the pool is ordered


def pending_penalty(X_pool: np.ndarray, pool_keys: dict[str, int],
                    pending: Iterable[Config]) -> np.ndarray:
    """Down-weight candidates next to configs still running (local penalization)."""
    pending = list(pending)
    pen = np.ones(len(X_pool))
    if not pending:
        return pen
    scale = X_pool.std(axis=0)
    scale[scale < 1e-9] = 1.0
    Z = X_pool / scale
    for c in pending:
        i = pool_keys.get(config_key(c))
        if i is not None:
            d = np.linalg.norm(Z - Z[i], axis=1)
            pen *= 1.0 - np.exp(-(d**2))
    return pen


@dataclass
class Choice:
    """The acquisition's pick: pool index ``index`` and its origin; ``hungry`` is the likely-OOM
    candidate a pairing replaced. ``stop`` instead: why no candidate is worth a trial."""

    index: int = -1
    origin: str = ""
    hungry: int | None = None
    stop: str | None = None


def choose(fit: Fit, free: np.ndarray, *, best_y: float | None, spent: float, n_trials: int,
           n_failed: int, budget: int, risk: float, penalty: np.ndarray,
           suspect: np.ndarray | None, codes: np.ndarray, seed: int = 0) -> Choice:
    """The next candidate by expected improvement times P(fit) among those within ``risk``.

    ``best_y`` is the best own log(1 / objective) (None: the best prediction stands in);
    ``suspect`` marks candidates with a setting every crash shared (treated as a failure
    risk); ``penalty`` down-weights the neighbours of pending configs; ``seed`` breaks ties
    (and near-ties within 0.1%), so that searches with other seeds part ways there.
    """
    found = best_y is not None  # has any trial measured something?
    if best_y is None:
        best_y = float(np.min(fit.mu[free]))
    xi = EXPLORATION_MARGIN * max(0.0, 1.0 - spent)  # exploration margin shrinks with the budget
    imp = best_y - fit.mu - xi
    z = imp / fit.sd
    ei = imp * norm.cdf(z) + fit.sd * norm.pdf(z)
    # penalize before masking: a pending config's penalty is 0, and -inf * 0 is NaN
    ei = np.where(free, np.maximum(ei, 1e-12) * penalty, -np.inf)
    p_fit = 1.0 - fit.p_fail
    if suspect is not None:
        p_fit = np.where(suspect, p_fit * SUSPECT_FIT, p_fit)
    acq = np.where(free, np.where(free, ei, 0.0) * p_fit, -np.inf)
    acq = acq * (1.0 + 1e-3 * np.random.default_rng(seed).random(len(acq)))  # seeded tie-break
    safe = free & (1.0 - p_fit <= risk)  # a suspect setting is a risk like an OOM is
    if not safe.any():
        if n_trials >= NO_FIT_MIN_TRIALS and float(np.max(p_fit[free])) < NO_FIT_P:
            return Choice(stop=("every remaining candidate is predicted to run out of memory "
                                f"(best P(fit) {float(np.max(p_fit[free])):.3f}); stopping to save trials"))
        # Every candidate is beyond the risk cap: each is a risky pick, worth a trial only on
        # the terms a late risky pick gets (an expected gain of RISK_MIN_GAIN, P(fit)
        # included). Without this, searches whose best was found spent their remaining
        # budget on configs predicted at P(OOM) 0.9-1.0, and ran out of memory on each. Only
        # once a trial measured something: before, the gain is over a prediction, and any
        # config that runs is the whole gain (the rule stopped searches after 4 trials with
        # nothing found: moe-single-node on A100-40GB with H100 experience, 5 of 10 seeds).
        best = float(np.max(acq[free]))
        if n_trials >= NO_FIT_MIN_TRIALS and best < RISK_MIN_GAIN and found:
            return Choice(stop=("every remaining candidate is beyond the risk cap and none "
                                f"promises enough to risk a trial (best expected gain {best:.4f}, "
                                f"below {RISK_MIN_GAIN}); stopping to save trials"))
        safe = free
    i_safe = int(np.argmax(np.where(safe, acq, -np.inf)))
    i_hungry = int(np.argmax(ei))
    choice = Choice(i_safe, "model")
    if fit.p_oom[i_hungry] > risk and i_hungry != i_safe:
        j = pair(i_hungry, fit, codes, safe)
        if j is not None and acq[j] >= acq[i_safe]:
            choice = Choice(j, "pairing", hungry=i_hungry)
    # Late, one trial riskier than the cap when its expected gain is large, several times the
    # safe pick's, and the failures so far leave room for it to fail too.
    i_risky = int(np.argmax(acq))
    if (spent >= RISK_FROM and not safe[i_risky]
            and acq[i_risky] >= max(RISK_MIN_GAIN, RISK_GAIN_RATIO * acq[choice.index])
            and n_failed + 1 <= FAIL_ALLOWANCE * budget):
        choice = Choice(i_risky, "model:risky")
    return choice
