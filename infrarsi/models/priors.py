"""Priors on what each knob setting does, how they enter the models, and how data revises them.

A :class:`KnobPrior` states the effect of ``knob=setting`` *relative to the knob's default* on
log step time and on log peak memory, each with a standard deviation (a proposer or the bank
supplies them). :func:`coef_prior` turns a list of them into a Gaussian prior on the encoder's
coefficients: a one-hot or bool column takes the stated effect directly; a log2 ordinal column
(one slope for every setting) takes the precision-weighted mean of ``effect / log2(v/default)``.

:func:`revise_priors` compares each prior with the fitted posterior and returns a
:class:`PriorRevision` per prior, ``flagged`` when the posterior effect lies outside the prior's
``z``-interval: the structured record the report and the LLM proposer read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from infrarsi.models.encoding import CONTEXT_SPANS, FeatureEncoder
from infrarsi.models.physics import (
    CONTEXT_MEMORY_STD,
    MEMORY_ESTIMATED_KNOBS,
    PHYSICS_PRIORS,
    TIME_ESTIMATED_KNOBS,
)

# Physics that holds for every dense transformer we train: the sign of a knob's effect on peak
# memory per device (+1: a larger value / non-default setting never uses less; -1: never more).
# Names cover the torch workload's launch names and the playbook table's short names.
MEMORY_MONOTONE: dict[str, int] = {
    "micro_batch_size": +1,
    "mbs": +1,
    "activation_checkpointing": -1,  # relative to the default "none"
    "tensor_parallel_degree": -1,
    "tp": -1,
    "pipeline_parallel_degree": -1,
    "pp": -1,
    "zero": -1,
    "zero_stage": -1,
}


@dataclass(frozen=True)
class KnobPrior:
    """Expected effect of ``knob=setting`` vs the knob's default, on log scales.

    ``log_time_effect=-0.1`` means about 10% faster steps; a ``None`` effect means no opinion
    on that target. ``source`` names who said so ("expert:rule-name", "bank", "llm:model").
    """

    knob: str
    setting: Any
    log_time_effect: float | None = None
    log_time_std: float = 0.5
    log_mem_effect: float | None = None
    log_mem_std: float = 0.5
    source: str = ""

    def effect(self, target: str) -> tuple[float | None, float]:
        if target == "time":
            return self.log_time_effect, self.log_time_std
        if target == "memory":
            return self.log_mem_effect, self.log_mem_std
        raise ValueError(f"target must be 'time' or 'memory', got {target!r}")


@dataclass(frozen=True)
class PriorRevision:
    """A prior next to what the data say about it (log-scale effects vs the default)."""

    knob: str
    setting: Any
    target: str  # "time" | "memory"
    prior_mean: float
    prior_std: float
    posterior_mean: float
    posterior_std: float
    evidence_n: int  # fitted trials run at this setting
    flagged: bool  # posterior mean outside the prior's interval
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def coef_prior(
    encoder: FeatureEncoder,
    priors: Iterable[KnobPrior] = (),
    target: str = "time",
    default_std: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian prior ``(mean, std)`` on every encoder column's coefficient.

    Columns without a prior get mean 0 and ``default_std`` (weak: a factor 2 per log2 unit).
    The encoder's physics columns take :data:`~infrarsi.models.physics.PHYSICS_PRIORS`. Where
    the memory estimate is a column, the built-in expert rules' memory effects of the knobs it
    accounts for centre on 0 (same std): those rules are a first-order napkin of their own, and
    counting the effect twice would double it. Priors from elsewhere (the bank's measured
    effects, an LLM) are kept as stated: they may know what the napkin misses. The workload
    and hardware columns, whose size effects the estimate carries, then take a tight prior
    around 0 (:data:`~infrarsi.models.physics.CONTEXT_MEMORY_STD` per span of each). Likewise
    for time, where the compute estimate (device-seconds per token) is a column: the expert
    rules' time effects of the knobs it carries (micro-batch, recompute) centre on 0.
    """
    encoder._check_fitted()
    physics = {c.name: j for j, c in enumerate(encoder.columns_) if c.kind == "physics"}
    estimated = target == "memory" and "phys_log2_mem_gib" in physics
    # the same for time: the compute estimate carries the micro-batch and recompute effects
    time_estimated = target == "time" and "phys_log_s_per_token" in physics
    p = encoder.n_features_out_
    prec = np.zeros(p)
    wsum = np.zeros(p)
    for pr in priors:
        eff, sd = pr.effect(target)
        if eff is None or not math.isfinite(eff):
            continue
        if estimated and pr.knob in MEMORY_ESTIMATED_KNOBS and pr.source.startswith("expert:"):
            eff = 0.0
        if time_estimated and pr.knob in TIME_ESTIMATED_KNOBS and pr.source.startswith("expert:"):
            eff = 0.0
        delta = encoder.setting_delta(pr.knob, pr.setting)
        for j in np.flatnonzero(delta):
            # effect = beta_j * delta_j  =>  beta_j ~ N(eff / delta_j, (sd / |delta_j|)^2)
            w = (delta[j] / max(sd, 1e-6)) ** 2
            prec[j] += w
            wsum[j] += w * eff / delta[j]
    mean = np.where(prec > 0, wsum / np.maximum(prec, 1e-300), 0.0)
    std = np.where(prec > 0, 1.0 / np.sqrt(np.maximum(prec, 1e-300)), default_std)
    if estimated:
        for j, c in enumerate(encoder.columns_):
            if c.kind in ("workload", "hardware") and c.name in CONTEXT_SPANS:
                mean[j], std[j] = 0.0, CONTEXT_MEMORY_STD / CONTEXT_SPANS[c.name]
    for name, j in physics.items():
        if (target, name) in PHYSICS_PRIORS:
            mean[j], std[j] = PHYSICS_PRIORS[target, name]
    return mean, std


