"""Plain, frozen values the bank returns (besides TrialRecord)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from infrarsi.trial import HardwareFingerprint, SoftwareVersions, TrialRecord, WorkloadSignature


@dataclass(frozen=True)
class RunInfo:
    """One search run: its task, keys, and where/when/who."""

    run_id: str
    task_name: str
    lineage: str
    contract_hash: str
    workload: WorkloadSignature
    hardware: HardwareFingerprint
    software: SoftwareVersions
    meta: dict[str, Any]
    status: str  # "running", then whatever finish_run was given ("finished", "failed", ...)
    started_at: float
    finished_at: float | None
    host: str
    user: str
    origin: str
    bank_id: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BaselineEntry:
    run_id: str
    payload: dict[str, Any]  # doctor's baseline record and noise model, as doctor wrote it
    created_at: float
    origin: str


@dataclass(frozen=True)
class PatchEntry:
    run_id: str
    patch_id: str
    lineage: str
    diff: str
    files: tuple[str, ...]
    evidence: dict[str, Any]
    verified: bool
    created_at: float
    origin: str


@dataclass(frozen=True)
class Finding:
    """Prior vs measured effect of one knob setting on one workload and hardware."""

    run_id: str
    knob: str
    setting: Any
    workload: WorkloadSignature
    hardware: HardwareFingerprint
    prior: dict[str, Any]
    measured: dict[str, Any]
    flagged: bool  # the prior was miscalibrated
    created_at: float
    origin: str


@dataclass(frozen=True)
class Promotion:
    run_id: str
    config: dict[str, Any]
    patches: tuple[str, ...]
    evidence: dict[str, Any]
    created_at: float
    origin: str


@dataclass(frozen=True)
class SignatureMatch:
    """A (workload, hardware) pair in the bank and its distance to the query."""

    distance: float
    workload: WorkloadSignature
    hardware: HardwareFingerprint
    num_trials: int


@dataclass(frozen=True)
class Neighbour:
    """One trial found by :meth:`ExperienceBank.nearest`, nearest signatures first."""

    distance: float
    record: TrialRecord
    run_id: str
    origin: str
    extra: dict[str, Any] = field(default_factory=dict)
