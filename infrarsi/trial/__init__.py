"""Trial outcomes: the immutable record and the keys (workload, hardware, software)."""

from __future__ import annotations

from infrarsi.trial._context import HardwareFingerprint, SoftwareVersions, WorkloadSignature
from infrarsi.trial._record import (
    EARLY_STOP_CHECK_STEPS,
    ErrorKind,
    TrialRecord,
    TrialStatus,
    clearly_slower,
)

__all__ = [
    "EARLY_STOP_CHECK_STEPS",
    "ErrorKind",
    "HardwareFingerprint",
    "SoftwareVersions",
    "TrialRecord",
    "TrialStatus",
    "WorkloadSignature",
    "clearly_slower",
]