def monotone_signs(encoder: FeatureEncoder, physics: dict[str, int] | None = None) -> np.ndarray:
    """Per-column sign constraint (+1, -1, 0 none) from knob-level physics."""
    encoder._check_fitted()
    physics = MEMORY_MONOTONE if physics is None else physics
    signs = np.zeros(encoder.n_features_out_)
    for j, c in enumerate(encoder.columns_):
        if c.knob in physics:
            signs[j] = physics[c.knob]
        elif c.kind == "physics" and c.name == "phys_log2_mem_gib":
            signs[j] = +1  # the napkin estimate of peak memory cannot predict less for more
    return signs


def revise_priors(
    priors: Sequence[KnobPrior],
    encoder: FeatureEncoder,
    time_model: Any = None,
    memory_model: Any = None,
    z: float = 1.96,
) -> list[PriorRevision]:
    """One :class:`PriorRevision` per (prior, target) that a fitted model can judge.

    A model takes part when it is fitted and exposes ``coef_posterior()`` -> ``(mean, cov)``
    over the encoder's columns and ``setting_counts(delta)`` -> trials at a setting.
    """
    out: list[PriorRevision] = []
    for target, model in (("time", time_model), ("memory", memory_model)):
        if model is None or not hasattr(model, "coef_posterior"):
            continue
        try:
            mean, cov = model.coef_posterior()
        except Exception:  # noqa: BLE001 - an unfitted or fallen-back model judges nothing
            continue
        for pr in priors:
            eff, sd = pr.effect(target)
            if eff is None:
                continue
            d = encoder.setting_delta(pr.knob, pr.setting)
            post = float(d @ mean)
            post_sd = float(math.sqrt(max(d @ cov @ d, 0.0)))
            n = int(model.setting_counts(d)) if hasattr(model, "setting_counts") else 0
            flagged = n > 0 and abs(post - eff) > z * sd
            out.append(PriorRevision(pr.knob, pr.setting, target, float(eff), float(sd),
                                     post, post_sd, n, bool(flagged), pr.source))
    return out
