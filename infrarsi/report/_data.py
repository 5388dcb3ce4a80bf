"""Everything a report needs, gathered once from the run directory and the bank.

Sources, in order of authority: ``contract.json`` (the locked task), the bank (every trial
record and its origin, the promotion, patches, findings, the run's fingerprints),
``run_outcome.json`` (verdicts; absent while a run is in progress), ``searcher_state.json``
(prior revisions and pairings), ``doctor.json`` (noise floor, phase profile, measured peak).
A missing optional source makes the report say so; it never makes the report fail.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.contract import Contract
from infrarsi.doctor.record import DoctorRecord
from infrarsi.errors import BankError, InfraRSIError
from infrarsi.rundir import (
    CONTRACT_FILE,
    DOCTOR_FILE,
    LOCAL_BANK_FILE,
    OUTCOME_FILE,
    RUN_FILE,
    STATE_FILE,
    lock_holder,
    read_json,
)
from infrarsi.space import PATCH_KNOB_PREFIX as PATCH_PREFIX
from infrarsi.space import config_key
from infrarsi.trial import TrialRecord, TrialStatus


class ReportInputError(InfraRSIError, ValueError):
    """The run directory or bank cannot be reported on; the message says what to run."""


@dataclass(frozen=True)
class Side:
    """One side of the headline (before or after): medians over the trials that measured it."""

    label: str
    step_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_bytes: float | None = None
    trials: tuple[str, ...] = ()


@dataclass
class ReportData:
    run_dir: Path
    contract: Contract
    run_id: str = ""
    run_info: Any = None  # bank RunInfo
    bank_url: str = ""
    records: list[TrialRecord] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)
    outcome: dict[str, Any] | None = None
    promoted: dict[str, Any] | None = None  # the promoted Verdict as a dict
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    patches: list[Any] = field(default_factory=list)  # bank PatchEntry of the promoted config
    findings: list[Any] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)
    doctor: DoctorRecord | None = None
    partial: str | None = None  # why the run is incomplete, None when finished
    not_promoted: str | None = None  # why nothing was promoted
    before: Side | None = None
    after: Side | None = None
    peak_flops: float | None = None
    peak_flops_label: str = ""
    notes: list[str] = field(default_factory=list)

    # ---- derived views ------------------------------------------------------------------
    @property
    def spec(self):
        return self.contract.spec()

    @property
    def task_name(self) -> str:
        return self.contract.task.get("name", "")

    @property
    def baseline_config(self) -> dict[str, Any]:
        return dict(self.contract.baseline_config)

    @property
    def winner_config(self) -> dict[str, Any] | None:
        return dict(self.promoted["config"]) if self.promoted else None

    @property
    def tokens_per_step(self) -> int:
        return int(self.contract.work.get("tokens_per_step") or 0)

    @property
    def capacity_bytes(self) -> int | None:
        caps = [r.memory_capacity_bytes or r.memory_censor_bytes for r in self.records]
        caps = [c for c in caps if c]
        if caps:
            return max(caps)
        gib = (self.contract.task.get("hardware") or {}).get("memory_capacity_gib")
        return int(gib * 2**30) if gib else None

    def origin(self, record: TrialRecord) -> str:
        return self.origins.get(record.trial_id, "")

    def search_records(self) -> list[TrialRecord]:
        """Trials the searcher chose (verification re-measurements excluded)."""
        return [r for r in self.records if not self.origin(r).startswith("verify")]

    def is_baseline(self, record: TrialRecord) -> bool:
        return same_config(record.config, self.baseline_config)

    def baseline_step_s(self) -> float | None:
        """Median step of the untouched baseline in this run; doctor's when the run has none."""
        steps = [r.step_time_s for r in self.records if r.ok and r.step_time_s and self.is_baseline(r)]
        if steps:
            return statistics.median(steps)
        return self.doctor.baseline_step_s if self.doctor else None

    def changed(self, config: dict[str, Any] | None) -> dict[str, tuple[Any, Any]]:
        """Knobs whose value differs from the baseline: name -> (before, after)."""
        if not config:
            return {}
        base = self.baseline_config

        def before(k: str) -> Any:
            return base.get(k, False if k.startswith(PATCH_PREFIX) else None)

        return {k: (before(k), v) for k, v in config.items() if before(k) != v}

    def patch_ids(self) -> list[str]:
        cfg = self.winner_config or {}
        ids = [k[len(PATCH_PREFIX):] for k, v in cfg.items() if k.startswith(PATCH_PREFIX) and v]
        promo = (self.promoted or {}).get("patches") or []
        return list(dict.fromkeys([*ids, *promo]))

    def mfu(self, tokens_per_s: float | None, record: TrialRecord | None = None) -> float | None:
        fpt = float(self.contract.work.get("flops_per_token") or 0.0)
        if not fpt and record is not None:
            fpt = float(record.extra.get("flops_per_token") or 0.0)
        if not (tokens_per_s and fpt and self.peak_flops):
            return None
        hw = record.hardware if record is not None else (self.run_info.hardware if self.run_info else None)
        devices = hw.num_devices if hw is not None else 1
        return fpt * tokens_per_s / (max(devices, 1) * self.peak_flops)


