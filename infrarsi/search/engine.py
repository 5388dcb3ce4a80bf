"""The search engine behind InfraRSISearcher: experience-seeded, model-driven, memory-aware.

It is independent of Ray so that the same decisions can be driven by Ray Tune (the normal
path, :class:`~infrarsi.search.InfraRSISearcher`) or replayed in tests. Its whole state is a
plain dict (:meth:`SearchEngine.state_dict`) that survives a driver restart.

One suggestion:

1. Seeds (the first ``n_init`` trials): chosen jointly, not one incumbent. With experience
   (other workloads or hardware, from the bank) or priors, the models predict every candidate;
   the best predicted configs that are likely to fit are spread out by maximin distance. Cold,
   the seeds are a maximin space-filling design (plus the baseline when asked).
2. Then acquisition: expected improvement of log throughput over the best measured, times
   P(the trial measures anything): not out of memory (the censored memory model) and not
   crashed (the crash model, which learns setting conjunctions such as compile + fp8); the
   exploration margin shrinks as the budget is spent; configs already measured or pending are
   never proposed again. A trial's predicted P(fail) is capped (the cap shrinks with the
   budget), except late, for a candidate whose expected gain is large and several times the
   best safe one's while the failures so far leave room (origin ``model:risky``).
3. Pairing: when the best unconstrained candidate is likely to OOM, its neighbourhood (one or
   two knobs changed) is searched for memory savers with the lowest time price per GiB saved
   until the predicted risk is acceptable.
4. A trial the cluster lost (a worker or node died, a collective broke) measured nothing and
   taught nothing about its config: the config stays a candidate, once (its origin then ends
   in ``:retry``). A config that measured anything, ran out of memory or crashed by its own
   fault is never proposed again.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from scipy.stats import norm

from infrarsi.bank.transfer import project_records
from infrarsi.models import FeatureEncoder, KnobPrior, PeakMemoryModel, StepTimeModel, revise_priors
from infrarsi.models.crash import CrashModel, crash_dataset
from infrarsi.models.priors import monotone_signs
from infrarsi.search._pool import buildable, candidate_pool, maximin, neighbourhood, neighbours
from infrarsi.space import Config, SearchSpace, config_key
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

Objective = Callable[[TrialRecord], "float | None"]


def default_objective(record: TrialRecord) -> float | None:
    return record.tokens_per_s if record.ok else None


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


def _fmt_config(config: Config) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items()))


def transferable(space: SearchSpace, records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The records the encoder can place in ``space``, projected (see
    :func:`infrarsi.bank.transfer.project_records`, which also says why any were dropped)."""
    return project_records(space, records).records


@dataclass
class Suggestion:
    """A config to try, where it came from, and what the models expected of it."""

    config: Config
    origin: str
    predicted: dict[str, float] = field(default_factory=dict)
    pairing: dict[str, Any] | None = None
    # the trial may stop once its measured steps are all slower than this (see Backend.execute)
    stop_slower_than_s: float | None = None


# Own trials fit the difference from experience: a step-time residual whose slopes have this
# prior std (log units: about a 35% effect per feature unit), and memory slopes that may move a
# few posterior std from experience's (plus a floor, for slopes experience pinned too tightly).
TRANSFER_TIME_STD = 0.3
# ... scaled by whichever of these the own trials' evidence favours (empirical Bayes): where
# experience predicts this workload's trials well it gains weight, where it does not it gives
# way (measured: table +exp geo 0.938 -> 0.943, simulator +exp 0.736 -> 0.767, 5 seeds).
TRANSFER_TIME_SCALES = (0.5, 1.0, 2.0)
# A trial whose measured steps are all this much slower than the fastest ok trial's median is
# stopped early: far beyond any noise floor doctor measures, its outcome is certain.
SLOW_STOP_FACTOR = 1.5

# After two OOMs and nothing that fit, the lightest configs are run before anything else; when
# this many of them run out of memory too, the search stops (one could be a fluke of a noisy
# measurement, two agreeing are not).
LIGHTEST_PROBES = 2

# Once this share of the budget is spent, the neighbours of this many best measured configs
# join the candidate pool (see SearchEngine._grow_pool). Not sooner: early incumbents are poor
# and the residual model favours their neighbourhoods; grown from the first trial the cold
# simulator searches fell from 0.846 to 0.802 of the best, grown from 70% they rose to 0.852
# (with experience 0.905 -> 0.913; 4 seeds, budget 20).
LOCAL_INCUMBENTS = 3
LOCAL_FROM = 0.7

