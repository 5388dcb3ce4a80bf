"""The report stage: evidence a person can read (``infrarsi report``).

``build_report(run_dir)`` writes ``RUN/report/report.md``, a self-contained
``RUN/report/report.html`` (plots embedded as PNG) and ``RUN/report/plots/*.png``;
``load_report_data`` gathers the evidence that ``infrarsi apply`` also uses. The package is
callable: ``infrarsi.report(run_dir, ...)`` is ``build_report``.
"""

from __future__ import annotations

from infrarsi._stage_package import make_callable
from infrarsi.report._data import ReportData, ReportInputError, Side, load_report_data
from infrarsi.report.stage import REPORT_DIR, ReportResult, build_report, summary

__all__ = ["REPORT_DIR", "ReportData", "ReportInputError", "ReportResult", "Side", "build_report",
           "load_report_data", "summary"]

make_callable(__name__, "infrarsi.report.stage", "build_report")
