"""Parquet bundles: share experience between banks that cannot share a database.

A bundle is a directory::

    manifest.json      format, schema version, per-table file/rows/columns/sha256, checksum
    <table>.parquet    one per ledger table, columns exactly as in the schema (no local ids)

Export reads one consistent snapshot. Import verifies everything before writing (manifest
checksum, file checksums, column names and types, nulls, JSON, trial records, references),
then merges in one transaction: rows are matched on their natural key; a new row is inserted
as it was (origin and bank_id kept), an identical row is left alone, a conflicting one aborts
the whole import. Re-importing a bundle therefore changes nothing. Only Parquet and JSON are
read; nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from infrarsi.bank import _codec as C
from infrarsi.bank import _schema as S
from infrarsi.bank._engine import Store, insert_ignore
from infrarsi.errors import BankError
from infrarsi.trial import TrialRecord

FORMAT = "infrarsi-bank-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

# Columns that define a row's content: an existing row must agree on them (else conflict).
CONTENT: dict[str, tuple[str, ...]] = {
    "workloads": ("signature",),
    "hardware": ("fingerprint",),
    "runs": ("task_name", "contract_hash", "workload_key", "hardware_key"),
    "trials": ("run_id", "trial_id", "record"),
    "baselines": ("run_id", "payload"),
    "patches": ("run_id", "diff", "files", "evidence", "verified"),
    "findings": ("run_id", "prior", "measured"),
    "promotions": ("run_id", "config", "patches", "evidence"),
    "llm_exchanges": ("run_id", "prompt", "answer"),
    "searcher_state": (),  # mutable: the local copy wins
}
JSON_COLUMNS = {"signature", "fingerprint", "vector", "software", "meta", "config", "record",
                "knob_encoding", "payload", "files", "evidence", "setting", "prior", "measured",
                "patches"}  # and searcher_state.state


def _arrow_type(col: sa.Column) -> pa.DataType:
    if isinstance(col.type, sa.Boolean):
        return pa.bool_()
    if isinstance(col.type, (sa.Integer, sa.BigInteger)):
        return pa.int64()
    if isinstance(col.type, sa.Float):
        return pa.float64()
    return pa.string()


def arrow_schema(table: sa.Table) -> pa.Schema:
    return pa.schema([pa.field(c, _arrow_type(table.c[c]), nullable=table.c[c].nullable)
                      for c in S.exported_columns(table)])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest_checksum(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(C.dumps(body).encode()).hexdigest()


# ---- export -------------------------------------------------------------------------------
def export_bundle(store: Store, path: str | Path) -> dict[str, Any]:
    """Write every finished row of the bank to a new bundle directory; return the manifest."""
    out = Path(path)
    if out.exists() and any(out.iterdir()):
        raise BankError(f"bundle directory {out} exists and is not empty; choose a new path")
    out.mkdir(parents=True, exist_ok=True)

    def _do(conn: sa.Connection) -> dict[str, Any]:
        tables = {}
        for table in S.LEDGER_TABLES:
            tables[table.name] = _export_table(conn, table, out)
        return tables

    tables = store.tx(_do, write=False, snapshot=True)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "schema_version": S.SCHEMA_VERSION, "created_at": time.time(),
                "source_bank_id": store.bank_id, "tables": tables}
    manifest["checksum"] = _manifest_checksum(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _export_table(conn: sa.Connection, table: sa.Table, out: Path) -> dict[str, Any]:
    cols = S.exported_columns(table)
    q = sa.select(*[table.c[c] for c in cols])
    if table is S.trials:
        q = q.where(table.c.state == "finished")  # open trials belong to a live driver
    q = q.order_by(table.c.id if "id" in table.c else table.c[S.merge_key(table)])
    schema = arrow_schema(table)
    file = out / f"{table.name}.parquet"
    rows = 0
    with pq.ParquetWriter(file, schema, compression="zstd") as writer:
        result = conn.execution_options(stream_results=True, yield_per=20000).execute(q)
        for part in result.partitions():
            batch = {c: [r[i] for r in part] for i, c in enumerate(cols)}
            writer.write_table(pa.table(batch, schema=schema))
            rows += len(part)
        if rows == 0:
            writer.write_table(schema.empty_table())
    return {"file": file.name, "rows": rows, "columns": cols, "sha256": _sha256(file)}


# ---- import -------------------------------------------------------------------------------
def read_bundle(path: str | Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Verify a bundle completely and return (manifest, rows per table). Raises BankError."""
    root = Path(path)
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise BankError(f"{root} is not a bank bundle: {MANIFEST} is missing")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BankError(f"bundle {root}: {MANIFEST} is corrupt ({e}); re-export it") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BankError(f"bundle {root}: {MANIFEST} is not an InfraRSI bank bundle manifest")
    if manifest.get("checksum") != _manifest_checksum(manifest):
        raise BankError(f"bundle {root}: manifest checksum mismatch (edited or corrupt); re-export it")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BankError(f"bundle {root}: bundle format {manifest.get('format_version')} is not "
                        f"{FORMAT_VERSION}; import it with the InfraRSI version that wrote it")
    sv = manifest.get("schema_version")
    if sv != S.SCHEMA_VERSION:
        raise BankError(
            f"bundle {root} has bank schema version {sv}, this bank uses {S.SCHEMA_VERSION}; "
            + ("upgrade InfraRSI to import it" if isinstance(sv, int) and sv > S.SCHEMA_VERSION
               else "import it into a bank of that version, run `infrarsi bank upgrade` there, "
                    "and export again"))
    tables = manifest.get("tables")
    expected = {t.name for t in S.LEDGER_TABLES}
    if not isinstance(tables, dict) or set(tables) != expected:
        raise BankError(f"bundle {root}: manifest lists tables {sorted(tables or {})}, "
                        f"expected {sorted(expected)}")
    data = {t.name: _read_table(root, t, tables[t.name]) for t in S.LEDGER_TABLES}
    _validate_rows(root, data)
    return manifest, data


