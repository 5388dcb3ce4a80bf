"""The run stage: Ray Tune drives InfraRSISearcher over real trials, then verification.

Flow: load the contract (frozen files re-checked) -> open the bank (warn and run cold when it
is unreachable) -> take the run lock -> start or resume the run in the bank -> the proposer's
patches are verified against the contract and recorded (bank and ``patches.json``); the
verified ones join the space as ``patch:<id>`` bool knobs -> seed the engine with experience
(nearest signatures) and proposer priors -> Ray Tune runs the trials, each a Ray Train job
through the backend (in a patched copy of the workspace when patch knobs are on); every
finished trial is written to the bank and to the progress table, the searcher state is saved
after each -> the top candidates are re-measured interleaved with the baseline and the best one
that clears doctor's noise floor is promoted (with the patches it turns on).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.contract import Contract
from infrarsi.errors import FrozenFileChangedError, InfraRSIError
from infrarsi.rundir import OUTCOME_FILE, STATE_FILE, TUNE_DIR, write_json
from infrarsi.search._patch_stage import make_proposer, prepare_patches, promoted_patches
from infrarsi.search._progress import Progress
from infrarsi.search._revise import PriorReviser
from infrarsi.search._session import RunSession
from infrarsi.search.engine import SearchEngine
from infrarsi.search.searcher import InfraRSISearcher, split_stop_hint
from infrarsi.search.verify import DEFAULT_MDE, Verdict, verify_candidate
from infrarsi.space import config_key
from infrarsi.stats import DEFAULT_PAIRS
from infrarsi.trial import TrialRecord


@dataclass(frozen=True)
class RunOutcome:
    """What ``infrarsi run`` ends with (also ``run_outcome.json``): the trials spent, the best
    search trial, every verification verdict and the promoted one (None: nothing cleared the
    noise floor), why the search stopped early, and the patches searched and promoted."""

    run_id: str
    trials: int
    best: TrialRecord | None
    verdicts: list[Verdict] = field(default_factory=list)
    promoted: Verdict | None = None
    stop_reason: str | None = None
    verified_patches: list[str] = field(default_factory=list)
    # the patches the promoted config turns on: id, origin, files, digest, diff
    promoted_patches: list[dict[str, Any]] = field(default_factory=list)
    run_dir: Path | None = None

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
        }

    @property
    def speedup(self) -> float | None:
        """The promoted config's verified speedup (None when nothing was promoted)."""
        return self.promoted.speedup if self.promoted else None



def _trainable(config: dict[str, Any], *, spec_dict: dict[str, Any], run_dir: str,
               local_mode: bool, patches: list[dict[str, Any]] | None = None,
               conflicts: list[list[str]] | None = None, fresh_processes: bool = False,
               pool_name: str | None = None) -> None:
    """One Tune trial: one Ray Train job of ``config``; reports the whole record.

    ``patches`` (plain dicts) are the run's verified patches: a config with patch knobs on is
    materialized here, in the trial's own process, and runs in that patched copy. ``pool_name``:
    the driver's warm worker pool (None: fresh processes)."""
    from ray import tune

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.contract import TaskSpec

    contract = Contract.load(Path(run_dir))  # re-verifies frozen files in the trial process
    backend = RayTrainBackend(TaskSpec.from_dict(spec_dict), contract=contract, local_mode=local_mode,
                              fresh_processes=fresh_processes, pool_name=pool_name)
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
               proposer: Any = None, fresh_processes: bool = False) -> RunOutcome:
    """Search ``budget`` trials, verify the best, promote what clears the noise floor.

    ``patches=False`` searches launch knobs only (``--no-patches``); ``proposer`` overrides the
    one the task spec implies (LLM when it has an ``llm:`` section, else expert).
    Trials run in a warm pool of worker groups reused across trials of the same process-level
    settings; ``fresh_processes=True`` (``--fresh-processes``) starts new ones for every trial."""
    if budget < 1:
        raise InfraRSIError(f"--budget {budget}: give at least 1 trial")
    run_dir = Path(run_dir).resolve()  # trials run with their own working directory
    with RunSession.open(run_dir, resume=resume, bank_url=bank_url, local_mode=local_mode,
                         progress=progress, fresh_processes=fresh_processes) as session:
        session.proposer = proposer or make_proposer(session.spec, progress)
        setup = prepare_patches(session, enabled=patches, resume=resume, proposer=session.proposer)
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
        _judge_priors(session, engine)
        best = engine.best()
        if engine.stop_reason:
            progress(f"search stopped: {engine.stop_reason}")
        verdicts = _verify(session, engine, verify_top, pairs, table)
        winners = [v for v in verdicts if v.promoted]
        promoted = (max(winners, key=lambda v: (v.ci_low or 0.0, v.speedup or 0.0))
                    if winners else None)
        outcome = RunOutcome(
            session.run_id, len(engine.observations), best[0] if best else None,
            verdicts=verdicts, promoted=promoted, stop_reason=engine.stop_reason,
            verified_patches=[p.id for p in session.patches],
            promoted_patches=promoted_patches(promoted.config, session.patches) if promoted else [],
            run_dir=run_dir)
        if promoted is not None:
            session.promote(promoted)
        write_json(run_dir / OUTCOME_FILE, outcome.to_dict())
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


