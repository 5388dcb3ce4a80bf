"""``infrarsi report``: argument parsing and printing only (the stage is ``build_report``)."""

from __future__ import annotations

import argparse

BANK_HELP = ("experience bank URL the run wrote to (default: the task's, $INFRARSI_BANK_URL, "
             "else experience_db/bank.sqlite; the run's own RUN/bank.sqlite is tried too)")


def add_run_dir_arguments(s: argparse.ArgumentParser) -> None:
    """The run directory, positional or ``--run-dir`` (both default to the last one)."""
    s.add_argument("run", nargs="?", help="run directory (same as --run-dir)")
    s.add_argument("--run-dir", help="run directory from `infrarsi init` (default: the last one)")


def cmd_report(args: argparse.Namespace) -> int:
    from infrarsi.report.stage import build_report

    result = build_report(args.run or args.run_dir, out_dir=args.out, bank_url=args.bank_url)
    print(result.summary)
    return 0


def add_report_subcommand(sub) -> None:
    s = sub.add_parser("report", help="write report.md and report.html for a run, print a summary")
    add_run_dir_arguments(s)
    s.add_argument("--out", help="where to write the report (default: RUN/report)")
    s.add_argument("--bank-url", help=BANK_HELP)
    s.set_defaults(func=cmd_report)
