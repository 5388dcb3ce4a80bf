"""The public Python API: light to import, one callable per stage, typed records at the seams."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import infrarsi
from infrarsi.doctor.record import DoctorRecord, proposer_findings


def test_import_is_light_and_the_stages_are_reachable():
    code = ("import sys, infrarsi; heavy = [m for m in ('torch', 'ray', 'scipy', 'lifelines') "
            "if m in sys.modules]; infrarsi.init; infrarsi.run; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_stage_packages_are_callable_and_stay_packages():
    import infrarsi.doctor.stage as doctor_stage

    for name, target in (("doctor", "run_doctor"), ("report", "build_report"),
                         ("apply", "apply_run")):
        pkg = getattr(infrarsi, name)
        assert callable(pkg) and hasattr(pkg, target) and hasattr(pkg, "__path__")
    assert infrarsi.doctor.stage is doctor_stage
    assert set(infrarsi.__all__) >= {"init", "doctor", "run", "report", "apply"}
    with pytest.raises(AttributeError):
        infrarsi.no_such_stage  # noqa: B018


def test_calling_a_stage_package_runs_the_stage(tmp_path):
    from infrarsi.errors import ContractError
    from infrarsi.report import ReportInputError

    with pytest.raises(ReportInputError, match="contract.json"):
        infrarsi.report(tmp_path)  # a folder without a run: the stage's own error
    with pytest.raises(ContractError, match="contract.json"):
        infrarsi.run(tmp_path, budget=1)


PAYLOAD = {
    "baseline_step_s": 0.15, "run_id": "r1", "records": ["doctor-0", "doctor-1"],
    "noise": {"mde": 0.04, "within_cv": 0.02, "measured_steps": 10, "pairs": 5},
    "profile": {"fractions": {"forward": 0.4, "backward": 0.6}, "peak_memory_bytes": 123},
    "mfu": {"mfu": 0.2, "peak_flops": 5e10, "peak_label": "CPU measured matmul peak"},
    "matmul": {"fp32_flops": 5e10, "bf16_flops": 1e11},
    "findings": [{"kind": "compute", "message": "compute-bound"}],
    "memory_capacity_bytes": 2**30, "future_key": 1,
}


def test_doctor_record_round_trips_and_reads_the_peak_doctor_writes():
    rec = DoctorRecord.from_dict(json.loads(json.dumps(PAYLOAD)))
    assert rec.mde == 0.04 and rec.peak_flops == 5e10 and rec.records == ("doctor-0", "doctor-1")
    assert rec.peak_label == "CPU measured matmul peak"
    back = rec.to_dict()
    assert {k: back[k] for k in PAYLOAD} == PAYLOAD  # unknown keys kept
    assert proposer_findings(PAYLOAD) == {
        "baseline_step_s": 0.15, "phase_fractions": {"forward": 0.4, "backward": 0.6},
        "mfu": 0.2, "matmul": PAYLOAD["matmul"], "peak_memory_bytes": 123,
        "memory_capacity_bytes": 2**30, "bottlenecks": ["compute-bound"]}
    assert proposer_findings(None) == {}


def test_doctor_record_reads_an_old_bare_noise_payload():
    rec = DoctorRecord.from_dict({"mde": 0.07, "within_cv": 0.03, "baseline_step_s": 0.2})
    assert rec.mde == 0.07 and rec.baseline_step_s == 0.2 and rec.noise["within_cv"] == 0.03
    assert DoctorRecord.from_dict({"status": "failed", "error": "oom"}).has_noise_model is False


def test_cli_registers_every_stage_on_the_api():
    from infrarsi.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    assert {"init", "doctor", "run", "report", "apply", "trial"} <= set(sub)
    assert sub["apply"].get_default("func").__module__ == "infrarsi.apply._cli"
