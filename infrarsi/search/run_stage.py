"""The run stage: Ray Tune drives InfraRSISearcher over real trials, then verification.

Flow: load the contract (frozen files re-checked) -> open the bank (warn and run cold when it
is unreachable) -> take the run lock -> start or resume the run in the bank -> the proposer's
patches are verified against the contract and recorded (bank and ``patches.json``); the
verified ones join the space as ``patch:<id>`` bool knobs -> seed the engine with experience
(nearest signatures) and proposer priors -> Ray Tune runs the trials, each a Ray Train job
through the backend (in a patched copy of the workspace when patch knobs are on); every
finished trial is written to the bank and to the progress table, the searcher state is saved
after each -> the top candidates are re-measured interleaved with the baseline and the best one
whose paired lower bound clears 1 + verify.min_effect is promoted (with the patches it turns on).
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.contract import Contract
from infrarsi.doctor.noise import DEFAULT_PAIRS
from infrarsi.errors import FrozenFileChangedError, InfraRSIError
from infrarsi.search._patch_stage import prepare_patches, promoted_patches
from infrarsi.search._progress import Progress
from infrarsi.search._session import RunSession
from infrarsi.search.engine import SearchEngine
from infrarsi.search.searcher import SENTINEL_ORIGIN, InfraRSISearcher, split_stop_hint
from infrarsi.search.verify import (
    DEFAULT_MDE,
    FALSE_PROMOTION_RATE,
    MAX_LENGTHEN,
    Verdict,
    plan_pairs,
    plan_trial_length,
    trial_overhead_steps,
    verify_candidate,
)
from infrarsi.space import config_key
from infrarsi.trial import TrialRecord

STATE_FILE = "searcher_state.json"
OUTCOME_FILE = "run_outcome.json"
# The baseline is re-measured (a sentinel trial, not counted in the budget) every this many
# search trials, so the progress table's speedups are against a recent baseline.
SENTINEL_EVERY = 5


@dataclass
class RunOutcome:
    run_id: str
    trials: int
    best: TrialRecord | None
    verdicts: list[Verdict] = field(default_factory=list)
    promoted: Verdict | None = None
    stop_reason: str | None = None
    verified_patches: list[str] = field(default_factory=list)
    # the patches the promoted config turns on: id, origin, files, digest, diff
    promoted_patches: list[dict[str, Any]] = field(default_factory=list)
    # the baseline sentinels measured during the search and their drift from doctor's baseline
    sentinels: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "trials": self.trials,
            "best": self.best.to_dict() if self.best else None,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "promoted": self.promoted.to_dict() if self.promoted else None,
            "stop_reason": self.stop_reason,
            "verified_patches": self.verified_patches,
            "promoted_patches": self.promoted_patches,
            "sentinels": self.sentinels,
        }


def _trainable(config: dict[str, Any], *, spec_dict: dict[str, Any], run_dir: str,
               local_mode: bool, patches: list[dict[str, Any]] | None = None,
               conflicts: list[list[str]] | None = None) -> None:
    """One Tune trial: one Ray Train job of ``config``; reports the whole record.

    ``patches`` (plain dicts) are the run's verified patches: a config with patch knobs on is
    materialized here, in the trial's own process, and runs in that patched copy."""
    from ray import tune

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.contract import TaskSpec

    contract = Contract.load(Path(run_dir))  # re-verifies frozen files in the trial process
    backend = RayTrainBackend(TaskSpec.from_dict(spec_dict), contract=contract, local_mode=local_mode)
    if patches:
        from infrarsi.patches import Patch
        from infrarsi.search._patched import PatchedBackend

        backend = PatchedBackend.ray_train(backend, [Patch.from_dict(p) for p in patches],
                                           conflicts=[tuple(c) for c in conflicts or ()])
    trial_id = tune.get_context().get_trial_id()
    config, stop_slower_than_s = split_stop_hint(config)
    record = backend.execute(config, trial_id=trial_id, stop_slower_than_s=stop_slower_than_s)
    tune.report({"objective": backend.objective(record) or 0.0, "record": record.to_dict(),
                 "status": record.status.value, "device_seconds": record.device_seconds})


