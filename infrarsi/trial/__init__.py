"""Trial outcomes: the immutable record and the keys (workload, hardware, software)."""

from __future__ import annotations

from infrarsi.trial._context import HardwareFingerprint, SoftwareVersions, WorkloadSignature
from infrarsi.trial._record import ErrorKind, TrialRecord, TrialStatus

__all__ = [
    "ErrorKind",
    "HardwareFingerprint",
    "SoftwareVersions",
    "TrialRecord",
    "TrialStatus",
    "WorkloadSignature",
]