def same_config(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal configs, where a knob absent on one side (e.g. an unused patch) counts as off."""
    keys = set(a) | set(b)
    return all(a.get(k, False if k.startswith(PATCH_PREFIX) else None)
               == b.get(k, False if k.startswith(PATCH_PREFIX) else None) for k in keys) \
        or config_key(a) == config_key(b)


# ---- the bank ---------------------------------------------------------------------------
def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    return None


def open_bank_for(run_dir: Path, contract: Contract, run_id: str, bank_url: str | None):
    """The bank holding ``run_id``: the given URL, the task's, the default, or the run's local
    fallback bank (``RUN/bank.sqlite``, where a run that could not reach its bank wrote)."""
    from infrarsi.bank import ExperienceBank, default_url

    spec_url = (contract.task.get("bank") or {}).get("url")
    candidates = [u for u in (bank_url, spec_url, default_url()) if u]
    local = run_dir / LOCAL_BANK_FILE
    if local.is_file():
        candidates.append(f"sqlite:///{local.resolve()}")
    tried = []
    for url in dict.fromkeys(candidates):
        path = _sqlite_path(url)
        if path is not None and not path.is_file():
            tried.append(f"{url} (no such file)")
            continue
        try:
            bank = ExperienceBank.open(url, retry_s=5.0, seed=False)
        except BankError as e:
            tried.append(f"{url} ({e})")
            continue
        try:
            bank.get_run(run_id)
        except BankError:
            bank.close()
            tried.append(f"{url} (has no run {run_id})")
            continue
        return bank, url
    raise ReportInputError(
        f"cannot find run {run_id} of {run_dir} in any experience bank; tried: " + "; ".join(tried)
        + ". Pass the bank the run wrote to with --bank-url URL (or set $INFRARSI_BANK_URL), "
        "e.g. --bank-url sqlite:////path/to/experience_db/bank.sqlite"
    )


# ---- loading ----------------------------------------------------------------------------
def load_report_data(run_dir: str | Path, *, bank_url: str | None = None) -> ReportData:
    """Gather a run's evidence. Raises :class:`ReportInputError` when there is no run to read."""
    run_dir = Path(run_dir)
    if not (run_dir / CONTRACT_FILE).is_file():
        raise ReportInputError(f"{run_dir} holds no {CONTRACT_FILE}; run `infrarsi init TASK.yaml` "
                               "and `infrarsi run --budget N` first, or pass --run-dir")
    contract = Contract.load(run_dir)
    run = read_json(run_dir / RUN_FILE)
    if not run or not run.get("run_id"):
        raise ReportInputError(f"{run_dir} has a contract but no run yet ({RUN_FILE} is missing); "
                               "start one with `infrarsi run --budget 12`")
    data = ReportData(run_dir=run_dir, contract=contract, run_id=run["run_id"])
    bank, data.bank_url = open_bank_for(run_dir, contract, data.run_id, bank_url)
    try:
        _from_bank(data, bank)
    finally:
        bank.close()
    _from_files(data)
    _peak_flops(data)
    _headline(data)
    data.not_promoted = None if data.promoted else _why_nothing(data)
    return data


def _from_bank(data: ReportData, bank) -> None:
    data.run_info = bank.get_run(data.run_id)
    data.records = bank.trials(data.run_id)
    data.origins = bank.trial_origins(data.run_id)
    promo = bank.promotion(data.run_id)
    if promo is not None:
        data.promoted = {**promo.evidence, "config": promo.config,
                         "patches": list(promo.patches)}
    state = bank.load_state(data.run_id, "searcher")
    if state:
        data.engine = state
    try:
        data.findings = bank.findings(run_id=data.run_id)
    except BankError:
        data.findings = []
    if data.doctor is None:
        entry = bank.latest_baseline(data.run_info.workload, data.run_info.hardware)
        data.doctor = DoctorRecord.from_dict(entry.payload) if entry is not None else None
    data.patches = _patches(data, bank)
    open_trials = bank.count_trials(data.run_id).get("open", 0)
    if open_trials:
        data.notes.append(f"{open_trials} trial(s) still open (running, or left by a dead driver)")


def _patches(data: ReportData, bank) -> list[Any]:
    wanted = data.patch_ids()
    if not wanted:
        return []
    found = {}
    lineage = data.run_info.lineage if data.run_info else None
    for entry in bank.patches(lineage) + bank.patches(run_id=data.run_id):
        if entry.patch_id in wanted and (entry.patch_id not in found or entry.run_id == data.run_id):
            found[entry.patch_id] = entry
    missing = [p for p in wanted if p not in found]
    if missing:
        data.notes.append(f"patch(es) {', '.join(missing)} are in the promoted config but not in "
                          "the bank: their diff and evidence cannot be shown")
    return [found[p] for p in wanted if p in found]


def _from_files(data: ReportData) -> None:
    d = data.run_dir
    outcome = read_json(d / OUTCOME_FILE)
    data.outcome = outcome
    if outcome is not None:
        data.verdicts = list(outcome.get("verdicts") or [])
        if data.promoted is None and outcome.get("promoted"):
            data.promoted = dict(outcome["promoted"])
        elif data.promoted is not None and outcome.get("promoted"):
            data.promoted = {**outcome["promoted"], **data.promoted}
    else:
        data.partial = _partial_reason(d)
    state = read_json(d / STATE_FILE)
    if state:
        data.engine = state.get("engine", state)
    doctor = read_json(d / DOCTOR_FILE)
    if doctor is not None:
        data.doctor = DoctorRecord.from_dict(doctor)


def _partial_reason(run_dir: Path) -> str:
    pid = lock_holder(run_dir)
    if pid is not None:
        return (f"the run is still in progress (driver pid {pid}); this report shows the trials "
                "finished so far. Run `infrarsi report` again when it ends")
    return ("the run has not finished (no run_outcome.json): its driver stopped before "
            "verification. Continue it with `infrarsi run --resume --budget N`")


def _peak_flops(data: ReportData) -> None:
    hw = data.run_info.hardware if data.run_info else None
    if hw is not None and hw.device_name.lower() != "cpu" and hw.peak_flops:
        data.peak_flops, data.peak_flops_label = hw.peak_flops, f"{hw.device_name} datasheet peak"
        return
    doc = data.doctor
    if doc is not None and doc.peak_flops:
        data.peak_flops = doc.peak_flops
        data.peak_flops_label = doc.peak_label or (
            "measured CPU matmul peak (doctor)" if hw is None
            or hw.device_name.lower() == "cpu" else "doctor's peak")
        return
    if hw is not None and hw.peak_flops:
        data.peak_flops, data.peak_flops_label = hw.peak_flops, "hardware fingerprint peak"


# ---- headline ---------------------------------------------------------------------------
def _side(data: ReportData, label: str, recs: list[TrialRecord],
          steps: list[float] | None = None) -> Side:
    ok = [r for r in recs if r.ok and r.step_time_s]
    steps = steps or [r.step_time_s for r in ok]
    step = statistics.median(steps) if steps else None
    tps = data.tokens_per_step / step if step and data.tokens_per_step else None
    peaks = [r.peak_memory_max_bytes for r in ok if r.peak_memory_max_bytes]
    return Side(label, step, tps, data.mfu(tps, ok[0] if ok else None),
                statistics.median(peaks) if peaks else None, tuple(r.trial_id for r in ok))


def _headline(data: ReportData) -> None:
    by_id = {r.trial_id: r for r in data.records}
    baseline = [r for r in data.records if data.is_baseline(r)]
    v = data.promoted or _best_verdict(data)
    if v is not None and v.get("pairs"):
        pairs = v["pairs"]
        b = [by_id[t] for t in v.get("baseline_trials", []) if t in by_id] or baseline
        c = [by_id[t] for t in v.get("candidate_trials", []) if t in by_id]
        data.before = _side(data, "baseline", b, [p[0] for p in pairs])
        data.after = _side(data, "promoted" if data.promoted else "best candidate (not promoted)",
                           c, [p[1] for p in pairs])
        return
    data.before = _side(data, "baseline", baseline)
    best = _best_search_record(data)
    if best is not None:
        data.after = _side(data, "best trial (not verified)", [best])


def _best_verdict(data: ReportData) -> dict[str, Any] | None:
    scored = [v for v in data.verdicts if v.get("speedup")]
    return max(scored, key=lambda v: v.get("ci_low") or 0.0) if scored else None


def _best_search_record(data: ReportData) -> TrialRecord | None:
    ok = [r for r in data.search_records() if r.ok and r.step_time_s and not data.is_baseline(r)]
    return min(ok, key=lambda r: r.step_time_s) if ok else None


def _why_nothing(data: ReportData) -> str:
    search = data.search_records()
    if data.partial and not data.verdicts:
        return "the run has not reached verification yet"
    if search and all(r.status is TrialStatus.OOM for r in search if not data.is_baseline(r)) \
            and any(not data.is_baseline(r) for r in search):
        n = sum(1 for r in search if not data.is_baseline(r))
        cap = data.capacity_bytes
        return (f"every candidate ran out of memory ({n}/{n} OOM at a capacity of "
                f"{cap / 2**20:,.0f} MiB): the search found no config that fits. Add memory-saving "
                "knobs (activation_checkpointing, smaller micro_batch_size) or a larger capacity"
                if cap else f"every candidate ran out of memory ({n}/{n} OOM)")
    if data.verdicts:
        v = _best_verdict(data)
        if v is not None and v.get("ci_low") is not None:
            return (f"nothing beat the noise floor: the best candidate measured "
                    f"{v['speedup']:.3f}x, but its 95% CI lower bound {v['ci_low']:.3f} does not "
                    f"clear 1 + MDE = {1 + v.get('mde', 0):.3f}. More interleaved pairs "
                    "(--pairs) or longer trials tighten the interval")
        return "no candidate survived verification: " + data.verdicts[0].get("reason", "")
    if (data.outcome or {}).get("stop_reason"):
        return f"the search stopped ({data.outcome['stop_reason']}) with nothing to verify"
    return "no trial was faster than the baseline, so there was nothing to verify"
