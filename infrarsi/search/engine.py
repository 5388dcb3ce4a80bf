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

The parts live by concern: :mod:`._policy` (every constant and why), :mod:`._fitting` (the
models, with an explicit :class:`ExperienceCache`), :mod:`._acquisition` (scoring, pairing,
seeds, probes), :mod:`._observations` (the trial log, retries and stop rules) and
:mod:`._pool` (the candidates). This module orchestrates them and owns the saved state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from infrarsi.bank.transfer import project_records
from infrarsi.models import FeatureEncoder, KnobPrior, revise_priors
from infrarsi.search import _acquisition as acq
from infrarsi.search import _observations as obs
from infrarsi.search._acquisition import Suggestion
from infrarsi.search._fitting import (
    ExperienceCache,
    Fit,
    Fitter,
    Objective,
    default_objective,
    nearest_experience,
    transferable,
)
from infrarsi.search._policy import (
    CLUSTER_FAULT_TRIES,
    CLUSTER_FAULTS,
    FINAL_OOM_RISK,
    LIGHTEST_PROBES,
    LOCAL_FROM,
    LOCAL_INCUMBENTS,
    MAX_EXPERIENCE,
    MAX_OOM_RISK,
    N_INIT_COLD,
    N_INIT_INFORMED,
    OOMS_BEFORE_PROBES,
    POOL_SIZE,
    SLOW_STOP_FACTOR,
)
from infrarsi.search._pool import buildable, candidate_pool, neighbourhood, neighbours
from infrarsi.space import Config, SearchSpace, config_key
from infrarsi.trial import HardwareFingerprint, TrialRecord, TrialStatus, WorkloadSignature

__all__ = [
    "CLUSTER_FAULTS",
    "CLUSTER_FAULT_TRIES",
    "SLOW_STOP_FACTOR",
    "ExperienceCache",
    "Objective",
    "SearchEngine",
    "Suggestion",
    "default_objective",
    "nearest_experience",
    "transferable",
]