def run_search(run_dir: Path, *, budget: int, resume: bool = False, verify_top: int = 2,
               pairs: int = DEFAULT_PAIRS, max_concurrent: int = 1, local_mode: bool = False,
               bank_url: str | None = None, progress: Callable[[str], None] = print,
               use_experience: bool = True, patches: bool = True,
               proposer: Any = None) -> RunOutcome:
    """Search ``budget`` trials, verify the best, promote what clears ``1 + verify.min_effect``.

    ``patches=False`` searches launch knobs only (``--no-patches``); ``proposer`` overrides the
    one the task spec implies (LLM when it has an ``llm:`` section, else expert)."""
    if budget < 1:
        raise InfraRSIError(f"--budget {budget}: give at least 1 trial")
    run_dir = Path(run_dir).resolve()  # trials run with their own working directory
    with RunSession.open(run_dir, resume=resume, bank_url=bank_url, local_mode=local_mode,
                         progress=progress) as session:
        setup = prepare_patches(session, enabled=patches, resume=resume, proposer=proposer)
        session.use_patches(setup.verified, setup.conflicts)
        engine = _engine(session, budget, use_experience)
        state_path = run_dir / STATE_FILE
        if resume:
            session.restore_engine(engine, state_path)
        table = Progress(progress, baseline_step_s=session.baseline_step_s)
        done = len(engine.observations)
        if done < budget and not engine.stop_reason:
            table.header(budget, engine.n_init)
            _tune(session, engine, budget - done, state_path, table, max_concurrent)
        outcome = RunOutcome(session.run_id, len(engine.observations), None,
                             stop_reason=engine.stop_reason,
                             verified_patches=[p.id for p in session.patches],
                             sentinels=list(session.sentinels))
        best = engine.best()
        outcome.best = best[0] if best else None
        if engine.stop_reason:
            progress(f"search stopped: {engine.stop_reason}")
        outcome.verdicts = _verify(session, engine, verify_top, pairs, table)
        winners = [v for v in outcome.verdicts if v.promoted]
        if winners:
            outcome.promoted = max(winners, key=lambda v: (v.ci_low or 0.0, v.speedup or 0.0))
            outcome.promoted_patches = promoted_patches(outcome.promoted.config, session.patches)
            session.promote(outcome.promoted)
        (run_dir / OUTCOME_FILE).write_text(json.dumps(outcome.to_dict(), indent=2, default=str))
        table.summary(outcome)
        session.finish("finished")
    return outcome


def _engine(session: RunSession, budget: int, use_experience: bool) -> SearchEngine:
    backend = session.backend
    experience = session.experience() if use_experience else []
    if use_experience and not experience:
        session.progress("no experience in the bank for this workload yet: starting cold")
    return SearchEngine(
        backend.space, backend.workload, backend.hardware, budget=budget,
        seed=session.seed, experience=experience, priors=session.priors(),
        objective=backend.objective, baseline=backend.baseline_config(),
        include_baseline=session.baseline_step_s is None,
        baseline_records=session.baseline_records,
    )


def _tune(session: RunSession, engine: SearchEngine, n: int, state_path: Path,
          table: Progress, max_concurrent: int) -> None:
    import ray
    from ray import tune

    session.ensure_ray()

    def on_record(trial_id: str, record: TrialRecord, origin: str, live: dict | None) -> None:
        session.record(record, origin)
        if origin.startswith("seed:baseline") and record.ok:
            session.baseline_step_s = table.baseline_step_s = record.step_time_s
        if origin == SENTINEL_ORIGIN:
            session.sentinel_measured(record, table)
        table.row(len(engine.observations), record, origin, live)
        session.save_state(engine.state_dict())
        # Every trial re-hashes the frozen files and fails when one changed; stop at the first
        # such trial instead of spending the rest of the budget on failures.
        try:
            session.contract.verify_frozen()
        except FrozenFileChangedError as e:
            searcher.halt(str(e))

    # A doctor baseline is re-measured as a sentinel every SENTINEL_EVERY trials (twice first
    # when doctor measured it on a busy machine); without one the seed baseline is measured.
    sentinel = session.backend.baseline_config() if session.baseline_step_s else None
    first = 2 if sentinel is not None and session.doctor_contended else 0
    searcher = InfraRSISearcher(engine, state_path=state_path, on_record=on_record,
                                on_suggest=session.open_trial, early_stop=True,
                                sentinel=sentinel, sentinel_every=SENTINEL_EVERY,
                                sentinel_first=first, search_trials=n)
    if sentinel is not None:
        n += first + n // SENTINEL_EVERY
    trainable = tune.with_parameters(_trainable, spec_dict=session.spec.to_dict(),
                                     run_dir=str(session.run_dir), local_mode=session.local_mode,
                                     patches=[p.to_dict() for p in session.patches],
                                     conflicts=[list(c) for c in session.patch_conflicts])
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Our progress table is the output: Tune's own (the experiment box, the per-trial files it
    # looks for because the loggers above are off) would interleave with it.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    tuner = tune.Tuner(
        tune.with_resources(trainable, session.trial_driver_resources()),
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=n,
                                    max_concurrent_trials=max_concurrent),
        run_config=tune.RunConfig(
            name=f"infrarsi-{session.run_id}-{int(time.time())}",
            storage_path=str((session.run_dir / "tune").resolve()), verbose=0, log_to_file=False,
            failure_config=tune.FailureConfig(max_failures=0),
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False)),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuner.fit()
    del ray
    if searcher.halted:
        raise FrozenFileChangedError(searcher.halted)


