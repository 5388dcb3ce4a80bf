"""The report stage: evidence a person can read (``infrarsi report``).

``build_report(run_dir)`` writes ``RUN/report/report.md``, a self-contained
``RUN/report/report.html`` (plots embedded as PNG) and ``RUN/report/plots/*.png``;
``load_report_data`` gathers the evidence that ``infrarsi apply`` also uses.
"""

from __future__ import annotations

from infrarsi.report._data import ReportData, ReportInputError, Side, load_report_data
from infrarsi.report.stage import REPORT_DIR, ReportResult, build_report, summary

__all__ = ["REPORT_DIR", "ReportData", "ReportInputError", "ReportResult", "Side", "build_report",
           "load_report_data", "summary"]
