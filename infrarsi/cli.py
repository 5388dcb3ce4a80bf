"""The ``infrarsi`` command line: one subcommand per stage, plus ``trial`` and ``bank``.

A thin layer over the Python API (:mod:`infrarsi.api`): each stage's command parses its
arguments, calls the stage's function and prints the typed result.

Exit codes (one policy, see :func:`exit_code` and the README's table): 0 success; 1 the stage
ran and failed (e.g. the trial did not come back ok); 2 a usage error or bad input, refused
before anything changed (the message says what to fix); 4 the contract is broken (a frozen
file changed). Tracebacks only with ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from infrarsi.errors import (
    ConfigError,
    ContractError,
    FrozenFileChangedError,
    InfraRSIError,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONTRACT = 0, 1, 2, 4


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"--set {item!r}: expected knob=value, e.g. --set micro_batch_size=4")
        key, _, raw = item.partition("=")
        out[key.strip()] = yaml.safe_load(raw)
    return out


# ---- subcommands ----------------------------------------------------------------------
def cmd_init(args: argparse.Namespace) -> int:
    if args.from_script:
        from infrarsi.scaffold import scaffold

        adapter, task = scaffold(args.from_script, force=args.force)
        print(f"wrote {adapter} and {task}: fill in their TODOs, then `infrarsi init {task}`")
        return EXIT_OK
    if not args.task:
        raise ConfigError("init needs a task spec YAML (or --from-script SCRIPT to write one)")
    from infrarsi.api import init

    result = init(args.task, run_dir=args.run_dir, local_mode=args.local_mode)
    contract, path = result.contract, result.contract_path
    print(f"baseline: {result.baseline.summary()}")
    print(f"frozen files: {len(contract.frozen_files)}; editable: {', '.join(contract.editable)}")
    print(f"work per step: {contract.work.tokens_per_step:,} tokens "
          f"({contract.work.global_batch_size} x {contract.work.seq_len}), "
          f"{contract.work.num_params:,} parameters")
    trace = ", ".join(f"{v:.4f}" for v in contract.loss_reference["trace"])
    print(f"loss reference ({contract.loss_reference['steps']} steps, seed "
          f"{contract.loss_reference['seed']}): {trace}")
    print(f"contract written to {path}")
    return EXIT_OK


def cmd_trial(args: argparse.Namespace) -> int:
    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.contract import Contract, load_task
    from infrarsi.rundir import CONTRACT_FILE

    spec = load_task(args.task)
    run_dir = Path(args.run_dir) if args.run_dir else spec.run_path()
    contract = Contract.load(run_dir) if (run_dir / CONTRACT_FILE).is_file() else None
    backend = RayTrainBackend(spec, contract=contract, local_mode=args.local_mode)
    overrides = _parse_set(args.set)
    backend = _with_patches(backend, run_dir, overrides)
    config = {**backend.baseline_config(), **overrides}
    record = backend.execute(config)
    if args.json:
        print(json.dumps(record.to_dict(), indent=2, default=str))
    else:
        print(record.summary())
        _print_record_details(record)
    return EXIT_OK if record.ok else EXIT_FAILED


def _with_patches(backend, run_dir: Path, overrides: dict[str, Any]):
    """``--set patch:<id>=true``: run in a copy with that patch of the run's verified ones."""
    from infrarsi.space import is_patch_knob, patch_id_of

    wanted = [patch_id_of(k) for k in overrides if is_patch_knob(k)]
    if not wanted:
        return backend
    from infrarsi.rundir import PATCHES_FILE
    from infrarsi.search._patch_stage import load_setup
    from infrarsi.search._patched import PatchedBackend

    setup = load_setup(run_dir)
    known = [p.id for p in setup.verified] if setup else []
    missing = [w for w in wanted if w not in known]
    if missing:
        raise ConfigError(f"patch(es) {', '.join(missing)} are not among the verified patches of "
                          f"{run_dir / PATCHES_FILE} ({', '.join(known) or 'none'}); pass the "
                          "--run-dir of the run that verified them")
    return PatchedBackend.ray_train(backend, setup.verified, conflicts=setup.conflicts)


def _print_record_details(record) -> None:
    cfg = ", ".join(f"{k}={v}" for k, v in record.config.items())
    print(f"  config: {cfg}")
    if record.step_times_s:
        steps = ", ".join(f"{t * 1e3:.1f}" for t in record.step_times_s)
        print(f"  step times (ms): {steps}")
    if record.peak_memory_bytes:
        peaks = ", ".join(f"{b / 2**20:,.1f}" for b in record.peak_memory_bytes)
        print(f"  peak memory per rank (MiB): {peaks} of {record.memory_capacity_bytes / 2**20:,.0f}"
              if record.memory_capacity_bytes else f"  peak memory per rank (MiB): {peaks}")
    if record.loss_trace:
        print(f"  loss trace: {', '.join(f'{v:.4f}' for v in record.loss_trace)}")
    if record.startup_seconds is not None:
        print(f"  submit to first measured step: {record.startup_seconds:.1f} s")
    if record.error_message:
        print(f"  {record.error_message}")


def cmd_run(args: argparse.Namespace) -> int:
    from infrarsi.api import run

    outcome = run(args.run_dir, budget=args.budget, resume=args.resume,
                  verify_top=args.verify_top, pairs=args.pairs,
                  max_concurrent=args.max_concurrent, local_mode=args.local_mode,
                  bank_url=args.bank_url, cold=args.cold, patches=not args.no_patches,
                  fresh_processes=args.fresh_processes)
    # a search in which no trial ran ok found nothing: say so to scripts and `ray job submit`
    # (a finished run resumed again ran nothing, and that is not a failure)
    return EXIT_OK if outcome.best is not None or outcome.already_finished else EXIT_FAILED


