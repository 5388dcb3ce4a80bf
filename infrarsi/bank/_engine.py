"""Connections, transactions, retries and the schema version: the bank's storage contract.

* Every operation runs in one transaction, committed whole or rolled back whole.
* SQLite: WAL journal, a 60 s busy timeout, and ``BEGIN IMMEDIATE`` for writes, so several
  processes can write one file without "database is locked" failures on lock upgrade.
* PostgreSQL: pre-pinged pooled connections; concurrent writers are safe because every write
  is an ``INSERT ... ON CONFLICT DO NOTHING`` on a natural key, followed by a comparison.
* Transient errors (lost connection, server restart, lock contention) are retried with
  back-off for ``retry_s`` seconds. A retried write is idempotent (natural keys), so a commit
  whose acknowledgement was lost is neither lost nor duplicated.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite

from infrarsi._home import default_bank_path
from infrarsi.bank import _schema as S
from infrarsi.errors import BankError

log = logging.getLogger(__name__)
T = TypeVar("T")

ENV_URL = "INFRARSI_BANK_URL"
UPGRADE_HINT = "infrarsi bank upgrade"


def default_url() -> str:
    """``$INFRARSI_BANK_URL``, else the SQLite file ``<home>/bank.sqlite`` (see infrarsi._home;
    its folder is created when the bank is opened)."""
    env = os.environ.get(ENV_URL, "").strip()
    if env:
        return env
    return f"sqlite:///{default_bank_path()}"


def redact(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only used in messages
        return "<unparsable url>"


def make_engine(url: str) -> sa.Engine:
    try:
        u = sa.engine.make_url(url)
    except Exception as e:  # noqa: BLE001
        raise BankError(
            f"bank URL {url!r} is not a database URL; use sqlite:///path/bank.sqlite or "
            "postgresql+psycopg://user@host/db (flag --url or $INFRARSI_BANK_URL)"
        ) from e
    backend = u.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(u)
    if backend == "postgresql":
        if u.drivername == "postgresql":
            u = u.set(drivername="postgresql+psycopg")
        return sa.create_engine(u, pool_pre_ping=True, pool_size=2, max_overflow=4)
    raise BankError(f"bank URL scheme {u.drivername!r} is not supported; use sqlite or postgresql")


def _sqlite_engine(u: sa.URL) -> sa.Engine:
    db = u.database or ""
    if db in ("", ":memory:"):
        raise BankError("an in-memory SQLite bank would vanish; give a file: sqlite:///path.sqlite")
    Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(u, connect_args={"timeout": 60.0, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        write = conn.get_execution_options().get("bank_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def insert_ignore(engine: sa.Engine, table: sa.Table):
    """``INSERT ... ON CONFLICT DO NOTHING`` in the engine's dialect."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    return dialect.insert(table).on_conflict_do_nothing()


def insert_new(conn: sa.Connection, table: sa.Table, row: dict, key: str = "uid") -> bool:
    """Insert ``row`` unless its key exists; True if this call inserted it.

    Uses RETURNING rather than rowcount: psycopg reports rowcount -1 for these inserts.
    """
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).on_conflict_do_nothing().returning(table.c[key])
    return conn.execute(stmt, row).first() is not None


def _transient(exc: BaseException, dialect: str) -> bool:
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if dialect == "sqlite":
        msg = str(exc).lower()
        return isinstance(exc, sa.exc.OperationalError) and ("locked" in msg or "busy" in msg)
    return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))


