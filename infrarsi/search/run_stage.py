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

import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune import ProgressReporter

from infrarsi.contract import Contract
from infrarsi.errors import ConfigError, FrozenFileChangedError
from infrarsi.live import live_path
from infrarsi.rundir import OUTCOME_FILE, RUN_FILE, STATE_FILE, TUNE_DIR, read_json, write_json
from infrarsi.search._patch_stage import make_proposer, prepare_patches, promoted_patches
from infrarsi.search._progress import Progress
from infrarsi.search._revise import PriorReviser
from infrarsi.search._session import RunSession
from infrarsi.search._verify_resume import ResumableVerification
from infrarsi.search.engine import SearchEngine
from infrarsi.search.searcher import SENTINEL_ORIGIN, InfraRSISearcher, split_stop_hint
from infrarsi.search.verify import (
    DEFAULT_MDE,
    FALSE_PROMOTION_RATE,
    MAX_LENGTHEN,
    Verdict,
    look_alphas,
    look_schedule,
    plan_pairs,
    plan_trial_length,
    trial_overhead_steps,
    verify_candidate,
)
from infrarsi.space import config_key
from infrarsi.stats import DEFAULT_PAIRS, MIN_PAIRS
from infrarsi.trial import TrialRecord

# The baseline is re-measured (a sentinel trial, not counted in the budget) every this many
# search trials, so the progress table's speedups are against a recent baseline.
SENTINEL_EVERY = 5

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
    # the baseline sentinels measured during the search and their drift from doctor's baseline
    sentinels: list[dict[str, Any]] = field(default_factory=list)
    run_dir: Path | None = None
    # True when ``--resume`` found the run already finished and ran nothing (not serialized)
    already_finished: bool = False

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

    @classmethod
    def from_dict(cls, d: dict[str, Any], run_dir: Path | None = None,
                  already_finished: bool = False) -> RunOutcome:
        def verdict(v: dict[str, Any] | None) -> Verdict | None:
            if v is None:
                return None
            return Verdict(**{**v, "pairs": [tuple(p) for p in v.get("pairs", [])]})

        return cls(d["run_id"], int(d["trials"]),
                   TrialRecord.from_dict(d["best"]) if d.get("best") else None,
                   verdicts=[verdict(v) for v in d.get("verdicts", [])],
                   promoted=verdict(d.get("promoted")), stop_reason=d.get("stop_reason"),
                   verified_patches=list(d.get("verified_patches", [])),
                   promoted_patches=list(d.get("promoted_patches", [])),
                   sentinels=list(d.get("sentinels", [])), run_dir=run_dir,
                   already_finished=already_finished)

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
    from infrarsi.live import PROGRESS_ENV, live_path, write_state

    os.environ[PROGRESS_ENV] = str(live_path(run_dir, trial_id))  # the view's state file
    write_state(os.environ[PROGRESS_ENV], "starting")
    config, stop_slower_than_s = split_stop_hint(config)
    record = backend.execute(config, trial_id=trial_id, stop_slower_than_s=stop_slower_than_s)
    tune.report({"objective": backend.objective(record) or 0.0, "record": record.to_dict(),
                 "status": record.status.value, "device_seconds": record.device_seconds})