# ---- parser ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="infrarsi",
        description="Make a PyTorch training job faster without changing what it computes.",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("init", help="lock the task contract (runs the baseline once)")
    s.add_argument("task", nargs="?",
                   help="task spec YAML, or a built-in task: cpu_dense, cpu_moe, gpu_dense, gpu_moe")
    s.add_argument("--run-dir", help="where contract.json goes (default: the spec's run_dir, else "
                   "$INFRARSI_HOME/runs/NAME)")
    s.add_argument("--from-script", metavar="SCRIPT",
                   help="write a starting adapter and task YAML beside a plain PyTorch script")
    s.add_argument("--force", action="store_true", help="with --from-script: overwrite them")
    s.add_argument("--local-mode", action="store_true",
                   help="run the baseline in this process (one rank, no Ray workers; for quick checks "
                        "of a 1-worker baseline)")
    s.set_defaults(func=cmd_init)

    s = sub.add_parser("trial", help="run one trial of one knob setting and print its record")
    s.add_argument("task", help="task spec YAML or built-in task name (as for init)")
    s.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                   help="override a knob of the baseline, e.g. --set micro_batch_size=4 (repeatable)")
    s.add_argument("--run-dir", help="run directory whose contract checks the trial (default: the spec's)")
    s.add_argument("--json", action="store_true", help="print the full record as JSON")
    s.add_argument("--local-mode", action="store_true",
                   help="run in this process with ScalingConfig(num_workers=0)")
    s.set_defaults(func=cmd_trial)

    from infrarsi.stats import DEFAULT_PAIRS

    s = sub.add_parser("run", help="search knobs with real trials, then verify and promote")
    s.add_argument("--budget", type=int, required=True,
                   help="search trials to spend (verification comes on top); 12 is a good start on CPU")
    s.add_argument("--run-dir", help="run directory from `infrarsi init` (default: the last one)")
    s.add_argument("--resume", action="store_true",
                   help="continue a run whose driver died, from the bank and the searcher state")
    s.add_argument("--verify-top", type=int, default=2,
                   help="how many of the best configs to re-measure against the baseline")
    s.add_argument("--pairs", type=int, default=DEFAULT_PAIRS,
                   help="interleaved baseline/candidate pairs per verification (more: tighter CI "
                        "and a lower noise floor); up to twice as many while the verdict is open")
    s.add_argument("--max-concurrent", type=int, default=1,
                   help="trials at once (each is a Ray Train job of its own size)")
    s.add_argument("--bank-url", help="experience bank URL (default: task spec, $INFRARSI_BANK_URL, "
                   "else $INFRARSI_HOME/bank.sqlite)")
    s.add_argument("--cold", action="store_true", help="ignore experience from the bank")
    s.add_argument("--no-patches", action="store_true",
                   help="search launch knobs only: no source patches proposed, verified or tried")
    s.add_argument("--fresh-processes", action="store_true",
                   help="start new worker processes for every trial (a TorchTrainer job each) "
                        "instead of reusing warm worker groups across trials")
    s.add_argument("--local-mode", action="store_true",
                   help="run trials in this process (one rank: 1-worker configs only, no Ray Train "
                        "workers; for quick checks)")
    s.set_defaults(func=cmd_run)

    from infrarsi.doctor._cli import add_doctor_subcommand

    add_doctor_subcommand(sub)

    from infrarsi.report._cli import add_report_subcommand

    add_report_subcommand(sub)

    from infrarsi.apply._cli import add_apply_subcommand

    add_apply_subcommand(sub)

    try:
        from infrarsi.bank._cli import add_bank_subcommands
    except ImportError:  # the bank is optional at this layer; its absence is not a CLI error
        pass
    else:
        add_bank_subcommands(sub)
    return p


def exit_code(e: BaseException, command: str) -> int:
    """The one exit-code policy of every command (README, "Exit codes").

    4: the contract is broken (a frozen file changed). 2: bad input, the command refused to
    run and changed nothing: a usage or config error, a missing contract or run folder, a
    refused ``apply``, a run folder another driver holds, and for ``infrarsi bank ...`` any
    bank error (the URL, the bundle, the schema version). 1: the stage ran and failed (e.g. a
    bank write failed mid-run, no trial came back ok)."""
    from infrarsi.apply._git import ApplyRefusedError
    from infrarsi.errors import BankError
    from infrarsi.rundir import RunLockedError

    if isinstance(e, FrozenFileChangedError):
        return EXIT_CONTRACT
    if isinstance(e, ValueError | argparse.ArgumentTypeError | ContractError
                  | ApplyRefusedError | RunLockedError):
        return EXIT_USAGE
    if isinstance(e, BankError) and command == "bank":
        return EXIT_USAGE
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or EXIT_OK)
    except (InfraRSIError, argparse.ArgumentTypeError) as e:
        if args.debug:
            raise
        print(f"infrarsi {args.command}: {e}", file=sys.stderr)
        sub = parser._subparsers._group_actions[0].choices.get(args.command)  # noqa: SLF001
        if (sub is not None and isinstance(e, ValueError | argparse.ArgumentTypeError)
                and not isinstance(e, ContractError)):
            print(file=sys.stderr)
            sub.print_help(sys.stderr)
        return exit_code(e, args.command)


if __name__ == "__main__":
    sys.exit(main())