class Store:
    """An engine plus the transaction/retry discipline every bank operation goes through."""

    def __init__(self, url: str, retry_s: float = 60.0) -> None:
        self.url = url
        self.retry_s = retry_s
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self.bank_id = ""

    def tx(self, fn: Callable[[sa.Connection], T], *, write: bool = True,
           snapshot: bool = False) -> T:
        """Run ``fn(conn)`` in one transaction; retry transient failures; wrap DB errors.

        ``snapshot``: every statement sees the same snapshot (PostgreSQL REPEATABLE READ;
        SQLite WAL read transactions always do), for consistent multi-table exports."""
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                with self.engine.connect() as conn:
                    if write:
                        conn.execution_options(bank_write=True)
                    if snapshot and self.dialect == "postgresql":
                        conn.execution_options(isolation_level="REPEATABLE READ")
                    with conn.begin():
                        return fn(conn)
            except sa.exc.DBAPIError as e:
                if _transient(e, self.dialect) and time.monotonic() < deadline:
                    log.warning("bank: transient database error, retrying: %s", str(e).split("\n")[0])
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                hint = ("; is the server up and the URL right? (--url or $INFRARSI_BANK_URL)"
                        if _transient(e, self.dialect) else "")
                raise BankError(
                    f"bank {redact(self.url)}: database error: {str(e).splitlines()[0]}{hint}"
                ) from e

    # ---- schema -------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create a new bank, accept a current one, refuse an older or newer one."""
        retry_s, self.retry_s = self.retry_s, min(self.retry_s, 15.0)  # fail fast when opening
        try:
            version, bank_id = self.tx(self._read_version, write=False)
        finally:
            self.retry_s = retry_s
        if version is None:
            version, bank_id = self.tx(self._create)
        self._check(version)
        self.bank_id = bank_id

    def upgrade(self) -> tuple[int | None, int]:
        """Bring the bank to :data:`SCHEMA_VERSION` (creating it if empty); (old, new)."""
        old, _ = self.tx(self._read_version, write=False)
        if old is not None and old > S.SCHEMA_VERSION:
            self._check(old)

        def _do(conn: sa.Connection) -> tuple[int | None, int]:
            self._lock(conn)
            version, _ = self._read_version(conn)
            if version is None:
                self._create(conn)
                return None, S.SCHEMA_VERSION
            for v in range(version, S.SCHEMA_VERSION):
                MIGRATIONS[v](conn)
                log.info("bank: migrated schema %d -> %d", v, v + 1)
            conn.execute(
                sa.update(S.bank_meta)
                .where(S.bank_meta.c.key == "schema_version")
                .values(value=str(S.SCHEMA_VERSION))
            )
            return version, S.SCHEMA_VERSION

        result = self.tx(_do)
        self.ensure_schema()
        return result

    def _check(self, version: int) -> None:
        where = redact(self.url)
        if version > S.SCHEMA_VERSION:
            raise BankError(
                f"bank {where} has schema version {version}, newer than the {S.SCHEMA_VERSION} "
                "this InfraRSI understands; upgrade InfraRSI (pip install -U infrarsi), then run "
                f"`{UPGRADE_HINT}` if it asks. Refusing to touch it."
            )
        if version < S.SCHEMA_VERSION:
            raise BankError(
                f"bank {where} has schema version {version}, older than {S.SCHEMA_VERSION}; "
                f"run `{UPGRADE_HINT} --url {where}` (back it up first if it is shared)"
            )

    def _read_version(self, conn: sa.Connection) -> tuple[int | None, str]:
        if not sa.inspect(conn).has_table("bank_meta"):
            return None, ""
        rows = dict(conn.execute(sa.select(S.bank_meta.c.key, S.bank_meta.c.value)).all())
        if "schema_version" not in rows:
            return None, ""
        try:
            return int(rows["schema_version"]), rows.get("bank_id", "")
        except ValueError as e:
            raise BankError(f"bank {redact(self.url)} has a corrupt schema_version row") from e

    def _lock(self, conn: sa.Connection) -> None:
        if self.dialect == "postgresql":  # serialize concurrent creators/upgraders
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(727274)"))

    def _create(self, conn: sa.Connection) -> tuple[int, str]:
        self._lock(conn)
        version, bank_id = self._read_version(conn)
        if version is not None:  # another process created it while we waited
            return version, bank_id
        S.metadata.create_all(conn, checkfirst=True)
        bank_id = uuid.uuid4().hex
        conn.execute(
            sa.insert(S.bank_meta),
            [
                {"key": "schema_version", "value": str(S.SCHEMA_VERSION)},
                {"key": "bank_id", "value": bank_id},
                {"key": "created_at", "value": repr(time.time())},
            ],
        )
        return S.SCHEMA_VERSION, bank_id

    def dispose(self) -> None:
        self.engine.dispose()


# Migration v -> v+1, each run inside the upgrade transaction. Version 1 is the first schema.
MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {}