def run_search(run_dir: Path, *, budget: int, resume: bool = False, verify_top: int = 2,
               pairs: int = DEFAULT_PAIRS, max_concurrent: int = 1, local_mode: bool = False,
               bank_url: str | None = None, progress: Callable[[str], None] = print,
               use_experience: bool = True, patches: bool = True,
               proposer: Any = None, fresh_processes: bool = False) -> RunOutcome:
    """Search ``budget`` trials, verify the best, promote what clears ``1 + verify.min_effect``.

    ``patches=False`` searches launch knobs only (``--no-patches``); ``proposer`` overrides the
    one the task spec implies (LLM when it has an ``llm:`` section, else expert).
    Trials run in a warm pool of worker groups reused across trials of the same process-level
    settings; ``fresh_processes=True`` (``--fresh-processes``) starts new ones for every trial."""
    if budget < 1:
        raise ConfigError(f"--budget {budget}: give at least 1 trial")
    check_pairs(pairs)
    run_dir = Path(run_dir).resolve()  # trials run with their own working directory
    if resume and (done := finished_outcome(run_dir)) is not None:
        progress(f"run {done.run_id} in {run_dir} is finished: nothing to resume "
                 f"({done.trials} trials; see {run_dir / OUTCOME_FILE}, or `infrarsi report`)")
        return done
    with RunSession.open(run_dir, resume=resume, bank_url=bank_url, local_mode=local_mode,
                         progress=progress, fresh_processes=fresh_processes) as session:
        session.proposer = proposer or make_proposer(session.spec, progress)
        setup = prepare_patches(session, enabled=patches, resume=resume, proposer=session.proposer)
        session.use_patches(setup.verified, setup.conflicts)
        engine = _engine(session, budget, use_experience)
        state_path = run_dir / STATE_FILE
        if resume:
            session.restore_engine(engine, state_path)
        table = Progress(progress, baseline_step_s=session.baseline_step_s,
                         baseline_config=session.backend.baseline_config())
        done = len(engine.observations)
        if done < budget and not engine.stop_reason:
            table.header(budget, engine.n_init, done=done, verify_trials=2 * pairs * verify_top)
            _tune(session, engine, budget - done, state_path, table, max_concurrent)
        elif session.retry:
            session.progress(f"resume: the budget is spent; {len(session.retry)} interrupted "
                             "trial(s) not run again")
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
            sentinels=list(session.sentinels), run_dir=run_dir)
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
    engine = SearchEngine(
        backend.space, backend.workload, backend.hardware, budget=budget,
        seed=session.seed, experience=experience, priors=session.priors(),
        objective=backend.objective, baseline=backend.baseline_config(),
        include_baseline=session.baseline_step_s is None,
        baseline_records=session.baseline_records,
    )
    if experience:  # how many records the search uses, from where, and why others were dropped
        session.progress(engine.projection.summary())
        if not engine.experience:
            session.progress("none of the bank's records fit this search space: starting cold")
    return engine


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
        live_path(session.run_dir, trial_id).unlink(missing_ok=True)  # its live state is over
        if origin.startswith("seed:baseline") and record.ok:
            session.baseline_step_s = table.baseline_step_s = record.step_time_s
        if origin == SENTINEL_ORIGIN:
            session.sentinel_measured(record, table)
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
    # A doctor baseline is re-measured as a sentinel every SENTINEL_EVERY trials (twice first
    # when doctor measured it on a busy machine); without one the seed baseline is measured.
    sentinel = session.backend.baseline_config() if session.baseline_step_s else None
    first = 2 if sentinel is not None and session.doctor_contended else 0
    searcher = InfraRSISearcher(engine, state_path=state_path, on_record=on_record,
                                on_suggest=session.open_trial, early_stop=True,
                                retry=session.retry[:n], sentinel=sentinel,
                                sentinel_every=SENTINEL_EVERY, sentinel_first=first,
                                search_trials=n)
    if sentinel is not None:
        n += first + n // SENTINEL_EVERY
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
            # Tune's own reporter is off: in a notebook it clear_output()s the cell, erasing
            # our table's header and the lines before it
            progress_reporter=_NoTuneOutput(),
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False)),
    )

    def running() -> list[tuple[str, int, str, dict, float]]:
        return [(tid, len(engine.observations) + 1 + j, live["origin"], live["config"],
                 live.get("started", time.time()))
                for j, (tid, live) in enumerate(list(searcher._live.items()))]  # noqa: SLF001

    with warnings.catch_warnings(), _LiveView(table, session.run_dir, running):
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
        session.progress("verification: no trial other than the baseline ran ok; nothing to verify")
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
    # A resumed run replays the pairs an earlier driver finished and measures the rest under
    # new trial ids (see _verify_resume); every trial it runs heartbeats in the bank and
    # writes its live state, which the view shows while it runs.
    backend = ResumableVerification(backend, session.verification_done(),
                                    attempt=session.attempt, open_trial=session.open_trial,
                                    record=session.record, live_dir=session.run_dir)
    for i, (obj, cand) in enumerate(ranked_top):
        expected = obj / baseline_obj if baseline_obj else None
        planned = plan_pairs(noise, min_effect=min_effect, expected_speedup=expected,
                             default=pairs, cap=4 * pairs, steps=steps)
        mde = session.noise_floor(planned)
        looks = look_schedule(planned, 2 * planned)
        table.verify_start(i + 1, len(candidates), planned, cand, looks, look_alphas(looks))
        table.note(f"  up to {2 * planned} pairs while the verdict is open"
                   + (f"; doctor's MDE at {planned} pairs {mde:.1%} (planning only)"
                      if mde is not None else ""))
        last: dict[str, TrialRecord] = {}

        def on_record(rec: TrialRecord, origin: str, _last=last) -> None:
            # (the wrapper wrote each trial to the bank when it finished)
            replayed = rec.trial_id in backend.replayed_ids
            _last[origin] = rec
            if origin == "verify:candidate" and "verify:baseline" in _last:
                table.verify_pair(_last["verify:baseline"], rec, bar=1 + min_effect,
                                  replayed=replayed)

        with _LiveView(table, session.run_dir, backend.running):
            v = verify_candidate(backend, baseline, cand, pairs=planned,
                                 mde=mde if mde is not None else DEFAULT_MDE,
                                 min_effect=min_effect, tag=f"verify{i}", max_pairs=2 * planned,
                                 measured_steps=steps, on_record=on_record)
        table.note(("PROMOTABLE: " if v.promoted else "not promoted: ") + v.reason)
        verdicts.append(v)
    if backend.replayed:
        session.progress(f"resume: {backend.replayed} verification trial(s) of the earlier "
                         "driver kept (their pairs were complete); the rest measured anew")
    return verdicts


