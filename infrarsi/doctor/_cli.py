"""``infrarsi doctor``: the subcommand (registered by infrarsi.cli)."""

from __future__ import annotations

import argparse

from infrarsi.stats import DEFAULT_MDE, DEFAULT_PAIRS


def cmd_doctor(args: argparse.Namespace) -> int:
    from infrarsi.doctor.stage import run_doctor

    result = run_doctor(args.run_dir, repeats=args.repeats, pairs=args.pairs,
                        target_mde=args.target_mde, bank_url=args.bank_url,
                        local_mode=args.local_mode)
    return 0 if result.payload else 1


def add_doctor_subcommand(sub) -> None:
    s = sub.add_parser("doctor", help="profile the baseline and measure the noise floor")
    s.add_argument("--run-dir", help="run directory from `infrarsi init` (default: the last one)")
    s.add_argument("--repeats", type=int, default=3,
                   help="separate baseline trials (between-run noise needs at least 2; 3 is a "
                        "good start, more tightens the noise estimate)")
    s.add_argument("--pairs", type=int, default=DEFAULT_PAIRS,
                   help="interleaved verification pairs the reported minimum detectable effect "
                        "is for (`infrarsi run --pairs N` recomputes it for its own N)")
    s.add_argument("--target-mde", type=float, default=DEFAULT_MDE,
                   help="the smallest speedup you want to detect (a fraction); doctor warns and "
                        "says how long trials must be when the noise floor is above it")
    s.add_argument("--bank-url", help="experience bank URL (default: task spec, $INFRARSI_BANK_URL, "
                   "else experience_db/bank.sqlite)")
    s.add_argument("--local-mode", action="store_true",
                   help="run trials in-process (no Ray Train workers; for quick checks)")
    s.set_defaults(func=cmd_doctor)
