"""``infrarsi apply``: argument parsing and printing only (the stage is ``apply_run``)."""

from __future__ import annotations

import argparse

from infrarsi.report._cli import BANK_HELP, add_run_dir_arguments


def cmd_apply(args: argparse.Namespace) -> int:
    from infrarsi.apply.stage import apply_run

    r = apply_run(args.run or args.run_dir, repo=args.repo, branch=args.branch,
                  bank_url=args.bank_url, config_path=args.config_path)
    print(r.message.splitlines()[0])
    print(f"branch {r.branch} at {r.commit[:12]} (from {r.base[:12]}) in {r.repo}")
    print(f"files: {', '.join(r.files)}")
    print(f"launch config: {r.config_path}")
    print(f"review: git -C {r.repo} show {r.branch}   (your current branch was not touched)")
    return 0


def add_apply_subcommand(sub) -> None:
    s = sub.add_parser("apply", help="commit the promoted config and verified patches on a new "
                                     "git branch (your current branch is not touched)")
    add_run_dir_arguments(s)
    s.add_argument("--repo", help="the git repository to branch (default: the one holding the "
                                  "task's workspace)")
    s.add_argument("--branch", help="name of the new branch (default: infrarsi/RUN_ID)")
    s.add_argument("--config-path", help="repo-relative path of the launch config YAML "
                                         "(default: infrarsi/promoted/TASK.yaml)")
    s.add_argument("--bank-url", help=BANK_HELP)
    s.set_defaults(func=cmd_apply)
