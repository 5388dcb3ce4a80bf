"""The doctor stage (``infrarsi doctor``): the baseline's phase profile, MFU and noise floor.

``run_doctor(run_dir)`` runs the locked baseline several times through the search's trial path,
profiles one extra step per trial, and stores the baseline record (step time, noise model with
the minimum detectable effect, profile, MFU, bottleneck findings) in the bank and in
``doctor.json``. The package is callable: ``infrarsi.doctor(run_dir, ...)`` is ``run_doctor``.
"""

from __future__ import annotations

from infrarsi._stage_package import make_callable
from infrarsi.doctor.findings import bottleneck_findings
from infrarsi.doctor.mfu import compute_mfu, matmul_speeds, measure_matmul_peak
from infrarsi.doctor.noise import mde_at_pairs, mde_for, noise_model, required_pairs, required_steps
from infrarsi.doctor.profile import fractions, summarize_profile
from infrarsi.doctor.record import DoctorRecord
from infrarsi.doctor.stage import (
    DOCTOR_FILE,
    BaselineUnusableError,
    DoctorResult,
    loss_spread,
    proposer_findings,
    run_doctor,
)
from infrarsi.doctor.table import format_summary

__all__ = [
    "DOCTOR_FILE",
    "BaselineUnusableError",
    "DoctorRecord",
    "DoctorResult",
    "bottleneck_findings",
    "compute_mfu",
    "format_summary",
    "fractions",
    "loss_spread",
    "mde_at_pairs",
    "mde_for",
    "matmul_speeds",
    "measure_matmul_peak",
    "noise_model",
    "proposer_findings",
    "required_pairs",
    "required_steps",
    "run_doctor",
    "summarize_profile",
]

make_callable(__name__, "infrarsi.doctor.stage", "run_doctor")