def check_pairs(pairs: int) -> None:
    """Refuse a ``--pairs`` with which nothing could ever be promoted (raises ConfigError).

    See ``infrarsi.stats.MIN_PAIRS`` for why the smallest useful number is 3."""
    if pairs < MIN_PAIRS:
        raise ConfigError(f"--pairs {pairs}: with fewer than {MIN_PAIRS} interleaved pairs no "
                          f"candidate can ever be promoted; give --pairs {MIN_PAIRS} or more "
                          f"(default {DEFAULT_PAIRS})")


def finished_outcome(run_dir: Path) -> RunOutcome | None:
    """The outcome of the run recorded in ``run_dir`` when it finished, else None."""
    run = read_json(run_dir / RUN_FILE)
    data = read_json(run_dir / OUTCOME_FILE)
    if not run or not data or data.get("run_id") != run.get("run_id"):
        return None
    return RunOutcome.from_dict(data, run_dir=run_dir, already_finished=True)


class _LiveView:
    """While a phase runs, a thread shows each running trial's state every ``every_s``
    seconds (read from its live file, see :mod:`infrarsi.live`). ``running()`` lists
    ``(trial_id, n, origin, config, started)`` of the trials in flight."""

    def __init__(self, table: Progress, run_dir: Path, running: Callable[[], list],
                 every_s: float = float(os.environ.get("INFRARSI_LIVE_EVERY_S", 10.0))) -> None:
        import threading

        self.table, self.run_dir, self.running, self.every_s = table, run_dir, running, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="infrarsi-view")

    def __enter__(self) -> _LiveView:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        from infrarsi.live import live_path, read_state

        while not self._stop.wait(self.every_s):
            try:
                for tid, n, origin, config, started in self.running():
                    self.table.running(n, origin, config, read_state(live_path(self.run_dir, tid)),
                                       started)
            except Exception:  # noqa: BLE001, S112 - the view must never stop a run
                continue



class _NoTuneOutput(ProgressReporter):
    """Tune's progress reporter that never reports (the run's own table is the output)."""

    def should_report(self, trials, done: bool = False) -> bool:
        return False

    def report(self, trials, done: bool, *sys_info: str) -> None:
        return None

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