_Fit = Fit  # the name tests and older callers import


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
    is spent (see :meth:`_grow_pool`); ``experience_cache`` is shared by searches with the
    same experience so they fit it once (default: a cache of this engine's own).
    """

    def __init__(self, space: SearchSpace, workload: WorkloadSignature,
                 hardware: HardwareFingerprint, *, budget: int, seed: int = 0,
                 experience: Sequence[TrialRecord] = (), priors: Sequence[KnobPrior] = (),
                 objective: Objective | None = None, n_init: int | None = None,
                 max_oom_risk: float = MAX_OOM_RISK, final_oom_risk: float = FINAL_OOM_RISK,
                 baseline: Config | None = None,
                 include_baseline: bool = False,
                 baseline_records: Sequence[TrialRecord] = (), pool_size: int = POOL_SIZE,
                 local_incumbents: int = LOCAL_INCUMBENTS, local_from: float = LOCAL_FROM,
                 max_experience: int = MAX_EXPERIENCE,
                 experience_cache: ExperienceCache | None = None) -> None:
        self.space = space
        self.workload = workload
        self.hardware = hardware
        self.budget = budget
        self.seed = seed
        self.projection = project_records(space, experience)  # what was kept, and why not
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
        self.n_init = n_init if n_init is not None else max(
            1, min(N_INIT_INFORMED if informed else N_INIT_COLD, budget // 3))
        self._base_pool = candidate_pool(space, seed, pool_size, workload=workload,
                                         include=neighbourhood(space, self.baseline) if self.baseline else ())
        self.encoder = FeatureEncoder(space).fit()
        self._X_base = self.encoder.transform(self._base_pool, workload, hardware)
        self.fitter = Fitter(space, self.encoder, hardware, self.experience, self.priors,
                             self.objective, seed,
                             ExperienceCache() if experience_cache is None else experience_cache)
        self.local_incumbents = local_incumbents
        self.local_from = local_from
        self._local: tuple[str, ...] = ()  # keys of the incumbents whose neighbours are in the pool
        self._fit_memo: tuple[int, Fit] | None = None
        self._set_pool([])
        self.observations: list[dict[str, Any]] = []  # {"record": dict, "origin": str}
        self.pending: dict[str, Config] = {}
        self.seed_plan: list[dict[str, Any]] = []
        self.seeds_planned = False
        self.pairings: list[dict[str, Any]] = []
        self.revisions: list[dict[str, Any]] = []
        # rounds of prior revision from live runs (see set_priors): what changed and why
        self.prior_rounds: list[dict[str, Any]] = []
        self.prior_judged: list[dict[str, Any]] = []  # the priors vs the trials (judge_priors)
        self.stop_reason: str | None = None
        self.n_suggested = 0
        self.n_seeds_issued = 0
        self.lightest_probes: list[str] = []  # config keys of the "does anything fit?" probes

    # ---- observations -----------------------------------------------------------------
    @property
    def records(self) -> list[TrialRecord]:
        return obs.records(self.observations)

    def observe(self, record: TrialRecord, origin: str = "", trial_id: str | None = None) -> None:
        """Feed one finished trial (any status). An OOM stays in: it is censored information."""
        self.pending.pop(trial_id or record.trial_id, None)
        self.observations.append({"record": record.to_dict(), "origin": origin})
        reason = obs.stop_reason(self.space, self.baseline, self.hardware, self.records,
                                 self.lightest_probes)
        if reason:
            self.stop_reason = reason

    def best(self) -> tuple[TrialRecord, float] | None:
        return obs.best(self.records, self.objective)

    def _measured_keys(self) -> set[str]:
        return obs.measured_keys(self.space, self.observations)

    def _suspect_settings(self, records: Sequence[TrialRecord]) -> set[tuple[str, Any]]:
        return obs.suspect_settings(self.space, self.baseline, records)

    def slow_stop_s(self) -> float | None:
        """The step time past which a new trial's outcome is certain, or None before any ok."""
        return obs.slow_stop_s(self.records)

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
        self.fitter.pool_changed()
        self._fit_memo = None

    def _grow_pool(self) -> None:
        """Late in the budget, put the neighbours (one or two knobs changed) of the best measured
        configs in the pool.

        Why: a large space's pool is a random sample, and the best config of the space is
        rarely in it; the neighbours of the incumbents are where a refinement is. A function of
        the trials so far only, so a restored search rebuilds the same pool.
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
        if config_key(sug.config) in obs.lost_keys(self.space, self.observations):
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

    def _current_fit(self) -> Fit:
        """:meth:`_fit` of every trial so far, once per new trial: a suggestion may judge the
        planned seeds and then acquire, and neither should refit what the other just fitted."""
        n = len(self.observations)
        if self._fit_memo is None or self._fit_memo[0] != n:
            self._fit_memo = (n, self._fit(self.baseline_records + self.records))
        return self._fit_memo[1]

    def _fit(self, records: Sequence[TrialRecord]) -> Fit:
        """The models of ``records`` (own trials) over the current pool (see Fitter.fit)."""
        return self.fitter.fit(records, self._X_pool)

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
            source = "experience" if self.experience else "priors"
            for i in acq.seed_picks(fit, self._X_pool, self.pool, taken, k, self.max_oom_risk,
                                      self.seed):
                plan.append({"config": self.pool[i], "source": source,
                             "predicted": acq.predicted(fit, i)})
        else:
            for i in acq.space_filling_picks(self._X_pool, k, self.seed):
                plan.append({"config": self.pool[i], "source": "space-filling"})

    def _acquire(self, free: np.ndarray) -> Suggestion | None:
        records = self.records
        fit = self._current_fit()
        if self.priors:  # how the trials so far revise the proposer's priors (logged)
            self.revisions = [r.to_dict() for r in revise_priors(
                self.priors, self.encoder, fit.time_model, fit.memory_model)]
        n_oom = sum(r.status is TrialStatus.OOM for r in records)
        if (n_oom >= OOMS_BEFORE_PROBES and not any(r.ok for r in records)
                and len(self.lightest_probes) < LIGHTEST_PROBES):
            # Nothing has fit yet: before spending more, run the lightest configs there are. If
            # even those run out of memory, nothing in the space fits (see obs.stop_reason).
            # Among those not predicted to crash: a crash says nothing about memory (two
            # probes a knob apart crashed alike and the search had learned nothing).
            sound = free & (fit.p_crash <= self.oom_risk_cap())
            i = acq.lightest(fit, self._X_pool, self.encoder, sound if sound.any() else free)
            self.lightest_probes.append(config_key(self.pool[i]))
            return Suggestion(dict(self.pool[i]), "probe:lightest", acq.predicted(fit, i))
        own = [v for r in records if (v := self.objective(r)) is not None and v > 0]
        suspects = self._suspect_settings(records)
        suspect = (np.array([any(c.get(k) == v for k, v in suspects) for c in self.pool])
                   if suspects else None)
        choice = acq.choose(
            fit, free, best_y=-math.log(max(own)) if own else None,
            spent=len(self.observations) / max(self.budget, 1), n_trials=len(self.observations),
            n_failed=sum(not r.ok for r in records), budget=self.budget, risk=self.oom_risk_cap(),
            penalty=acq.pending_penalty(self._X_pool, self._pool_keys, self.pending.values()),
            suspect=suspect, codes=self._codes, seed=self.seed)
        if choice.stop:
            self.stop_reason = choice.stop
            return None
        i, pairing = choice.index, None
        if choice.hungry is not None:
            h = choice.hungry
            pairing = {
                "hungry": self.pool[h], "paired": self.pool[i],
                "changed": sorted(k for k in self.space.names if self.pool[i][k] != self.pool[h][k]),
                "hungry_predicted": acq.predicted(fit, h),
                "paired_predicted": acq.predicted(fit, i),
            }
            self.pairings.append(pairing)
        return Suggestion(dict(self.pool[i]), choice.origin, acq.predicted(fit, i), pairing)

    # ---- priors revised from live runs -----------------------------------------------
    def judge_priors(self) -> list[dict[str, Any]]:
        """Each prior against what the trials alone measured (PriorRevision dicts).

        Why a fit without the priors: the search's own posterior leans on them, and a
        confident wrong prior holds it near itself on a few trials; it cannot vouch for itself.
        """
        if not self.priors:
            return []
        plain = Fitter(self.space, self.encoder, self.hardware, self.experience, [],
                       self.objective, self.seed, self.fitter.cache)
        fit = plain.fit(self.baseline_records + self.records, self._X_pool)
        self.prior_judged = [r.to_dict() for r in revise_priors(
            self.priors, self.encoder, fit.time_model, fit.memory_model)]
        return self.prior_judged

    def set_priors(self, priors: Sequence[KnobPrior], round_: dict[str, Any] | None = None) -> None:
        """Search on with ``priors`` (a proposer's revision); ``round_`` is logged in the state.

        The next fit starts from them: the own-trial models' prior and the seeds not yet run.
        """
        self.priors = list(priors)
        self.fitter.priors = self.priors
        self._fit_memo = None
        if round_ is not None:
            self.prior_rounds.append({**round_, "priors": [asdict(p) for p in self.priors]})

    def oom_risk_cap(self) -> float:
        """The largest P(fail) a model-driven trial may carry now (see acq.oom_risk_cap)."""
        return acq.oom_risk_cap(self.max_oom_risk, self.final_oom_risk,
                                len(self.observations) / max(self.budget, 1))

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
            "prior_rounds": self.prior_rounds,
            "prior_judged": self.prior_judged,
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
        self.prior_rounds = list(state.get("prior_rounds", []))
        self.prior_judged = list(state.get("prior_judged", []))
        if self.prior_rounds:  # the last revision's priors are the ones searched with
            self.set_priors([KnobPrior(**d) for d in self.prior_rounds[-1]["priors"]])
        self.stop_reason = state.get("stop_reason")
        self.n_suggested = int(state.get("n_suggested", 0))
        self.n_seeds_issued = int(state.get("n_seeds_issued", 0))
        self.lightest_probes = list(state.get("lightest_probes", []))
