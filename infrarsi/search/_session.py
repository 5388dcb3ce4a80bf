"""Everything a run holds open: contract, backend, bank, run lock, heartbeats, run id."""

from __future__ import annotations

import json
import math
import os
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infrarsi.contract import Contract
from infrarsi.doctor.record import DoctorRecord
from infrarsi.errors import BankError, InfraRSIError
from infrarsi.rundir import (
    RUN_FILE,
    RunLockedError,
    acquire_lock,
    local_bank_url,
    read_json,
    release_lock,
    write_json,
)
from infrarsi.space import config_key
from infrarsi.stats import mde_at_pairs, noise_model
from infrarsi.trial import ErrorKind, SoftwareVersions, TrialRecord

__all__ = ["RunLockedError", "RunSession"]

# How often an open trial's bank row is touched: a trial in flight when the driver is killed is
# charged the device time up to its last beat, so a short period loses little of it.
HEARTBEAT_S = 2.0
# The progress table's speedups are against the median of this many most recent sentinels.
SENTINEL_WINDOW = 3


def baseline_drift(step_s: float, doctor_step_s: float | None,
                   trial_cv: float | None) -> dict[str, Any]:
    """A baseline sentinel against doctor's baseline: ``drift`` (relative; None without doctor)
    and ``notable`` (beyond twice one trial's noise, doctor's ``trial_cv``, on the log scale)."""
    drift = step_s / doctor_step_s - 1.0 if doctor_step_s else None
    notable = drift is not None and trial_cv is not None and abs(math.log1p(drift)) > 2 * trial_cv
    return {"step_s": step_s, "doctor_step_s": doctor_step_s, "drift": drift,
            "trial_cv": trial_cv, "notable": notable}


