"""``infrarsi bank stats|query|export|import|upgrade``; wired in by ``infrarsi.cli``.

Each handler returns an exit code; a :class:`BankError` propagates to the main CLI, which
prints its message (it says what to do) and exits 2: for these commands a bank error is bad
input (the URL, the bundle, the schema version).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_bank_subcommands"]

_URL_HELP = ("bank URL: sqlite:///path/bank.sqlite or postgresql+psycopg://user@host/db "
             "(default: $INFRARSI_BANK_URL, else $INFRARSI_HOME/bank.sqlite)")


def add_bank_subcommands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``bank`` and its subcommands to the main parser's subparsers; returns ``bank``."""
    bank = subparsers.add_parser("bank", help="the experience bank: stats, query, export, "
                                 "import, upgrade")
    sub = bank.add_subparsers(dest="bank_command", required=True, metavar="BANK_COMMAND")

    s = sub.add_parser("stats", help="row counts per table, trials by status and origin")
    _common(s)
    s.set_defaults(func=cmd_stats)

    s = sub.add_parser("query", help="list runs, a run's trials, nearest experience, findings")
    _common(s)
    g = s.add_mutually_exclusive_group()
    g.add_argument("--run", metavar="RUN_ID", help="trials of this run (see --runs for ids)")
    g.add_argument("--near", metavar="RUN_ID",
                   help="trials nearest to this run's workload and hardware, best first")
    g.add_argument("--knob", help="findings (prior vs measured) for this knob")
    g.add_argument("--runs", action="store_true", help="list runs (the default)")
    s.add_argument("--status", choices=["ok", "oom", "error", "rejected"],
                   help="only trials with this status")
    s.add_argument("--limit", type=int, default=20, help="at most this many rows (default 20)")
    s.set_defaults(func=cmd_query)

    s = sub.add_parser("export", help="write a Parquet bundle (directory) to share with a "
                       "bank that cannot reach this database")
    s.add_argument("path", help="new bundle directory, e.g. bank-bundle-2026-06/")
    _common(s)
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("import", help="merge a bundle in one transaction (re-importing "
                       "changes nothing; rows keep their origin)")
    s.add_argument("path", help="bundle directory written by `infrarsi bank export`")
    _common(s)
    s.set_defaults(func=cmd_import)

    s = sub.add_parser("upgrade", help="create the bank or migrate it to this version's schema")
    _common(s)
    s.set_defaults(func=cmd_upgrade)
    return bank


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help=_URL_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _open(args: argparse.Namespace):
    from infrarsi.bank import ExperienceBank

    return ExperienceBank.open(args.url)


def _emit(args: argparse.Namespace, data: Any, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print("\n".join(lines))


def cmd_stats(args: argparse.Namespace) -> int:
    with _open(args) as bank:
        st = bank.stats()
    from infrarsi.bank._engine import redact

    st["url"] = redact(str(st["url"]))
    lines = [f"bank {st['url']} (schema v{st['schema_version']}, id {st['bank_id'][:12]})"]
    lines += [f"  {name:<15} {n:>9,}" for name, n in st["tables"].items()]
    lines.append("  trials by status: " + ", ".join(
        f"{k} {v:,}" for k, v in st["trials_by_status"].items() if k != "total"))
    lines.append("  trials by origin: " + (", ".join(
        f"{k} {v:,}" for k, v in st["trials_by_origin"].items()) or "none"))
    _emit(args, st, lines)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    with _open(args) as bank:
        if args.run:
            recs = bank.trials(args.run, status=args.status, limit=args.limit)
            _emit(args, [r.to_dict() for r in recs], [r.summary() for r in recs] or ["no trials"])
        elif args.near:
            run = bank.get_run(args.near)
            near = bank.nearest(run.workload, run.hardware, k=args.limit, status=args.status)
            _emit(args, [{"distance": n.distance, "run_id": n.run_id, "origin": n.origin,
                          "record": n.record.to_dict()} for n in near],
                  [f"d={n.distance:5.2f} {n.record.workload.name or '?'} on "
                   f"{n.record.hardware.device_name}: {n.record.summary()}" for n in near]
                  or ["no experience"])
        elif args.knob:
            found = bank.findings(args.knob)[: args.limit]
            _emit(args, [_finding_dict(f) for f in found],
                  [f"{f.knob}={f.setting!r} on {f.workload.name or '?'} / "
                   f"{f.hardware.device_name}: prior {f.prior} measured {f.measured}"
                   f"{'  [flagged]' if f.flagged else ''}" for f in found] or ["no findings"])
        else:
            runs = bank.list_runs()[-args.limit:]
            _emit(args, [r.to_dict() for r in runs],
                  [f"{r.run_id}  {r.task_name}  {r.hardware.device_name} x"
                   f"{r.hardware.num_devices}  {r.status}  {bank.count_trials(r.run_id)['total']}"
                   f" trials  origin {r.origin}" for r in runs] or ["no runs"])
    return 0


def _finding_dict(f) -> dict[str, Any]:
    return {"run_id": f.run_id, "knob": f.knob, "setting": f.setting, "prior": f.prior,
            "measured": f.measured, "flagged": f.flagged, "workload": f.workload.to_dict(),
            "hardware": f.hardware.to_dict(), "origin": f.origin}


def cmd_export(args: argparse.Namespace) -> int:
    with _open(args) as bank:
        manifest = bank.export(args.path)
    rows = {k: v["rows"] for k, v in manifest["tables"].items()}
    _emit(args, manifest, [f"exported to {args.path}: " + ", ".join(
        f"{k} {v:,}" for k, v in rows.items() if v)])
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from infrarsi.bank import _bundle

    # A refused import must leave no trace: the bundle is verified before the bank is opened
    # (opening creates a new SQLite file), and a bank file this command created is removed if
    # the merge fails after all.
    _bundle.read_bundle(args.path)
    new_file = _new_sqlite_file(args.url)
    try:
        with _open(args) as bank:
            summary = bank.import_bundle(args.path)
    except BaseException:
        if new_file is not None:
            new_file.unlink(missing_ok=True)
        raise
    lines = [f"imported {args.path}:"] + [
        f"  {k:<15} {v['inserted']:>7,} new  {v['unchanged']:>7,} already here"
        f"  {v['updated']:>5,} updated" for k, v in summary.items()]
    _emit(args, summary, lines)
    return 0


def _new_sqlite_file(url: str | None):
    """The SQLite file ``url`` names when it does not exist yet (None otherwise)."""
    from pathlib import Path

    import sqlalchemy as sa

    from infrarsi.bank._engine import default_url

    try:
        u = sa.engine.make_url(url or default_url())
    except Exception:  # noqa: BLE001 - opening the bank reports a bad URL
        return None
    if not u.drivername.startswith("sqlite") or not u.database:
        return None
    path = Path(u.database)
    return None if path.exists() else path


def cmd_upgrade(args: argparse.Namespace) -> int:
    from infrarsi.bank import ExperienceBank
    from infrarsi.bank._engine import default_url, redact

    old, new = ExperienceBank.upgrade(args.url)
    where = redact(args.url or default_url())
    msg = (f"created bank {where} at schema v{new}" if old is None else
           f"bank {where} is already at schema v{new}" if old == new else
           f"upgraded bank {where} from schema v{old} to v{new}")
    _emit(args, {"old": old, "new": new}, [msg])
    return 0
