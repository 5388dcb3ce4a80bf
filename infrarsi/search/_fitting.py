"""The search's models: experience selection, the experience fit (cached), own-trial fits.

Experience (other workloads and hardware) is fitted once per search -- or once per
:class:`ExperienceCache` shared by searches with the same experience -- and its predictions are
the prior mean of the own-trial fits, its coefficient posterior their prior. Own trials then
fit only the *difference*, so a few trials move the prediction and a suggestion costs a fit on
tens of rows, not thousands.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from infrarsi.models import FeatureEncoder, KnobPrior, PeakMemoryModel, StepTimeModel
from infrarsi.models.crash import CrashModel, crash_dataset
from infrarsi.models.peak_memory import has_memory_signal, interval_dataset
from infrarsi.models.priors import monotone_signs
from infrarsi.search._policy import (
    EXPERIENCE_CACHE_SIZE,
    OWN_CRASH_WEIGHT,
    OWN_MEMORY_NOISE,
    TRANSFER_MEMORY_SCALES,
    TRANSFER_MEMORY_STD_FLOOR,
    TRANSFER_MEMORY_STD_SCALE,
    TRANSFER_TIME_SCALES,
    TRANSFER_TIME_STD,
)
from infrarsi.space import SearchSpace, config_key
from infrarsi.trial import HardwareFingerprint, TrialRecord, WorkloadSignature

Objective = Callable[[TrialRecord], "float | None"]


def default_objective(record: TrialRecord) -> float | None:
    return record.tokens_per_s if record.ok else None


# ---- which experience ------------------------------------------------------------------------
def nearest_experience(records: Sequence[TrialRecord], workload: WorkloadSignature,
                       hardware: HardwareFingerprint, limit: int) -> list[TrialRecord]:
    """Up to ``limit`` records, whole workloads at a time, nearest signature first.

    Why: the nearest workloads transfer best, and the models' fit time grows with rows; a
    search should not slow down as the bank grows.
    """
    if len(records) <= limit:
        return list(records)
    me = np.array(workload.vector() + hardware.vector())
    groups: dict[tuple, list[TrialRecord]] = {}
    for r in records:
        groups.setdefault((r.workload, r.hardware), []).append(r)
    scale = np.array([np.std([np.r_[w.vector(), h.vector()][i] for w, h in groups]) or 1.0
                      for i in range(len(me))])
    order = sorted(groups, key=lambda k: float(np.linalg.norm(
        (np.array(k[0].vector() + k[1].vector()) - me) / scale)))
    out: list[TrialRecord] = []
    for key in order:
        if len(out) >= limit:
            break
        out.extend(groups[key])
    return out


def transferable(space: SearchSpace, records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The records the encoder can place in ``space``, projected (see
    :func:`infrarsi.bank.transfer.project_records`, which also says why any were dropped)."""
    from infrarsi.bank.transfer import project_records

    return project_records(space, records).records


# ---- the experience fit and its cache ----------------------------------------------------------
def _fit_experience(encoder: FeatureEncoder, records: Sequence[TrialRecord],
                    priors: Sequence[KnobPrior], objective: Objective, with_memory: bool):
    """Objective and memory models of experience records (either None when it has no rows).

    A fixed random_state, so that every search sharing this experience shares the fit.
    """
    ok = [(r, v) for r in records if (v := objective(r)) is not None and v > 0]
    tm = mm = None
    if ok:
        tm = StepTimeModel.from_priors(encoder, list(priors), random_state=0)
        tm.fit(encoder.transform_records([r for r, _ in ok]), -np.log([v for _, v in ok]))
    X_mem, bounds = interval_dataset(encoder, records) if with_memory else (None, None)
    if with_memory and has_memory_signal(bounds):
        mm = PeakMemoryModel.from_priors(encoder, list(priors), random_state=0)
        mm.fit(X_mem, bounds)
    return tm, mm


class ExperienceCache:
    """Experience models keyed by (space, experience, priors, objective), the oldest dropped first.

    Searches that share experience (a benchmark's many searches, a run's engine re-created on
    resume in the same process) pass the same cache and fit it once; a search given none fits
    its own. The fit is deterministic (fixed random_state), so sharing changes no decision.
    """

    def __init__(self, size: int = EXPERIENCE_CACHE_SIZE) -> None:
        self.size = size
        self._models: dict[str, tuple[Any, Any]] = {}

    def __len__(self) -> int:
        return len(self._models)

    def clear(self) -> None:
        self._models.clear()

    @staticmethod
    def key(space: SearchSpace, records: Sequence[TrialRecord], priors: Sequence[KnobPrior],
            objective: Objective) -> str:
        h = hashlib.sha1(json.dumps(space.names).encode())
        for r in records:
            h.update(json.dumps([r.trial_id, config_key(r.config), r.workload.name,
                                 r.workload.vector(), r.hardware.vector(), r.status.value,
                                 objective(r), r.memory_observation], default=str).encode())
        h.update(json.dumps([asdict(p) for p in priors], sort_keys=True, default=str).encode())
        return h.hexdigest()

    def models(self, encoder: FeatureEncoder, space: SearchSpace,
               records: Sequence[TrialRecord], priors: Sequence[KnobPrior],
               objective: Objective, with_memory: bool) -> tuple[Any, Any]:
        """(time model, memory model) of the experience ``records``, fitted once per key."""
        key = self.key(space, records, priors, objective)
        models = self._models.get(key)
        if models is None:
            models = _fit_experience(encoder, records, priors, objective, with_memory)
            self._models[key] = models
            while len(self._models) > self.size:
                self._models.pop(next(iter(self._models)))
        return models