def _read_table(root: Path, table: sa.Table, entry: dict[str, Any]) -> list[dict[str, Any]]:
    file = root / str(entry.get("file", ""))
    where = f"bundle {root}, table {table.name}"
    if not file.is_file() or file.parent != root:
        raise BankError(f"{where}: file {entry.get('file')!r} is missing")
    if _sha256(file) != entry.get("sha256"):
        raise BankError(f"{where}: checksum mismatch ({file.name} is truncated or corrupt)")
    try:
        tab = pq.read_table(file)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise BankError(f"{where}: unreadable Parquet ({e})") from e
    want = arrow_schema(table)
    if tab.schema.names != want.names or [f.type for f in tab.schema] != [f.type for f in want]:
        raise BankError(f"{where}: columns {tab.schema.names} do not match the schema "
                        f"{want.names} (types {[str(f.type) for f in want]})")
    if tab.num_rows != entry.get("rows"):
        raise BankError(f"{where}: {tab.num_rows} rows, manifest says {entry.get('rows')}")
    for f in want:
        if not f.nullable and tab.column(f.name).null_count:
            raise BankError(f"{where}: column {f.name} has nulls; the schema forbids them")
    return tab.to_pylist()


def _validate_rows(root: Path, data: dict[str, list[dict[str, Any]]]) -> None:
    for name, rows in data.items():
        key = S.merge_key(S.metadata.tables[name])
        seen: set[str] = set()
        for i, row in enumerate(rows):
            where = f"bundle {root}, table {name}, row {i}"
            if row[key] in seen:
                raise BankError(f"{where}: duplicate {key} {row[key]!r}")
            seen.add(row[key])
            json_cols = JSON_COLUMNS | ({"state"} if name == "searcher_state" else set())
            for col in json_cols & row.keys():
                try:
                    C.loads(row[col])
                except (TypeError, ValueError) as e:
                    raise BankError(f"{where}: column {col} is not valid JSON ({e})") from e
            if name == "trials":
                _validate_trial(where, row)