def _verify(session: RunSession, engine: SearchEngine, top: int, pairs: int,
            table: Progress) -> list[Verdict]:
    """Re-measure the best distinct ok configs against the baseline, A B A B ..."""
    session.contract.verify_frozen()  # nothing is promoted on a harness that changed
    baseline = session.backend.baseline_config()
    ranked: dict[str, tuple[float, dict]] = {}
    for r in engine.records:
        v = engine.objective(r)
        key = config_key(r.config)
        if v is not None and key != config_key(baseline) and v > ranked.get(key, (0.0, {}))[0]:
            ranked[key] = (v, r.config)
    ranked_top = sorted(ranked.values(), key=lambda t: -t[0])[:top]
    candidates = [c for _, c in ranked_top]
    if not candidates:
        session.progress("verification: no candidate faster than nothing to verify")
        return []
    min_effect = session.spec.verify.min_effect
    noise = session.noise
    session.progress(f"promotion rule: the speedup's one-sided lower bound from the verification's "
                     f"own pairs must exceed 1 + verify.min_effect = {1 + min_effect:.3f} "
                     f"(false-promotion rate <= {FALSE_PROMOTION_RATE:.0%} over all looks)")
    if noise is None:
        session.progress("no doctor noise model for this workload: planning the default pairs "
                         "(run `infrarsi doctor` to plan from a measured one)")
    baseline_obj = _baseline_objective(engine, baseline)
    backend, steps = _verification_backend(session, noise)
    verdicts = []
    for i, (obj, cand) in enumerate(ranked_top):
        expected = obj / baseline_obj if baseline_obj else None
        planned = plan_pairs(noise, min_effect=min_effect, expected_speedup=expected,
                             default=pairs, cap=4 * pairs, steps=steps)
        mde = session.noise_floor(planned)
        plan = (f"; doctor's MDE at {planned} pairs {mde:.1%} (planning only)"
                if mde is not None else "")
        table.note(f"verifying candidate {i + 1}/{len(candidates)}: {planned} interleaved pairs "
                   f"planned, up to {2 * planned} while the verdict is open{plan}")
        v = verify_candidate(backend, baseline, cand, pairs=planned,
                             mde=mde if mde is not None else DEFAULT_MDE, min_effect=min_effect,
                             tag=f"verify{i}", max_pairs=2 * planned, measured_steps=steps,
                             on_record=lambda rec, origin: session.record(rec, origin))
        table.note(("PROMOTABLE: " if v.promoted else "not promoted: ") + v.reason)
        verdicts.append(v)
    return verdicts


def _verification_backend(session: RunSession, noise: dict | None):
    """The backend the verification's trials run on, and their measured steps: longer trials
    when doctor's noise model says the step jitter dominates (``plan_trial_length``; both sides
    of every pair get the same length), at most half the trial timeout long."""
    steps = session.spec.timing.measured_steps
    overhead = trial_overhead_steps(session.baseline_records)
    step_s = session.baseline_step_s
    room = (int(session.spec.trial.timeout_s / 2 / step_s - (overhead or 0.0))
            if step_s else None)
    chosen, why = plan_trial_length(noise, steps=steps, overhead_steps=overhead,
                                    max_steps=None if room is None else max(steps, min(room, MAX_LENGTHEN * steps)))
    longer = session.backend.with_measured_steps(chosen) if chosen > steps else None
    if longer is None:
        session.progress(f"verification trial length: {steps} measured steps ({why})")
        return session.backend, steps
    session.progress(f"verification trial length: {chosen} measured steps instead of {steps} "
                     f"({why})")
    return longer, chosen


def _baseline_objective(engine: SearchEngine, baseline: dict) -> float | None:
    """The search's own measure of the baseline (its best ok trial of the baseline config, or
    doctor's repeats the engine was seeded with), for planning the verification's pairs."""
    key = config_key(baseline)
    vals = [engine.objective(r) for r in [*engine.records, *engine.baseline_records]
            if config_key(r.config) == key]
    vals = [v for v in vals if v]
    return sorted(vals)[len(vals) // 2] if vals else None