# Late in the budget (from RISK_FROM of it), a candidate riskier than the cap (see
# SearchEngine.oom_risk_cap) may still be run when its expected gain times P(it measures
# anything) is at least RISK_MIN_GAIN (log units: about 2%) and RISK_GAIN_RATIO times the best
# safe candidate's, and the failures so far leave room within FAIL_ALLOWANCE of the budget for
# it to fail too. Why: the fastest configs often sit at 95-100% of the device's memory, where an
# honest memory model says P(OOM) ~0.3-0.6; late, the safe candidates promise nothing (their
# predictions sit below the best measured) while one such trial is a one-in-two chance of the
# best. Measured (simulator, budget 20, 10 seeds, with experience): dense multi-node 0.857 ->
# 0.910 of the best; from half the budget, or without the minimum gain, the failure share
# passed 15% (dense single-node 5.5% -> 13% for +0.004).
RISK_FROM = 0.7
RISK_MIN_GAIN = 0.02
RISK_GAIN_RATIO = 2.0
FAIL_ALLOWANCE = 0.15

# Failures that are the cluster's, not the config's: its trial measured nothing, and the config
# stays a candidate until it has been lost this many times (a config that always loses its
# worker may be killing it). Why not retry a surprising OOM too: on the Ultra-Scale table, whose
# "crashed_or_oom" rows include flaky failures (26 configs both ran and crashed), retrying once
# each OOM that the memory model of the other trials gave P(OOM) <= 0.2 succeeded in 8 of 50
# retries (3 seeds); over 10 seeds the failed share rose from 12.6% to 14.2% cold and from
# 14.4% to 15.3% with experience (past the 15% goal) for 0.965 -> 0.967 / 0.957 -> 0.965.
CLUSTER_FAULTS = frozenset({ErrorKind.WORKER_LOST, ErrorKind.COMMUNICATION})
CLUSTER_FAULT_TRIES = 2
_CLUSTER_FAULT_VALUES = frozenset(k.value for k in CLUSTER_FAULTS)

# P(fit) multiplier for candidates with a setting every crash so far shared (see
# SearchEngine._suspect_settings): not zero, the setting may be innocent.
SUSPECT_FIT = 0.02
TRANSFER_MEMORY_STD_SCALE = 2.0
TRANSFER_MEMORY_STD_FLOOR = 0.1
# A crash of this search's own workload says more about its configs than one of another
# workload from the bank: it weighs this many experience rows in the crash model.
OWN_CRASH_WEIGHT = 3.0

# Experience models keyed by (space, experience, priors): a benchmark runs many searches with
# the same experience, and a run's resume re-creates its engine.
_EXPERIENCE_CACHE: dict[str, tuple[Any, Any]] = {}
_EXPERIENCE_CACHE_SIZE = 8


def _experience_key(space: SearchSpace, records: Sequence[TrialRecord],
                    priors: Sequence[KnobPrior], objective: Objective) -> str:
    h = hashlib.sha1(json.dumps(space.names).encode())
    for r in records:
        h.update(json.dumps([r.trial_id, config_key(r.config), r.workload.name,
                             r.workload.vector(), r.hardware.vector(), r.status.value,
                             objective(r), r.memory_observation], default=str).encode())
    h.update(json.dumps([asdict(p) for p in priors], sort_keys=True, default=str).encode())
    return h.hexdigest()


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
    mem_rows = [r for r in records if r.memory_observation is not None]
    if with_memory and any(r.memory_observation[1] for r in mem_rows):
        mm = PeakMemoryModel.from_priors(encoder, list(priors), random_state=0)
        mm.fit(*encoder.memory_dataset(mem_rows))
    return tm, mm


@dataclass
class _ExperienceFit:
    time_model: Any
    memory_model: Any
    mu: np.ndarray
    sd: np.ndarray
    p_oom: np.ndarray
    mem_median: np.ndarray | None


@dataclass
class _Fit:
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


