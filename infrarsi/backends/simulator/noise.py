"""The simulator's machine noise fitted to real A/A trials (``scripts/bench_verify.py``).

Input: the step times of real trials of one config in the order they ran, in interleaved pairs
(trials ``2i`` and ``2i + 1`` are pair ``i``: the baseline against itself). The model the
simulator draws from (``SimParams.noise_*``), on log step times:

* a step's jitter: normal with SD ``noise_step_cv`` (robust: 1.4826 x the median absolute
  deviation from the trial's median), and a *stall* (a step far slower than the jitter allows:
  more than ``STALL_SDS`` SDs above its trial's median, which normal noise does with
  probability 0.1%) with probability ``noise_stall_prob``, ``noise_stall_factor`` times slower
  (their median excess);
* a trial's shift: ``noise_trial_cv`` independent per trial, plus a slow load level shared by
  consecutive trials (AR(1), stationary SD ``noise_drift_cv``, lag-1 correlation
  ``noise_drift_rho``). Of a trial's log median, with ``c sw^2 / m`` its median's jitter
  (``c`` = pi/2): ``var(L) = drift^2 + trial^2 + c sw^2 / m`` over all trials, while the
  difference inside a pair cancels most of the drift, ``var(dL) / 2 = (1 - rho) drift^2 +
  trial^2 + c sw^2 / m``; ``rho`` comes from the lag-1 correlation of the pair means
  (``rho_pair = rho^2``). Few pairs estimate ``rho`` roughly: it is clamped to [0, 0.99].

Imports nothing of doctor (doctor imports the backends): the few robust statistics are here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["STALL_SDS", "fit_noise"]

STALL_SDS = 3.0
MEDIAN_EFFICIENCY = math.pi / 2  # as in infrarsi.doctor.noise


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _var(xs: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return sum((x - m) ** 2 for x in xs) / (n - 1)


def fit_noise(trials: Sequence[Sequence[float]]) -> dict[str, Any]:
    """``SimParams.noise_*`` (and the figures behind them) from interleaved A/A trials' step
    times, in the order they ran (module docstring). Needs at least two pairs."""
    logs = [[math.log(x) for x in t if x > 0] for t in trials]
    if len(logs) < 4 or any(len(t) < 2 for t in logs):
        raise ValueError("fit_noise needs at least two A/A pairs (four trials) of two or more "
                         "measured steps each")
    devs, excess = [], []
    for t in logs:
        med = _median(t)
        devs += [abs(y - med) for y in t]
    sw = 1.4826 * _median(devs)
    for t in logs:
        med = _median(t)
        excess += [y - med for y in t if sw > 0 and y - med > STALL_SDS * sw]
    n_steps = sum(len(t) for t in logs)
    m = round(n_steps / len(logs))
    medians = [_median(t) for t in logs]
    n_pairs = len(medians) // 2
    diffs = [medians[2 * i] - medians[2 * i + 1] for i in range(n_pairs)]
    means = [(medians[2 * i] + medians[2 * i + 1]) / 2 for i in range(n_pairs)]
    jitter = MEDIAN_EFFICIENCY * sw**2 / m
    var_all, half_diff = _var(medians[: 2 * n_pairs]), _var(diffs + [-d for d in diffs]) / 2
    rho = 0.0
    if n_pairs >= 3 and _var(means) > 0:
        mu = sum(means) / n_pairs
        cov = sum((a - mu) * (b - mu) for a, b in zip(means, means[1:], strict=False)) / (n_pairs - 1)
        rho = min(max(cov / _var(means), 0.0), 0.99) ** 0.5
    drift = math.sqrt(max(var_all - half_diff, 0.0) / rho) if rho > 0 else 0.0
    trial = math.sqrt(max(half_diff - jitter - (1 - rho) * drift**2, 0.0))
    return {
        "noise_step_cv": sw,
        "noise_stall_prob": len(excess) / n_steps,
        "noise_stall_factor": math.exp(_median(excess)) if excess else 2.0,
        "noise_trial_cv": trial,
        "noise_drift_cv": drift,
        "noise_drift_rho": min(rho, 0.99),
        "measured_steps": m,
        "pairs": n_pairs,
        "pair_log_ratio_sd": math.sqrt(2 * half_diff),
    }
