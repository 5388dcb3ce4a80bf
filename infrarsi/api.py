"""The Python API: one function per stage, each returning a typed, frozen result with
``to_dict()``. The command line is a thin layer over these; a notebook on the Ray head node
calls them directly::

    import infrarsi

    init = infrarsi.init("configs/tasks/cpu_dense.yaml")      # -> InitResult
    doc = infrarsi.doctor(init.run_dir)                       # -> DoctorResult
    out = infrarsi.run(init.run_dir, budget=12)               # -> RunOutcome
    rep = infrarsi.report(init.run_dir)                       # -> ReportResult
    br = infrarsi.apply(init.run_dir)                         # -> ApplyResult (a new branch)

``infrarsi.doctor``, ``infrarsi.report`` and ``infrarsi.apply`` are the stage packages, made
callable (``run_doctor``, ``build_report``, ``apply_run``); ``init`` and ``run`` are here.
Every ``run_dir`` defaults to the last initialized run (``runs/LATEST``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from infrarsi.apply.stage import ApplyResult, apply_run
from infrarsi.doctor.stage import DoctorResult, run_doctor
from infrarsi.init_stage import InitResult, init
from infrarsi.report.stage import ReportResult, build_report
from infrarsi.rundir import resolve_run_dir
from infrarsi.search.run_stage import RunOutcome, run_search
from infrarsi.stats import DEFAULT_PAIRS

__all__ = ["ApplyResult", "DoctorResult", "InitResult", "ReportResult", "RunOutcome", "apply",
           "doctor", "init", "report", "run"]

doctor = run_doctor
report = build_report
apply = apply_run


def run(run_dir: str | Path | None = None, *, budget: int, resume: bool = False,
        verify_top: int = 2, pairs: int = DEFAULT_PAIRS, max_concurrent: int = 1,
        local_mode: bool = False, bank_url: str | None = None, cold: bool = False,
        patches: bool = True, progress: Callable[[str], None] = print) -> RunOutcome:
    """Search ``budget`` trials of the run in ``run_dir`` (default: the last ``init``), then
    re-measure the ``verify_top`` best against the baseline in ``pairs`` interleaved pairs and
    promote the one whose speedup clears doctor's noise floor.

    ``resume`` continues a run whose driver died; ``cold`` ignores the bank's experience;
    ``patches=False`` searches launch knobs only; ``progress`` receives the progress table's
    lines. The outcome's ``promoted`` is None when nothing cleared the floor."""
    return run_search(resolve_run_dir(run_dir), budget=budget, resume=resume,
                      verify_top=verify_top, pairs=pairs, max_concurrent=max_concurrent,
                      local_mode=local_mode, bank_url=bank_url, progress=progress,
                      use_experience=not cold, patches=patches)