class RunSession:
    """Opened by :meth:`open` as a context manager; closes heartbeats, lock and bank on exit.

    Two runs of the same task at once are refused (a pid lock in the run directory): they would
    share a searcher state and a bank run, and their trials would compete for the same CPUs.
    """

    def __init__(self, run_dir: Path, contract: Contract, progress: Callable[[str], None],
                 local_mode: bool, fresh_processes: bool = False) -> None:
        from infrarsi.backends.ray_train import RayTrainBackend

        self.run_dir = run_dir
        self.contract = contract
        self.spec = contract.spec()
        self.progress = progress
        self.local_mode = local_mode
        self.fresh_processes = fresh_processes
        self.backend = RayTrainBackend(self.spec, contract=contract, local_mode=local_mode,
                                       fresh_processes=fresh_processes)
        self.bank = None
        self.run_id = ""
        self.seed = contract.loss_reference.get("seed", 0)
        self.baseline_step_s: float | None = None
        # doctor's measurements of the locked baseline: the search fits them with its own trials
        self.baseline_records: list[TrialRecord] = []
        self.noise: dict[str, Any] | None = None  # doctor's noise model of the baseline
        self.findings: dict[str, Any] = {}  # doctor's digest for proposers (proposer_findings)
        self.patches: list = []  # verified patches searched as knobs (see use_patches)
        self.patch_conflicts: list[tuple[str, str, str]] = []
        self.attempt = 1  # which driver of this run this is (1: the first; see run.json)
        self.interrupted: list[str] = []  # trials the last driver left open, closed at resume
        self.retry: list[tuple[dict, str]] = []  # (config, origin) of search trials to run again
        self.doctor_baseline_step_s: float | None = None  # doctor's figure, kept for drift
        self.doctor_contended = False  # doctor's repeats ran on a busy machine (its findings)
        self.sentinels: list[dict[str, Any]] = []  # see sentinel_measured
        self._sentinel_series: list[list[float]] = []
        self.proposer: Any = None  # priors, patches and revisions (set by the run stage)
        self._beats: dict[str, Any] = {}

    # ---- lifecycle --------------------------------------------------------------------
    @classmethod
    def open(cls, run_dir: Path, *, resume: bool, bank_url: str | None, local_mode: bool,
             progress: Callable[[str], None], fresh_processes: bool = False) -> RunSession:
        contract = Contract.load(run_dir)
        contract.verify_frozen()
        session = cls(run_dir, contract, progress, local_mode, fresh_processes)
        session._lock()
        try:
            session._reap_previous_ray()
            session._open_bank(bank_url)
            session._start_or_resume(resume)
            session._load_doctor()
        except BaseException:
            session.close()
            raise
        return session

    def __enter__(self) -> RunSession:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and self.bank is not None and self.run_id:
            try:
                self.bank.finish_run(self.run_id, "failed")
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
        self.close()

    def close(self) -> None:
        for beat in list(self._beats.values()):
            beat.__exit__(None, None, None)
        self._beats.clear()
        if not self.fresh_processes and not self.local_mode:
            from infrarsi.backends.ray_train._pool import shutdown_process_pool

            shutdown_process_pool()  # the warm groups' CPUs and GPUs are free again
        if self.bank is not None:
            self.bank.close()
            self.bank = None
        release_lock(self.run_dir)

    def _lock(self) -> None:
        acquire_lock(self.run_dir)

    def _open_bank(self, url: str | None) -> None:
        from infrarsi.bank import ExperienceBank

        url = url or self.spec.bank.url
        try:
            self.bank = ExperienceBank.open(url, retry_s=10.0)
        except BankError as e:
            fallback = local_bank_url(self.run_dir)
            self.progress(f"warning: the experience bank is unreachable ({e}); running cold with "
                          f"a local bank at {fallback}")
            self.bank = ExperienceBank.open(fallback, seed=False)

    def _start_or_resume(self, resume: bool) -> None:
        run_file = self.run_dir / RUN_FILE
        previous = read_json(run_file)
        if resume and previous is None:
            raise InfraRSIError(f"--resume: no earlier run in {self.run_dir}; start one with "
                                "`infrarsi run --budget N`")
        run_id = previous["run_id"] if resume else None
        self.run_id = self.bank.start_run(
            self.spec.name, self.contract.sha256, self.backend.workload, self.backend.hardware,
            SoftwareVersions.current(), {"run_dir": str(self.run_dir.resolve())}, run_id=run_id)
        if resume:
            self.attempt = int(previous.get("attempt", 1)) + 1
            closed = self.bank.close_stale_trials(self.run_id, older_than_s=0)
            self.interrupted = closed
            if closed:
                self.progress(f"resume: {len(closed)} trial(s) left open by the dead driver were "
                              f"closed as interrupted (their device time up to the kill is "
                              f"recorded; each is run again): {', '.join(closed)}")
        write_json(run_file, {"run_id": self.run_id, "attempt": self.attempt})

    def _reap_previous_ray(self) -> None:
        """Stop the Ray processes a killed earlier driver of this run folder left behind."""
        from infrarsi.search._ray_owner import reap_previous

        for line in reap_previous(self.run_dir):
            self.progress(line)

    def _load_doctor(self) -> None:
        entry = self.bank.latest_baseline(self.backend.workload, self.backend.hardware)
        if entry is None:
            return
        doc = DoctorRecord.from_dict(entry.payload)
        self.noise = doc.noise if doc.has_noise_model else None
        self.findings = doc.proposer_findings()
        self.baseline_step_s = doc.baseline_step_s or doc.noise.get("baseline_step_s")
        self.doctor_baseline_step_s = self.baseline_step_s
        self.doctor_contended = doc.contended
        if self.doctor_contended:
            self.progress("doctor measured the baseline on a busy machine ("
                          + doc.contention.get("summary", "contention") + "): the "
                          "run re-measures the baseline twice before searching and re-estimates "
                          "the noise from those trials")
        ids = set(doc.records)
        try:
            self.baseline_records = [r for r in self.bank.trials(run_id=entry.run_id)
                                     if r.trial_id in ids]
        except BankError as e:
            self.progress(f"bank: doctor's baseline trials unreadable ({e}); searching without")

    def noise_floor(self, pairs: int) -> float | None:
        """The minimum detectable effect of a ``pairs``-pair verification from doctor's noise
        model (None without a doctor run): following doctor's advice (``--pairs N``) really
        lowers the bar."""
        return None if self.noise is None else mde_at_pairs(self.noise, pairs)

    # ---- during the run ---------------------------------------------------------------
    def sentinel_measured(self, record: TrialRecord, table) -> None:
        """A baseline sentinel finished: the progress table reads speedups against it from now
        on; its drift from doctor's baseline is reported (and kept for ``run_outcome.json``);
        after two sentinels on a run whose doctor ran under contention, the noise model is
        re-estimated from them."""
        if not record.ok or not record.step_time_s:
            table.note(f"baseline sentinel {record.trial_id} was {record.status.value}: the "
                       "table keeps its earlier baseline")
            return
        drift = baseline_drift(record.step_time_s, self.doctor_baseline_step_s,
                               (self.noise or {}).get("trial_cv"))
        self.sentinels.append({"trial_id": record.trial_id, **drift})
        # the table's baseline: the median of the recent sentinels, so one noisy baseline trial
        # does not move every speedup after it (a sentinel read 246 then 318 ms on a busy box)
        recent = [s["step_s"] for s in self.sentinels[-SENTINEL_WINDOW:]]
        table.baseline_step_s = self.baseline_step_s = statistics.median(recent)
        table.sentinel(drift, baseline_step_s=self.baseline_step_s, window=len(recent))
        if self.doctor_contended and record.step_times_s:
            self._sentinel_series.append(list(record.step_times_s))
            if len(self._sentinel_series) == 2:
                self.noise = {**noise_model(self._sentinel_series), "source": "run sentinels"}
                table.note(f"noise re-estimated from the sentinels (doctor's was taken under "
                           f"contention): trial CV {self.noise['trial_cv']:.1%}")

    def experience(self) -> list[TrialRecord]:
        """Finished trials of other runs, nearest signatures first (this run excluded)."""
        try:
            near = self.bank.nearest(self.backend.workload, self.backend.hardware, k=400)
        except BankError as e:
            self.progress(f"warning: experience query failed ({e}); starting cold")
            return []
        return [n.record for n in near if n.run_id != self.run_id]

    def use_patches(self, verified: list, conflicts: list[tuple[str, str, str]] = ()) -> None:
        """Search ``verified`` patches as bool knobs: the backend becomes a PatchedBackend."""
        from infrarsi.search._patched import PatchedBackend

        self.patches, self.patch_conflicts = list(verified), [tuple(c) for c in conflicts]
        if self.patches:
            self.backend = PatchedBackend.ray_train(self.backend, self.patches,
                                                    conflicts=self.patch_conflicts)

    def proposer_context(self, **fields: Any):
        """The proposer context of this run (space, shape, hardware, doctor's findings...)."""
        from infrarsi.proposers import ProposerContext

        return ProposerContext(
            space=self.backend.space, workload=self.backend.workload,
            hardware=self.backend.hardware, spec=self.spec, contract=self.contract,
            patches=tuple(self.patches), findings=self.findings or {}, bank=self.bank,
            run_id=self.run_id or None, **fields)

    def priors(self) -> list:
        """The proposer's priors (``self.proposer``: the LLM one when the spec has an ``llm:``
        section, else the expert), logged side by side per source in ``priors.json``."""
        try:
            from infrarsi.proposers import ExpertProposer
            from infrarsi.search._revise import log_priors
        except ImportError:
            return []
        proposer = self.proposer or ExpertProposer()
        try:
            priors = list(proposer.priors(self.proposer_context()))
        except Exception as e:  # noqa: BLE001 - priors are advice; a broken one must not stop a run
            self.progress(f"warning: the {proposer.name} proposer failed ({e}); searching "
                          "without priors")
            return []
        try:
            log_priors(self.run_dir, proposer, priors, self.progress)
        except OSError as e:
            self.progress(f"warning: could not write the priors log ({e})")
        return priors

    def open_trial(self, trial_id: str, config: dict, origin: str) -> None:
        from infrarsi.bank import TrialHeartbeat

        beat = TrialHeartbeat(self.bank, self.run_id, trial_id, config, every_s=HEARTBEAT_S,
                              origin=origin, backend=self.backend.name)
        beat.__enter__()
        self._beats[trial_id] = beat

    def record(self, record: TrialRecord, origin: str) -> None:
        beat = self._beats.pop(record.trial_id, None)
        if beat is not None:
            beat.__exit__(None, None, None)
        self.bank.record_trial(self.run_id, record, origin)

    def save_state(self, state: dict[str, Any]) -> None:
        self.bank.save_state(self.run_id, "searcher", state)

    def restore_engine(self, engine, state_path: Path) -> None:
        """Rebuild the searcher state; add bank trials the state missed (killed mid-save).

        A trial the killed driver had in flight is not a measurement: it stays in the bank
        (with the device time it used) but not among the engine's observations, so it costs
        no budget, and its config is queued in ``self.retry`` to run first, unless a later
        trial already measured that config."""
        state = self.bank.load_state(self.run_id, "searcher")
        if state is None and state_path.is_file():
            state = json.loads(state_path.read_text()).get("engine")
        if state is not None:
            engine.load_state_dict(state)
        engine.pending.clear()  # trials of the dead driver were closed as interrupted
        engine.observations = [o for o in engine.observations if not _interrupted(o["record"])]
        known = {o["record"]["trial_id"] for o in engine.observations}
        origins = self.bank.trial_origins(self.run_id)
        lost: dict[str, tuple[dict, str]] = {}
        for rec in self.bank.trials(self.run_id):
            origin = origins.get(rec.trial_id, "")
            if origin.startswith(("verify", "sentinel")) or rec.trial_id in known:
                continue
            if rec.error_kind is ErrorKind.INTERRUPTED:
                lost[config_key(rec.config)] = (dict(rec.config), origin)
            else:
                engine.observations.append({"record": rec.to_dict(), "origin": origin})
        measured = {config_key(o["record"]["config"]) for o in engine.observations}
        self.retry = [v for k, v in lost.items() if k not in measured]
        self.progress(f"resume: {len(engine.observations)} trial(s) already done"
                      + (f", {len(self.retry)} interrupted one(s) to run again"
                         if self.retry else ""))

    def verification_done(self) -> list[TrialRecord]:
        """Every finished verification trial of this run (any driver), for the replay."""
        origins = self.bank.trial_origins(self.run_id)
        return [r for r in self.bank.trials(self.run_id)
                if origins.get(r.trial_id, "").startswith("verify")]

    def promote(self, verdict) -> None:
        from infrarsi.patches import enabled_patches

        ids = [p.id for p in enabled_patches(verdict.config, self.patches)]
        self.bank.record_promotion(self.run_id, verdict.config, ids, verdict.to_dict())

    def finish(self, status: str) -> None:
        self.bank.finish_run(self.run_id, status)

    # ---- Ray --------------------------------------------------------------------------
    def ensure_ray(self) -> None:
        import ray

        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            from infrarsi.backends.ray_train._priority import with_trial_priority

            # trials run at the driver's priority: Ray's default nice 15 let any busy process
            # on a shared machine slow them ~10x (see _priority)
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False,
                                      "runtime_env": with_trial_priority()}
            if not address:
                kwargs["resources"] = {TRIAL_DRIVER_RESOURCE: 64}
                from infrarsi.search._ray_owner import claim

                claim(self.run_dir)  # so a next driver can stop what a killed one leaves
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ray.init(address=address or None, **kwargs)
            if not address:
                from infrarsi.search._ray_owner import record_session

                record_session(self.run_dir)

    def pool_name(self) -> str | None:
        """The name of this driver's warm worker pool, for Tune's trial processes (None with
        fresh processes or in local mode)."""
        if self.fresh_processes or self.local_mode:
            return None
        from infrarsi.backends.ray_train._pool import process_pool

        self.ensure_ray()
        return process_pool()[0]

    def trial_driver_resources(self) -> dict[str, float]:
        """What a Tune trial's own process holds: no CPU (its Train workers hold those)."""
        import ray

        if ray.cluster_resources().get(TRIAL_DRIVER_RESOURCE):
            return {"cpu": 0, "custom_resources": {TRIAL_DRIVER_RESOURCE: 1}}
        # A cluster started without the custom resource: a sliver of memory keeps the trial's
        # placement bundle non-empty without taking a CPU from the workers.
        return {"cpu": 0, "memory": 1 << 20}


def _interrupted(record: dict[str, Any]) -> bool:
    return record.get("error_kind") == ErrorKind.INTERRUPTED.value


# Started on the local Ray by the run stage (and documented for clusters in cluster/):
# one unit per concurrent trial driver, so Tune's trial processes never take a worker's CPU.
TRIAL_DRIVER_RESOURCE = "infrarsi_trial_driver"