class SearchEngine:
    """Decides the next config from every trial so far (OOMs included) and experience.

    Parameters: ``experience`` are records from other runs (other workloads or hardware;
    never the workload searched in a leave-one-out benchmark); ``priors`` are proposer priors
    per knob setting; ``objective`` maps a record to the number maximized (default tokens/s);
    ``max_oom_risk`` is the largest predicted P(fail) (an OOM or a crash) the engine spends a
    trial on, shrinking to ``final_oom_risk`` as the budget is spent (see :meth:`oom_risk_cap`);
    ``include_baseline`` puts the backend's baseline among the seeds; ``baseline_records`` are
    measurements of this task made before the search (doctor's baseline repeats): the models
    fit them with the own trials, as they would the baseline seed trial they replace, but they
    are not trials of this search (no budget, never "best"); ``pool_size`` is the
    size of the candidate sample of a space too large to enumerate, to which the neighbours of
    the ``local_incumbents`` best measured configs are added once ``local_from`` of the budget
    is spent (see :meth:`_grow_pool`).
    """

    def __init__(self, space: SearchSpace, workload: WorkloadSignature,
                 hardware: HardwareFingerprint, *, budget: int, seed: int = 0,
                 experience: Sequence[TrialRecord] = (), priors: Sequence[KnobPrior] = (),
                 objective: Objective | None = None, n_init: int | None = None,
                 max_oom_risk: float = 0.3, final_oom_risk: float = 0.1,
                 baseline: Config | None = None,
                 include_baseline: bool = False,
                 baseline_records: Sequence[TrialRecord] = (), pool_size: int = 5_000,
                 local_incumbents: int = LOCAL_INCUMBENTS, local_from: float = LOCAL_FROM,
                 max_experience: int = 400) -> None:
        self.space = space
        self.workload = workload
        self.hardware = hardware
        self.budget = budget
        self.seed = seed
        self.projection = project_records(space, experience)
        self.experience = nearest_experience(self.projection.records, workload, hardware,
                                             max_experience)
        self.priors = list(priors)
        self.objective = objective or default_objective
        self.max_oom_risk = max_oom_risk
        self.final_oom_risk = min(final_oom_risk, max_oom_risk)
        self.baseline = space.normalize(baseline, check=False) if baseline else None
        self.include_baseline = include_baseline
        self.baseline_records = [replace(r, config=c) for r in baseline_records
                                 if space.is_legal(c := space.normalize(r.config, check=False))]
        informed = bool(self.experience or self.priors)
        self.n_init = n_init if n_init is not None else max(1, min(3 if informed else 4, budget // 3))
        self._base_pool = candidate_pool(space, seed, pool_size, workload=workload,
                                         include=neighbourhood(space, self.baseline) if self.baseline else ())
        self.encoder = FeatureEncoder(space).fit()
        self._X_base = self.encoder.transform(self._base_pool, workload, hardware)
        self.local_incumbents = local_incumbents
        self.local_from = local_from
        self._local: tuple[str, ...] = ()  # keys of the incumbents whose neighbours are in the pool
        self._set_pool([])
        self.observations: list[dict[str, Any]] = []  # {"record": dict, "origin": str}
        self.pending: dict[str, Config] = {}
        self.seed_plan: list[dict[str, Any]] = []
        self.seeds_planned = False
        self.pairings: list[dict[str, Any]] = []
        self.revisions: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.n_suggested = 0
        self.n_seeds_issued = 0
        self._memory_family: str | None = None
        self._exp_fit: _ExperienceFit | None = None
        self._exp_crash: tuple[np.ndarray, np.ndarray] | None = None
        self._fit_memo: tuple[int, _Fit] | None = None
        self.lightest_probes: list[str] = []  # config keys of the "does anything fit?" probes

    # ---- observations -----------------------------------------------------------------
    @property
    def records(self) -> list[TrialRecord]:
        return [TrialRecord.from_dict(o["record"]) for o in self.observations]

    def observe(self, record: TrialRecord, origin: str = "", trial_id: str | None = None) -> None:
        """Feed one finished trial (any status). An OOM stays in: it is censored information."""
        self.pending.pop(trial_id or record.trial_id, None)
        self.observations.append({"record": record.to_dict(), "origin": origin})
        self._check_stop()

    def best(self) -> tuple[TrialRecord, float] | None:
        scored = [(r, self.objective(r)) for r in self.records]
        scored = [(r, v) for r, v in scored if v is not None and math.isfinite(v)]
        return max(scored, key=lambda rv: rv[1]) if scored else None

    def _tries(self) -> dict[str, tuple[int, int]]:
        """Config key -> (trials the cluster lost, other trials), from the raw observations."""
        out: dict[str, tuple[int, int]] = {}
        for o in self.observations:
            rec = o["record"]
            key = config_key(self.space.normalize(rec["config"], check=False))
            lost = (rec["status"] == TrialStatus.ERROR.value
                    and rec.get("error_kind") in _CLUSTER_FAULT_VALUES)
            n_lost, n_other = out.get(key, (0, 0))
            out[key] = (n_lost + lost, n_other + (not lost))
        return out

    def _measured_keys(self) -> set[str]:
        """Configs never to propose again: every one tried, except those whose trials the
        cluster lost (see CLUSTER_FAULTS) fewer than CLUSTER_FAULT_TRIES times."""
        return {k for k, (lost, other) in self._tries().items()
                if other or lost >= CLUSTER_FAULT_TRIES}

    def _lost_keys(self) -> set[str]:
        """Configs whose trials so far were all lost by the cluster (a new trial is a retry)."""
        return {k for k, (_, other) in self._tries().items() if not other}

    # ---- the candidate pool ---------------------------------------------------------------
    def _set_pool(self, extra: list[Config]) -> None:
        self.pool = self._base_pool + extra
        self._pool_keys = {config_key(c): i for i, c in enumerate(self.pool)}
        # each knob's value as its index in the knob's domain: "how many knobs differ" at once
        index = [(k.name, {v: j for j, v in enumerate(k.values)}) for k in self.space.knobs]
        self._codes = np.array([[ix.get(c.get(name), -1) for name, ix in index] for c in self.pool],
                               dtype=np.int32).reshape(len(self.pool), -1)
        self._X_pool = (np.vstack([self._X_base, self.encoder.transform(extra, self.workload,
                                                                        self.hardware)])
                        if extra else self._X_base)
        # every array aligned with the pool is recomputed for the new one
        self._exp_fit = None
        self._fit_memo = None

    def _grow_pool(self) -> None:
        """Late in the budget, put the neighbours (one or two knobs changed) of the best measured
        configs in the pool.

        Why: a large space's pool is a random sample, and the best config of the space is
        rarely in it (on the simulator's clusters the best of a 5,000 sample was 0.92-1.0 of
        the space's best); the neighbours of the incumbents are where a refinement is. A
        function of the trials so far only, so a restored search rebuilds the same pool.
        """
        if len(self.observations) < self.local_from * self.budget:
            return
        scored = sorted(((v, config_key(self.space.normalize(r.config, check=False)), r.config)
                         for r in self.records if (v := self.objective(r)) is not None and v > 0),
                        key=lambda t: -t[0])[:self.local_incumbents]
        local = tuple(sorted(k for _, k, _ in scored))
        if local == self._local:
            return
        self._local = local
        base = {config_key(c) for c in self._base_pool}
        extra: dict[str, Config] = {}
        for _, _, cfg in scored:
            for c in neighbours(self.space, self.space.normalize(cfg, check=False), max_changes=2):
                key = config_key(c)
                if key not in base and key not in extra and buildable(c, self.workload):
                    extra[key] = c
        self._set_pool(sorted(extra.values(), key=config_key))

    # ---- suggestion -------------------------------------------------------------------
    def suggest(self, trial_id: str | None = None) -> Suggestion | None:
        """The next config to run, or None when the search should stop (see ``stop_reason``)."""
        if self.stop_reason:
            return None
        self._grow_pool()
        taken = self._measured_keys() | {config_key(c) for c in self.pending.values()}
        free = np.array([config_key(c) not in taken for c in self.pool])
        if not free.any():
            self.stop_reason = "every candidate config has been measured"
            return None
        self._plan_seeds()
        suspects = self._suspect_settings(self.records)
        seeds = [s for s in self.seed_plan if config_key(s["config"]) not in taken
                 and not any(s["config"].get(k) == v for k, v in suspects)]
        if seeds and any(not r.ok for r in self.records):
            seeds = self._still_promising(seeds)
        if seeds and self.n_seeds_issued < len(self.seed_plan):
            s = seeds[0]
            self.n_seeds_issued += 1
            sug = Suggestion(dict(s["config"]), f"seed:{s['source']}", s.get("predicted", {}))
        else:
            sug = self._acquire(free)
            if sug is None:
                return None
        if config_key(sug.config) in self._lost_keys():
            sug.origin += ":retry"
        if self.baseline is None or config_key(sug.config) != config_key(self.baseline):
            sug.stop_slower_than_s = self.slow_stop_s()  # the reference is measured in full
        self.n_suggested += 1
        self.pending[trial_id or f"s{self.n_suggested}"] = sug.config
        return sug

    def _still_promising(self, seeds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The planned seeds that trials since the plan do not predict to fail (an OOM or a
        crash seen after a space-filling plan may condemn a seed nobody could judge then)."""
        fit = self._current_fit()
        p_fail = {config_key(c): float(p) for c, p in zip(self.pool, fit.p_fail, strict=True)}
        return [s for s in seeds if p_fail.get(config_key(s["config"]), 0.0) <= self.max_oom_risk]

    def slow_stop_s(self) -> float | None:
        """The step time past which a new trial's outcome is certain, or None before any ok."""
        steps = [r.step_time_s for r in self.records if r.ok and r.step_time_s]
        return SLOW_STOP_FACTOR * min(steps) if steps else None

    def _current_fit(self) -> _Fit:
        """:meth:`_fit` of every trial so far, once per new trial: a suggestion may judge the
        planned seeds and then acquire, and neither should refit what the other just fitted."""
        n = len(self.observations)
        if self._fit_memo is None or self._fit_memo[0] != n:
            self._fit_memo = (n, self._fit(self.baseline_records + self.records))
        return self._fit_memo[1]

    def _fit(self, records: Sequence[TrialRecord]) -> _Fit:
        """Models of this search's own trials, centred on what experience already says.

        Experience (other workloads and hardware) is fitted once per search (and cached across
        searches that share it): its predictions are the prior mean, its coefficient posterior
        the prior of the own-trial fits. Own trials then fit only the *difference* -- a
        step-time residual and a memory model whose slopes start at experience's -- so a few
        trials move the prediction and a suggestion costs a fit on tens of rows, not thousands.
        Without experience the own trials are fitted from the proposer priors alone.
        """
        exp = self._experience_fit() if self.experience else None
        tm = mm = None
        ok = [r for r in records if (v := self.objective(r)) is not None and v > 0]
        if ok:
            X = self.encoder.transform_records(ok)
            y = -np.log(np.array([self.objective(r) for r in ok], dtype=float))
            if exp is not None and exp.time_model is not None:
                tm = StepTimeModel(default_prior_std=TRANSFER_TIME_STD, random_state=self.seed,
                                   prior_scales=TRANSFER_TIME_SCALES)
                tm.fit(X, y - exp.time_model.predict(X))
                rmu, rsd = tm.predict(self._X_pool, return_std=True)
                mu, sd = exp.mu + rmu, rsd
            else:
                tm = StepTimeModel.from_priors(self.encoder, self.priors, random_state=self.seed)
                tm.fit(X, y)
                mu, sd = tm.predict(self._X_pool, return_std=True)
        elif exp is not None:
            mu, sd = exp.mu, exp.sd
        elif self.priors:
            prior = StepTimeModel.from_priors(self.encoder, self.priors, random_state=self.seed)
            prior.fit(np.zeros((0, self._X_pool.shape[1])), np.zeros(0))
            mu, sd = prior.predict(self._X_pool, return_std=True)
        else:
            mu, sd = np.zeros(len(self.pool)), np.ones(len(self.pool))

        p_oom, med = np.zeros(len(self.pool)), None
        mem_rows = [r for r in records if r.memory_observation is not None]
        capacity = float(self.hardware.memory_bytes or 0)
        # Own OOMs count from the first: with experience's slopes and location as the prior, an
        # OOM raises the location where experience put it too low (see PeakMemoryModel's
        # prior_intercept). Ignoring them until a peak is observed spent 12 of 20 trials on
        # OOMs when experience came from smaller models.
        if capacity and mem_rows:
            mm = self._memory_model_for(exp)
            mm.fit(*self.encoder.memory_dataset(mem_rows))
            if not getattr(mm, "fallen_back_", False):
                self._memory_family = mm.dist_
            p_oom = mm.p_oom(self._X_pool, capacity)
            med = mm.predict_quantiles(self._X_pool, (0.5,))[:, 0]
        elif capacity and exp is not None and exp.memory_model is not None:
            p_oom, med = exp.p_oom, exp.mem_median
        return _Fit(np.asarray(mu, float), np.maximum(np.asarray(sd, float), 1e-6),
                    np.clip(np.asarray(p_oom, float), 0.0, 1.0), med, self._p_crash(records),
                    time_model=tm, memory_model=mm)

    def _p_crash(self, records: Sequence[TrialRecord]) -> np.ndarray:
        """P(crash) of every pool config from the crashes in experience and in own trials."""
        if self._exp_crash is None:
            rows, y = crash_dataset(self.experience)
            X = self.encoder.transform_records(rows) if rows else np.zeros((0, self._X_pool.shape[1]))
            self._exp_crash = (X, y)
        X_exp, y_exp = self._exp_crash
        rows, y_own = crash_dataset(records)
        if not (y_exp.sum() + y_own.sum()):
            return np.zeros(len(self.pool))
        X = np.vstack([X_exp, self.encoder.transform_records(rows)]) if rows else X_exp
        y = np.concatenate([y_exp, y_own])
        w = np.concatenate([np.ones(len(y_exp)), np.full(len(y_own), OWN_CRASH_WEIGHT)])
        return CrashModel(random_state=self.seed).fit(X, y, w).p_crash(self._X_pool)

    def _memory_model_for(self, exp: _ExperienceFit | None) -> PeakMemoryModel:
        if exp is not None and exp.memory_model is not None:
            coef, cov = exp.memory_model.coef_posterior()
            std = TRANSFER_MEMORY_STD_SCALE * np.sqrt(np.clip(np.diag(cov), 0.0, None)) \
                + TRANSFER_MEMORY_STD_FLOOR
            exp_mm = exp.memory_model
            return PeakMemoryModel(prior_mean=coef, prior_std=std,
                                   prior_intercept=exp_mm.log_scale_ + exp_mm.intercept_,
                                   monotone=monotone_signs(self.encoder),
                                   distribution=exp.memory_model.dist_, encoder=self.encoder,
                                   random_state=self.seed)
        # The family (log-normal or Weibull) is chosen by AIC once; refits reuse it, which
        # keeps a suggestion fast as trials accumulate.
        return PeakMemoryModel.from_priors(self.encoder, self.priors, random_state=self.seed,
                                           distribution=self._memory_family or "auto")

    def _experience_fit(self) -> _ExperienceFit:
        if self._exp_fit is None:
            key = _experience_key(self.space, self.experience, self.priors, self.objective)
            models = _EXPERIENCE_CACHE.get(key)
            if models is None:
                models = _fit_experience(self.encoder, self.experience, self.priors,
                                         self.objective, self.hardware.memory_bytes is not None)
                _EXPERIENCE_CACHE[key] = models
                while len(_EXPERIENCE_CACHE) > _EXPERIENCE_CACHE_SIZE:
                    _EXPERIENCE_CACHE.pop(next(iter(_EXPERIENCE_CACHE)))
            tm, mm = models
            fit = _ExperienceFit(tm, mm, np.zeros(len(self.pool)), np.ones(len(self.pool)),
                                 np.zeros(len(self.pool)), None)
            if tm is not None:
                fit.mu, fit.sd = tm.predict(self._X_pool, return_std=True)
            if mm is not None and self.hardware.memory_bytes:
                fit.p_oom = mm.p_oom(self._X_pool, float(self.hardware.memory_bytes))
                fit.mem_median = mm.predict_quantiles(self._X_pool, (0.5,))[:, 0]
            self._exp_fit = fit
        return self._exp_fit

    def _plan_seeds(self) -> None:
        """Plan the seeds once: the baseline first (when asked for), then the others.

        Run one at a time, the others are planned after the baseline's result: its measured
        step time and peak anchor the prior-only models (without it a cold start cannot tell a
        config that fits from one that does not, and the priors favour the memory-hungry ones).
        """
        if self.seeds_planned:
            return
        plan = self.seed_plan
        if (not plan and self.include_baseline and self.baseline
                and config_key(self.baseline) in self._pool_keys):
            plan.append({"config": self.baseline, "source": "baseline"})
            if not self.observations:
                return  # the rest after the baseline's result (or at once, if one runs beside it)
        self.seeds_planned = True
        k = self.n_init - len(plan)
        if k <= 0:
            return
        taken = self._measured_keys() | {config_key(s["config"]) for s in plan}
        if self.experience or self.priors:
            fit = self._current_fit()
            safe = fit.p_fail <= self.max_oom_risk
            if not safe.any():
                safe = fit.p_fail <= np.quantile(fit.p_fail, 0.2)
            safe &= np.array([config_key(c) not in taken for c in self.pool])
            idx = np.flatnonzero(safe)
            top = idx[np.argsort(fit.mu[idx])[: max(5 * k, k)]]
            # the seed picks which of the k best predicted starts the spread: ten search seeds
            # are ten searches, not one (ties and near-ties among the best are common)
            order = maximin(self._X_pool[top], k, start=random.Random(self.seed).randrange(min(k, len(top))))
            source = "experience" if self.experience else "priors"
            for j in order:
                i = int(top[j])
                plan.append({"config": self.pool[i], "source": source,
                             "predicted": self._pred(fit, i)})
        else:
            rng = random.Random(self.seed)
            start = rng.randrange(len(self.pool))
            for i in maximin(self._X_pool, k, start=start):
                plan.append({"config": self.pool[i], "source": "space-filling"})

    def _pred(self, fit: _Fit, i: int) -> dict[str, float]:
        out = {"objective": float(math.exp(-fit.mu[i])), "log_sd": float(fit.sd[i]),
               "p_oom": float(fit.p_oom[i]), "p_crash": float(fit.p_crash[i])}
        if fit.mem_median is not None:
            out["peak_memory_bytes"] = float(fit.mem_median[i])
        return out

    def _acquire(self, free: np.ndarray) -> Suggestion | None:
        records = self.records
        fit = self._current_fit()
        self._update_revisions(fit)
        n_oom = sum(r.status is TrialStatus.OOM for r in records)
        if (n_oom >= 2 and not any(r.ok for r in records)
                and len(self.lightest_probes) < LIGHTEST_PROBES):
            # Nothing has fit yet: before spending more, run the lightest configs there are. If
            # even those run out of memory, nothing in the space fits (see _check_stop).
            i = self._lightest(fit, free)
            self.lightest_probes.append(config_key(self.pool[i]))
            return Suggestion(dict(self.pool[i]), "probe:lightest", self._pred(fit, i))
        own = [v for r in records if (v := self.objective(r)) is not None and v > 0]
        best_y = -math.log(max(own)) if own else float(np.min(fit.mu[free]))
        spent = len(self.observations) / max(self.budget, 1)
        xi = 0.02 * max(0.0, 1.0 - spent)  # exploration margin shrinks with the budget
        imp = best_y - fit.mu - xi
        z = imp / fit.sd
        ei = imp * norm.cdf(z) + fit.sd * norm.pdf(z)
        # penalize before masking: a pending config's penalty is 0, and -inf * 0 is NaN
        ei = np.where(free, np.maximum(ei, 1e-12) * self._pending_penalty(), -np.inf)
        p_fit = 1.0 - fit.p_fail
        suspects = self._suspect_settings(records)
        if suspects:  # a setting every crash shared and no ok trial had: treat as a failure
            has = np.array([any(c.get(k) == v for k, v in suspects) for c in self.pool])
            p_fit = np.where(has, p_fit * SUSPECT_FIT, p_fit)
        acq = np.where(free, np.where(free, ei, 0.0) * p_fit, -np.inf)
        acq = acq * (1.0 + 1e-3 * np.random.default_rng(self.seed).random(len(acq)))  # seeded tie-break
        risk = self.oom_risk_cap()
        safe = free & (1.0 - p_fit <= risk)  # a suspect setting is a risk like an OOM is
        if not safe.any():
            if len(self.observations) >= 4 and float(np.max(p_fit[free])) < 0.05:
                self.stop_reason = ("every remaining candidate is predicted to run out of memory "
                                    f"(best P(fit) {float(np.max(p_fit[free])):.3f}); stopping to save trials")
                return None
            safe = free
        i_safe = int(np.argmax(np.where(safe, acq, -np.inf)))
        i_hungry = int(np.argmax(ei))
        pairing = None
        choice, origin = i_safe, "model"
        if fit.p_oom[i_hungry] > risk and i_hungry != i_safe:
            j = self._pair(i_hungry, fit, safe)
            if j is not None and acq[j] >= acq[i_safe]:
                choice, origin = j, "pairing"
        i_risky = int(np.argmax(acq))
        n_failed = sum(not r.ok for r in records)
        if (spent >= RISK_FROM and not safe[i_risky]
                and acq[i_risky] >= max(RISK_MIN_GAIN, RISK_GAIN_RATIO * acq[choice])
                and n_failed + 1 <= FAIL_ALLOWANCE * self.budget):
            choice, origin, pairing = i_risky, "model:risky", None
        if origin == "pairing":
            pairing = {
                "hungry": self.pool[i_hungry], "paired": self.pool[choice],
                "changed": sorted(k for k in self.space.names
                                  if self.pool[choice][k] != self.pool[i_hungry][k]),
                "hungry_predicted": self._pred(fit, i_hungry),
                "paired_predicted": self._pred(fit, choice),
            }
            self.pairings.append(pairing)
        return Suggestion(dict(self.pool[choice]), origin, self._pred(fit, choice), pairing)

    def oom_risk_cap(self) -> float:
        """The largest P(OOM) a model-driven trial may carry: ``max_oom_risk`` at first,
        shrinking linearly to ``final_oom_risk`` as the budget is spent (early, a risky trial
        also teaches the memory model; late, only what it finds counts)."""
        spent = min(1.0, len(self.observations) / max(self.budget, 1))
        return self.max_oom_risk + (self.final_oom_risk - self.max_oom_risk) * spent

    def _lightest(self, fit: _Fit, free: np.ndarray) -> int:
        """The free candidate with the smallest predicted peak; where the memory model cannot
        tell candidates apart (no observed peak, no prior slopes), the physics signs decide
        (smallest micro-batch, most checkpointing and sharding)."""
        physics = self._X_pool @ monotone_signs(self.encoder)
        if fit.mem_median is not None:
            logm = np.log(np.maximum(fit.mem_median, 1e-30))
            if float(np.ptp(logm[free])) > 0.01:
                return int(np.argmin(np.where(free, logm + 1e-6 * physics, np.inf)))
        return int(np.argmin(np.where(free, physics, np.inf)))

    def _pair(self, i: int, fit: _Fit, safe: np.ndarray) -> int | None:
        """Best memory-saving partner of candidate ``i``: the lowest time price per GiB saved."""
        if fit.mem_median is None:
            return None
        diff = (self._codes != self._codes[i]).sum(axis=1)
        saved = (fit.mem_median[i] - fit.mem_median) / 2**30
        near = safe & (diff >= 1) & (diff <= 2) & (saved > 0)
        if not near.any():
            return None
        price = np.where(near, np.maximum(fit.mu - fit.mu[i], 0.0) / np.where(near, saved, 1.0),
                         np.inf)
        return int(np.argmin(price))  # the first of equal prices, as the pool is ordered

    def _pending_penalty(self) -> np.ndarray:
        """Down-weight candidates next to configs still running (local penalization)."""
        pen = np.ones(len(self.pool))
        if not self.pending:
            return pen
        scale = self._X_pool.std(axis=0)
        scale[scale < 1e-9] = 1.0
        Z = self._X_pool / scale
        for c in self.pending.values():
            i = self._pool_keys.get(config_key(c))
            if i is not None:
                d = np.linalg.norm(Z - Z[i], axis=1)
                pen *= 1.0 - np.exp(-(d**2))
        return pen

    def _update_revisions(self, fit: _Fit) -> None:
        if not self.priors:
            return
        revs = revise_priors(self.priors, self.encoder, fit.time_model, fit.memory_model)
        self.revisions = [r.to_dict() for r in revs]

    def _suspect_settings(self, records: Sequence[TrialRecord]) -> set[tuple[str, Any]]:
        """Non-baseline knob settings shared by every errored trial (two or more) and by no ok
        trial: the likely cause of the crashes (a patch that breaks under bf16, a compile mode
        this stack cannot compile), so the search steers around them instead of giving up."""
        errs = [r for r in records if r.status is TrialStatus.ERROR]
        if len(errs) < 2:
            return set()
        base = self.baseline or self.space.defaults()
        common: set[tuple[str, Any]] | None = None
        for r in errs:
            c = self.space.normalize(r.config, check=False)
            mine = {(k, v) for k, v in c.items() if v != base.get(k)}
            common = mine if common is None else common & mine
        seen_ok = {(k, v) for r in records if r.ok for k, v in r.config.items()}
        return (common or set()) - seen_ok

    def _check_stop(self) -> None:
        own = self.records
        if len(self.lightest_probes) == LIGHTEST_PROBES and not any(r.ok for r in own):
            probe = [r for r in own
                     if config_key(self.space.normalize(r.config, check=False))
                     in self.lightest_probes]
            if len(probe) == LIGHTEST_PROBES and all(r.status is TrialStatus.OOM for r in probe):
                cap = self.hardware.memory_bytes
                cap_txt = f" ({cap / 2**30:.1f} GiB per device)" if cap else ""
                self.stop_reason = (
                    f"out of memory everywhere: all {len(own)} trials ran out of memory, including "
                    f"the lightest configs the memory model and the physics of the knobs point to, e.g. "
                    f"({_fmt_config(probe[-1].config)}), so no config searched fits the "
                    f"device{cap_txt}. Add memory savers to the search "
                    "space (activation checkpointing, sharded optimizer state, more devices for "
                    "tensor/pipeline parallelism) or a smaller micro-batch range.")
                return
        all_failed = len(own) >= 3 and all(r.status is TrialStatus.ERROR for r in own)
        # crashes that share a setting are that setting's fault: steer around it first
        if all_failed and (len(own) >= 6 or not self._suspect_settings(own)):
            kinds = sorted({r.error_kind.value for r in own if r.error_kind})
            self.stop_reason = (
                f"the first {len(own)} trials all failed ({', '.join(kinds)}): the workload looks "
                f"broken, not slow. Last error: {own[-1].error_message[:300]}"
            )

    # ---- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "observations": self.observations,
            "pending": self.pending,
            "seed_plan": self.seed_plan,
            "seeds_planned": self.seeds_planned,
            "pairings": self.pairings,
            "revisions": self.revisions,
            "stop_reason": self.stop_reason,
            "n_suggested": self.n_suggested,
            "n_seeds_issued": self.n_seeds_issued,
            "lightest_probes": self.lightest_probes,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._fit_memo = None
        self.observations = list(state["observations"])
        self.pending = dict(state.get("pending", {}))
        self.seed_plan = list(state.get("seed_plan", []))
        self.seeds_planned = bool(state.get("seeds_planned", self.seed_plan))
        self.pairings = list(state.get("pairings", []))
        self.revisions = list(state.get("revisions", []))
        self.stop_reason = state.get("stop_reason")
        self.n_suggested = int(state.get("n_suggested", 0))
        self.n_seeds_issued = int(state.get("n_seeds_issued", 0))
        self.lightest_probes = list(state.get("lightest_probes", []))