@dataclass
class ExperienceFit:
    """Experience's models and their predictions of the current pool."""

    time_model: Any
    memory_model: Any
    mu: np.ndarray
    sd: np.ndarray
    p_oom: np.ndarray
    mem_median: np.ndarray | None


@dataclass
class Fit:
    """The models' predictions of every pool config, aligned with the pool."""

    mu: np.ndarray  # predicted log(1 / objective) of the pool (lower is better)
    sd: np.ndarray
    p_oom: np.ndarray
    mem_median: np.ndarray | None
    p_crash: np.ndarray  # P(the config itself crashes: compile, patch, code), see CrashModel
    time_model: Any = None  # the own-trial models behind the arrays (for the prior revisions)
    memory_model: Any = None

    @property
    def p_fail(self) -> np.ndarray:
        """P(the trial yields no measurement): it runs out of memory or crashes."""
        return 1.0 - (1.0 - self.p_oom) * (1.0 - self.p_crash)


# ---- fitting a search's models -----------------------------------------------------------------
class Fitter:
    """Fits one search's models and predicts its pool (``X_pool``, the encoded candidates).

    State it keeps between fits: the experience fit of the current pool (call
    :meth:`pool_changed` when the pool changes), the encoded experience crash rows, and the
    memory model's distribution family once chosen.
    """

    def __init__(self, space: SearchSpace, encoder: FeatureEncoder, hardware: HardwareFingerprint,
                 experience: Sequence[TrialRecord], priors: Sequence[KnobPrior],
                 objective: Objective, seed: int, cache: ExperienceCache) -> None:
        self.space = space
        self.encoder = encoder
        self.hardware = hardware
        self.experience = experience
        self.priors = priors
        self.objective = objective
        self.seed = seed
        self.cache = cache
        self._memory_family: str | None = None
        # the last own-trial memory fit: the next fit (one more trial) starts at its optimum
        self._memory_prev: PeakMemoryModel | None = None
        self._exp_fit: ExperienceFit | None = None
        self._exp_crash: tuple[np.ndarray, np.ndarray] | None = None
        # P(experience's model | own trials) at the last fit (None: no experience or no trial)
        self.experience_weight: float | None = None

    def pool_changed(self) -> None:
        self._exp_fit = None

    def experience_fit(self, X_pool: np.ndarray) -> ExperienceFit:
        if self._exp_fit is None:
            tm, mm = self.cache.models(self.encoder, self.space, self.experience, self.priors,
                                       self.objective, self.hardware.memory_bytes is not None)
            n = len(X_pool)
            fit = ExperienceFit(tm, mm, np.zeros(n), np.ones(n), np.zeros(n), None)
            if tm is not None:
                fit.mu, fit.sd = tm.predict(X_pool, return_std=True)
            if mm is not None and self.hardware.memory_bytes:
                fit.p_oom = mm.p_oom(X_pool, float(self.hardware.memory_bytes))
                fit.mem_median = mm.predict_quantiles(X_pool, (0.5,))[:, 0]
            self._exp_fit = fit
        return self._exp_fit

    def fit(self, records: Sequence[TrialRecord], X_pool: np.ndarray) -> Fit:
        """Models of this search's own ``records``, centred on what experience already says.

        Without experience the own trials are fitted from the proposer priors alone.
        """
        n_pool = len(X_pool)
        exp = self.experience_fit(X_pool) if self.experience else None
        tm = mm = None
        ok = [r for r in records if (v := self.objective(r)) is not None and v > 0]
        if ok:
            X = self.encoder.transform_records(ok)
            y = -np.log(np.array([self.objective(r) for r in ok], dtype=float))
            if exp is not None and exp.time_model is not None:
                tm = StepTimeModel(default_prior_std=TRANSFER_TIME_STD, random_state=self.seed,
                                   prior_scales=TRANSFER_TIME_SCALES)
                tm.fit(X, y - exp.time_model.predict(X))
                rmu, rsd = tm.predict(X_pool, return_std=True)
                mu, sd = self._trust_experience(X, y, X_pool, tm, exp.mu + rmu, rsd)
            else:
                tm = StepTimeModel.from_priors(self.encoder, self.priors, random_state=self.seed)
                tm.fit(X, y)
                mu, sd = tm.predict(X_pool, return_std=True)
        elif exp is not None:
            mu, sd = exp.mu, exp.sd
        elif self.priors:
            prior = StepTimeModel.from_priors(self.encoder, self.priors, random_state=self.seed)
            prior.fit(np.zeros((0, X_pool.shape[1])), np.zeros(0))
            mu, sd = prior.predict(X_pool, return_std=True)
        else:
            mu, sd = np.zeros(n_pool), np.ones(n_pool)

        p_oom, med = np.zeros(n_pool), None
        capacity = float(self.hardware.memory_bytes or 0)
        X_mem, bounds = interval_dataset(self.encoder, records, capacity or None)
        # Own OOMs count from the first: with experience's slopes and location as the prior, an
        # OOM raises the location where experience put it too low (see PeakMemoryModel's
        # prior_intercept); waiting for an observed peak spent most trials on OOMs when
        # experience came from smaller models.
        if capacity and len(bounds):
            mm = self._memory_model_for(exp)
            mm.fit(X_mem, bounds)
            if not getattr(mm, "fallen_back_", False):
                self._memory_family = mm.dist_
                self._memory_prev = mm
            p_oom = mm.p_oom_near(X_pool, X_mem, bounds, capacity, noise=OWN_MEMORY_NOISE)
            med = mm.predict_quantiles(X_pool, (0.5,))[:, 0]
        elif capacity and exp is not None and exp.memory_model is not None:
            p_oom, med = exp.p_oom, exp.mem_median
        return Fit(np.asarray(mu, float), np.maximum(np.asarray(sd, float), 1e-6),
                   np.clip(np.asarray(p_oom, float), 0.0, 1.0), med,
                   self.p_crash(records, X_pool), time_model=tm, memory_model=mm)

    def _trust_experience(self, X: np.ndarray, y: np.ndarray, X_pool: np.ndarray,
                          tm: StepTimeModel, mu: np.ndarray, sd: np.ndarray):
        """The pool's (mean, std): experience's model (``mu``, ``sd``, its residual ``tm``)
        averaged with the cold model of the same own trials, each weighed by how well it
        explains them (Bayesian model averaging by the linear parts' evidence, equal prior
        odds). Why: the residual alone can only correct experience where the own trials are;
        when experience from other hardware ranks configs wrongly, the own trials, all where
        experience pointed, cannot say so, and the search stayed there. The evidence can."""
        cold = StepTimeModel.from_priors(self.encoder, self.priors, random_state=self.seed)
        cold.fit(X, y)
        la, lb = getattr(tm, "log_evidence_", None), getattr(cold, "log_evidence_", None)
        if la is None or lb is None:
            return mu, sd
        w = float(1.0 / (1.0 + np.exp(np.clip(lb - la, -50.0, 50.0))))  # P(experience | trials)
        self.experience_weight = w
        cmu, csd = cold.predict(X_pool, return_std=True)
        m = w * mu + (1 - w) * cmu
        var = w * (sd**2 + mu**2) + (1 - w) * (csd**2 + cmu**2) - m**2
        return m, np.sqrt(np.maximum(var, 1e-12))

    def p_crash(self, records: Sequence[TrialRecord], X_pool: np.ndarray) -> np.ndarray:
        """P(crash) of every pool config from the crashes in experience and in own trials."""
        if self._exp_crash is None:
            rows, y = crash_dataset(self.experience)
            X = self.encoder.transform_records(rows) if rows else np.zeros((0, X_pool.shape[1]))
            self._exp_crash = (X, y)
        X_exp, y_exp = self._exp_crash
        rows, y_own = crash_dataset(records)
        if not (y_exp.sum() + y_own.sum()):
            return np.zeros(len(X_pool))
        X = np.vstack([X_exp, self.encoder.transform_records(rows)]) if rows else X_exp
        y = np.concatenate([y_exp, y_own])
        w = np.concatenate([np.ones(len(y_exp)), np.full(len(y_own), OWN_CRASH_WEIGHT)])
        return CrashModel(random_state=self.seed).fit(X, y, w).p_crash(X_pool)

    def _memory_model_for(self, exp: ExperienceFit | None) -> PeakMemoryModel:
        if exp is not None and exp.memory_model is not None:
            coef, cov = exp.memory_model.coef_posterior()
            std = TRANSFER_MEMORY_STD_SCALE * np.sqrt(np.clip(np.diag(cov), 0.0, None)) \
                + TRANSFER_MEMORY_STD_FLOOR
            exp_mm = exp.memory_model
            return PeakMemoryModel(prior_mean=coef, prior_std=std,
                                   prior_intercept=exp_mm.log_scale_ + exp_mm.intercept_,
                                   monotone=monotone_signs(self.encoder),
                                   distribution=exp.memory_model.dist_, encoder=self.encoder,
                                   random_state=self.seed, warm_start=self._memory_prev,
                                   prior_scales=TRANSFER_MEMORY_SCALES)
        # The family (log-normal or Weibull) is chosen by AIC once; refits reuse it, which
        # keeps a suggestion fast as trials accumulate.
        return PeakMemoryModel.from_priors(self.encoder, self.priors, random_state=self.seed,
                                           distribution=self._memory_family or "auto",
                                           warm_start=self._memory_prev)