def _validate_trial(where: str, row: dict[str, Any]) -> None:
    try:
        rec = TrialRecord.from_dict(C.loads(row["record"]))
    except Exception as e:  # noqa: BLE001 - any failure means a malformed record
        raise BankError(f"{where}: the trial record does not parse ({e})") from e
    if (rec.trial_id, rec.status.value, row["state"]) != (row["trial_id"], row["status"], "finished"):
        raise BankError(f"{where}: trial_id/status columns disagree with the record")
    if row["uid"] != f"{row['run_id']}/{row['trial_id']}":
        raise BankError(f"{where}: uid {row['uid']!r} is not run_id/trial_id")


def import_bundle(store: Store, path: str | Path) -> dict[str, dict[str, int]]:
    """Verify and merge a bundle in one transaction; per table: inserted/unchanged/updated."""
    _, data = read_bundle(path)

    def _do(conn: sa.Connection) -> dict[str, dict[str, int]]:
        summary = {}
        for table in S.LEDGER_TABLES:
            summary[table.name] = _merge_table(store, conn, table, data[table.name], path)
        return summary

    return store.tx(_do)


def _merge_table(store: Store, conn: sa.Connection, table: sa.Table,
                 rows: list[dict[str, Any]], path: str | Path) -> dict[str, int]:
    key = S.merge_key(table)
    content = CONTENT[table.name]
    counts = {"inserted": 0, "unchanged": 0, "updated": 0}
    existing: dict[Any, sa.Row] = {}
    keys = [r[key] for r in rows]
    cols = [table.c[c] for c in S.exported_columns(table)]
    for i in range(0, len(keys), 500):
        for r in conn.execute(sa.select(*cols).where(table.c[key].in_(keys[i:i + 500]))):
            existing[r._mapping[key]] = r
    fresh = [r for r in rows if r[key] not in existing]
    for r in rows:
        old = existing.get(r[key])
        if old is None:
            continue
        if table is S.trials and old.state == "open":  # a local open trial, finished there
            conn.execute(sa.update(table).where(table.c[key] == r[key]).values(**r))
            counts["updated"] += 1
        elif all(old._mapping[c] == r[c] for c in content):
            if table is S.runs and old.status == "running" and r["status"] != "running":
                conn.execute(sa.update(table).where(table.c[key] == r[key]).values(
                    status=r["status"], finished_at=r["finished_at"]))
                counts["updated"] += 1
            else:
                counts["unchanged"] += 1
        else:
            raise BankError(
                f"bundle {path}: {table.name} row {r[key]!r} conflicts with the row already in "
                f"this bank (columns {', '.join(content)} differ); nothing was imported")
    _check_references(conn, table, fresh, path)
    for i in range(0, len(fresh), 5000):
        conn.execute(insert_ignore(store.engine, table), fresh[i:i + 5000])
    counts["inserted"] = len(fresh)
    if table is S.trials:
        pairs = sorted({(r["workload_key"], r["hardware_key"]) for r in rows})
        if pairs:
            conn.execute(insert_ignore(store.engine, S.signature_pairs),
                         [{"workload_key": w, "hardware_key": h} for w, h in pairs])
    return counts


def _check_references(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]],
                      path: str | Path) -> None:
    refs = {("run_id", S.runs, "run_id"), ("workload_key", S.workloads, "key"),
            ("hardware_key", S.hardware, "key")}
    for col, parent, pcol in refs:
        if col not in table.c or table.c[col].primary_key:
            continue
        wanted = sorted({r[col] for r in rows})
        have: set[str] = set()
        for i in range(0, len(wanted), 500):
            have.update(conn.execute(sa.select(parent.c[pcol]).where(
                parent.c[pcol].in_(wanted[i:i + 500]))).scalars())
        missing = [w for w in wanted if w not in have]
        if missing:
            raise BankError(f"bundle {path}: {table.name} rows refer to {col} {missing[0]!r} that "
                            "is in neither the bundle nor this bank; nothing was imported")