def _judge_priors(session: RunSession, engine: SearchEngine) -> None:
    """The priors against every trial of the search, kept for the report's priors section."""
    try:
        if engine.priors and engine.observations:
            engine.judge_priors()
            session.save_state(engine.state_dict())
    except Exception as e:  # noqa: BLE001 - the report then shows the priors without a verdict
        session.progress(f"warning: could not judge the priors against the trials ({e})")


def _tune(session: RunSession, engine: SearchEngine, n: int, state_path: Path,
          table: Progress, max_concurrent: int) -> None:
    import ray
    from ray import tune

    session.ensure_ray()

    def on_record(trial_id: str, record: TrialRecord, origin: str, live: dict | None) -> None:
        session.record(record, origin)
        if origin.startswith("seed:baseline") and record.ok:
            session.baseline_step_s = table.baseline_step_s = record.step_time_s
        table.row(len(engine.observations), record, origin, live)
        reviser.after_trial(engine)  # before the next suggestion, which the revision informs
        session.save_state(engine.state_dict())
        # Every trial re-hashes the frozen files and fails when one changed; stop at the first
        # such trial instead of spending the rest of the budget on failures.
        try:
            session.contract.verify_frozen()
        except FrozenFileChangedError as e:
            searcher.halt(str(e))

    reviser = PriorReviser(session.proposer, session.proposer_context, session.progress)
    searcher = InfraRSISearcher(engine, state_path=state_path, on_record=on_record,
                                on_suggest=session.open_trial, early_stop=True)
    trainable = tune.with_parameters(_trainable, spec_dict=session.spec.to_dict(),
                                     run_dir=str(session.run_dir), local_mode=session.local_mode,
                                     patches=[p.to_dict() for p in session.patches],
                                     conflicts=[list(c) for c in session.patch_conflicts],
                                     fresh_processes=session.fresh_processes,
                                     pool_name=session.pool_name())
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
            storage_path=str((session.run_dir / TUNE_DIR).resolve()), verbose=0, log_to_file=False,
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
    candidates = [c for _, c in sorted(ranked.values(), key=lambda t: -t[0])[:top]]
    if not candidates:
        session.progress("verification: no candidate faster than nothing to verify")
        return []
    mde = session.noise_floor(pairs)
    if mde is None:
        mde = DEFAULT_MDE
        session.progress(f"no doctor noise model for this workload: using a {DEFAULT_MDE:.0%} "
                         "noise floor (run `infrarsi doctor` for a measured one)")
    else:
        session.progress(f"noise floor for {pairs} verification pairs (doctor's noise model): "
                         f"promote when the speedup's 95% lower bound exceeds {1 + mde:.3f}")
    verdicts = []
    for i, cand in enumerate(candidates):
        table.note(f"verifying candidate {i + 1}/{len(candidates)} with {pairs} interleaved pairs")
        v = verify_candidate(session.backend, baseline, cand, pairs=pairs, mde=mde,
                             tag=f"verify{i}", max_pairs=2 * pairs,
                             on_record=lambda rec, origin: session.record(rec, origin))
        table.note(("PROMOTABLE: " if v.promoted else "not promoted: ") + v.reason)
        verdicts.append(v)
    return verdicts
