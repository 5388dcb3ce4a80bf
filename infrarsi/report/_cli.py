"""``infrarsi report`` and ``infrarsi apply``: argument parsing and printing only."""

from __future__ import annotations

import argparse

_BANK_HELP = ("experience bank URL the run wrote to (default: the task's, $INFRARSI_BANK_URL, "
              "else $INFRARSI_HOME/bank.sqlite; the run's own RUN/bank.sqlite is tried too)")


def _run_dir(args: argparse.Namespace):
    from infrarsi.contract import resolve_run_dir

    return resolve_run_dir(args.run or args.run_dir)


def cmd_report(args: argparse.Namespace) -> int:
    from infrarsi.report import build_report

    result = build_report(_run_dir(args), out_dir=args.out, bank_url=args.bank_url)
    print(result.summary)
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from infrarsi.apply import apply_run

    r = apply_run(_run_dir(args), repo=args.repo, branch=args.branch, bank_url=args.bank_url,
                  config_path=args.config_path)
    print(r.message.splitlines()[0])
    print(f"branch {r.branch} at {r.commit[:12]} (from {r.base[:12]}) in {r.repo}")
    print(f"files: {', '.join(r.files)}")
    print(f"launch config: {r.config_path}")
    print(f"review: git -C {r.repo} show {r.branch}   (your current branch was not touched)")
    return 0


def add_report_subcommands(sub) -> None:
    s = sub.add_parser("report", help="write report.md and report.html for a run, print a summary")
    s.add_argument("run", nargs="?", help="run directory (same as --run-dir)")
    s.add_argument("--run-dir", help="run directory from `infrarsi init` (default: the last one)")
    s.add_argument("--out", help="where to write the report (default: RUN/report)")
    s.add_argument("--bank-url", help=_BANK_HELP)
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("apply", help="commit the promoted config and verified patches on a new "
                                     "git branch (your current branch is not touched)")
    s.add_argument("run", nargs="?", help="run directory (same as --run-dir)")
    s.add_argument("--run-dir", help="run directory from `infrarsi init` (default: the last one)")
    s.add_argument("--repo", help="the git repository to branch (default: the one holding the "
                                  "task's workspace)")
    s.add_argument("--branch", help="name of the new branch (default: infrarsi/RUN_ID)")
    s.add_argument("--config-path", help="repo-relative path of the launch config YAML "
                                         "(default: infrarsi/promoted/TASK.yaml)")
    s.add_argument("--bank-url", help=_BANK_HELP)
    s.set_defaults(func=cmd_apply)
