"""ExperienceBank: runs and trials (the ledger a report and a resumed run read).

Contract (the conformance suite in tests/bank_conformance.py checks each point on SQLite and
PostgreSQL):

* Trials are append-only and keyed by ``(run_id, trial_id)``. ``open_trial`` writes an *open*
  row (a heartbeat); ``record_trial`` finishes it, or inserts the finished row directly. A
  finished row is immutable: recording the same record again is a no-op (a retry after a lost
  connection), recording a different one raises :class:`BankError`.
* ``close_stale_trials`` closes open trials whose driver stopped heartbeating as
  ``ERROR/INTERRUPTED`` with the device-seconds they had consumed.
* ``trials()`` returns exactly the records given (``TrialRecord.to_dict`` round-trips).
* Each call is one transaction; errors roll it back; transient errors are retried.
"""

from __future__ import annotations

import getpass
import re
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from infrarsi.bank import _codec as C
from infrarsi.bank import _schema as S
from infrarsi.bank._engine import Store, default_url, insert_ignore, insert_new
from infrarsi.bank._types import RunInfo
from infrarsi.errors import BankError
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    SoftwareVersions,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

OPEN = "open"
FINISHED = "finished"


class BankCore:
    """Opening, runs, trials and heartbeats. See the module docstring for the contract."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._known_keys: set[str] = set()

    @classmethod
    def open(cls, url: str | None = None, *, retry_s: float = 60.0, seed: bool = True):
        """Open (creating if needed) the bank at ``url``.

        ``None`` means ``$INFRARSI_BANK_URL``, else ``sqlite:///<home>/bank.sqlite`` (home:
        ``$INFRARSI_HOME``, else the user data directory; see :mod:`infrarsi._home`). A new bank
        gets the current schema; a bank of another schema version is refused with the command
        that fixes it. A bank opened with ``url=None`` imports the seed experience shipped in
        the package (infrarsi/bank/seed/) the first time it is opened.
        """
        resolved = url or default_url()
        store = Store(resolved, retry_s=retry_s)
        try:
            store.ensure_schema()
        except BaseException:
            store.dispose()
            raise
        bank = cls(store)
        if seed and url is None:
            from infrarsi.bank._seed import ensure_seed

            ensure_seed(bank, announce=True)
        return bank

    def close(self) -> None:
        self._store.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self._store.url

    @property
    def bank_id(self) -> str:
        return self._store.bank_id

    # ---- signatures ---------------------------------------------------------------------
    def _ensure_signatures(
        self, conn: sa.Connection, workload: WorkloadSignature, hardware: HardwareFingerprint
    ) -> tuple[str, str]:
        wrow, hrow = C.workload_row(workload), C.hardware_row(hardware)
        if wrow["key"] not in self._known_keys:
            conn.execute(insert_ignore(self._store.engine, S.workloads), [wrow])
        if hrow["key"] not in self._known_keys:
            conn.execute(insert_ignore(self._store.engine, S.hardware), [hrow])
        return wrow["key"], hrow["key"]

    def _remember(self, *keys: str) -> None:
        self._known_keys.update(keys)  # only after the transaction that wrote them committed

    # ---- runs ---------------------------------------------------------------------------
    def start_run(
        self,
        task_name: str,
        contract_hash: str,
        workload: WorkloadSignature,
        hardware: HardwareFingerprint,
        software: SoftwareVersions,
        meta: dict[str, Any] | None = None,
        *,
        run_id: str | None = None,
        origin: str = "local",
    ) -> str:
        """Register a run and return its id (globally unique). Passing an existing ``run_id``
        of the same task and contract resumes it (idempotent); ``meta["workload_lineage"]``
        (default: the task name) groups runs whose patches apply to the same source tree."""
        meta = dict(meta or {})
        rid = run_id or _new_run_id(task_name)
        row = {
            "run_id": rid,
            "task_name": task_name,
            "lineage": str(meta.get("workload_lineage") or task_name),
            "contract_hash": contract_hash,
            "software": C.dumps(software.to_dict()),
            "meta": C.dumps(meta),
            "status": "running",
            "started_at": time.time(),
            "finished_at": None,
            "host": socket.gethostname(),
            "username": _user(),
            "origin": origin,
            "bank_id": self.bank_id,
        }

        def _do(conn: sa.Connection) -> tuple[str, str]:
            wk, hk = self._ensure_signatures(conn, workload, hardware)
            row.update(workload_key=wk, hardware_key=hk)
            conn.execute(insert_ignore(self._store.engine, S.runs), [row])
            got = conn.execute(
                sa.select(S.runs.c.task_name, S.runs.c.contract_hash).where(S.runs.c.run_id == rid)
            ).one()
            if (got.task_name, got.contract_hash) != (task_name, contract_hash):
                raise BankError(
                    f"run {rid!r} already exists for task {got.task_name!r} with contract "
                    f"{got.contract_hash[:12]}; start a new run (omit run_id) instead"
                )
            return wk, hk

        self._remember(*self._store.tx(_do))
        return rid

    def finish_run(self, run_id: str, status: str = "finished") -> None:
        def _do(conn: sa.Connection) -> None:
            self._require_run(conn, run_id)
            conn.execute(
                sa.update(S.runs)
                .where(S.runs.c.run_id == run_id, S.runs.c.status == "running")
                .values(status=status, finished_at=time.time())
            )

        self._store.tx(_do)

    def get_run(self, run_id: str) -> RunInfo:
        def _do(conn: sa.Connection) -> RunInfo:
            row = conn.execute(_run_select().where(S.runs.c.run_id == run_id)).first()
            if row is None:
                raise BankError(f"no run {run_id!r} in bank {self._store.url}; see `infrarsi bank stats`")
            return _run_info(row)

        return self._store.tx(_do, write=False)

    def list_runs(
        self,
        task_name: str | None = None,
        workload: WorkloadSignature | None = None,
        hardware: HardwareFingerprint | None = None,
        status: str | None = None,
    ) -> list[RunInfo]:
        q = _run_select()
        if task_name is not None:
            q = q.where(S.runs.c.task_name == task_name)
        if workload is not None:
            q = q.where(S.runs.c.workload_key == C.workload_key(workload))
        if hardware is not None:
            q = q.where(S.runs.c.hardware_key == C.hardware_key(hardware))
        if status is not None:
            q = q.where(S.runs.c.status == status)
        q = q.order_by(S.runs.c.started_at, S.runs.c.run_id)
        return self._store.tx(lambda c: [_run_info(r) for r in c.execute(q)], write=False)

    def _require_run(self, conn: sa.Connection, run_id: str) -> sa.Row:
        row = conn.execute(
            sa.select(S.runs.c.workload_key, S.runs.c.hardware_key, S.hardware.c.fingerprint,
                      S.workloads.c.signature)
            .join(S.hardware, S.hardware.c.key == S.runs.c.hardware_key)
            .join(S.workloads, S.workloads.c.key == S.runs.c.workload_key)
            .where(S.runs.c.run_id == run_id)
        ).first()
        if row is None:
            raise BankError(f"no run {run_id!r} in this bank; call start_run() first")
        return row

    # ---- trials -------------------------------------------------------------------------
    def open_trial(
        self, run_id: str, trial_id: str, config: dict[str, Any], origin: str = "search",
        *, backend: str = "",
    ) -> None:
        """Write the open (heartbeat) row of a trial about to run. Idempotent."""
        now = time.time()

        def _do(conn: sa.Connection) -> None:
            run = self._require_run(conn, run_id)
            conn.execute(insert_ignore(self._store.engine, S.trials), [{
                "uid": _uid(run_id, trial_id), "run_id": run_id, "trial_id": trial_id,
                "workload_key": run.workload_key, "hardware_key": run.hardware_key,
                "state": OPEN, "backend": backend or None, "config": C.dumps(config),
                "config_key": C.dumps(config), "opened_at": now, "heartbeat_at": now,
                "origin": origin, "bank_id": self.bank_id,
            }])

        self._store.tx(_do)

    def heartbeat(self, run_id: str, trial_id: str) -> None:
        """Tell the bank the driver of this open trial is alive."""
        self._store.tx(lambda conn: conn.execute(
            sa.update(S.trials)
            .where(S.trials.c.uid == _uid(run_id, trial_id), S.trials.c.state == OPEN)
            .values(heartbeat_at=time.time())
        ))

    def record_trial(
        self, run_id: str, record: TrialRecord, origin: str = "search",
        knob_encoding: dict[str, Any] | None = None,
    ) -> str:
        """Record a finished trial; returns "inserted", "finished" (was open) or "unchanged"."""
        row = self._trial_row(run_id, record, origin, knob_encoding)

        def _do(conn: sa.Connection) -> tuple[str, tuple[str, str]]:
            self._require_run(conn, run_id)
            keys = self._ensure_signatures(conn, record.workload, record.hardware)
            return self._write_trial(conn, row), keys

        outcome, keys = self._store.tx(_do)
        self._remember(*keys)
        return outcome

    def record_trials(
        self, run_id: str, records: Sequence[TrialRecord], origin: str = "search"
    ) -> dict[str, int]:
        """Record many finished trials in one transaction (bulk seeding, benchmarks)."""
        rows = [self._trial_row(run_id, r, origin, None) for r in records]

        def _do(conn: sa.Connection) -> dict[str, int]:
            self._require_run(conn, run_id)
            sigs = {(C.workload_key(r.workload), C.hardware_key(r.hardware)): r for r in records}
            for r in sigs.values():
                self._ensure_signatures(conn, r.workload, r.hardware)
            have = _existing_uids(conn, S.trials, [r["uid"] for r in rows])
            fresh = [r for r in rows if r["uid"] not in have]
            if fresh:
                conn.execute(insert_ignore(self._store.engine, S.trials), fresh)
                self._note_pairs(conn, fresh)
            counts = {"inserted": len(fresh), "finished": 0, "unchanged": 0}
            for r in rows:
                if r["uid"] in have:
                    counts[self._write_trial(conn, r)] += 1
            return counts

        return self._store.tx(_do)

    def _trial_row(self, run_id: str, rec: TrialRecord, origin: str,
                   knob_encoding: dict[str, Any] | None) -> dict[str, Any]:
        now = time.time()
        return {
            "uid": _uid(run_id, rec.trial_id), "run_id": run_id, "trial_id": rec.trial_id,
            "workload_key": C.workload_key(rec.workload),
            "hardware_key": C.hardware_key(rec.hardware),
            "state": FINISHED, "status": rec.status.value,
            "error_kind": rec.error_kind.value if rec.error_kind else None,
            "backend": rec.backend, "config": C.dumps(rec.config),
            "config_key": C.dumps(rec.config),
            "knob_encoding": None if knob_encoding is None else C.dumps(knob_encoding),
            "step_time_s": rec.step_time_s, "tokens_per_s": rec.tokens_per_s,
            "peak_memory_bytes": rec.peak_memory_max_bytes,
            "memory_censor_bytes": rec.memory_censor_bytes,
            "memory_capacity_bytes": rec.memory_capacity_bytes,
            "final_loss": C.final_loss(rec.loss_trace), "device_seconds": rec.device_seconds,
            "record": C.record_json(rec), "opened_at": now, "heartbeat_at": now,
            "finished_at": now, "origin": origin, "bank_id": self.bank_id,
        }

    def _note_pairs(self, conn: sa.Connection, rows: Iterable[dict[str, Any]]) -> None:
        pairs = {(r["workload_key"], r["hardware_key"]) for r in rows}
        if pairs:
            conn.execute(insert_ignore(self._store.engine, S.signature_pairs),
                         [{"workload_key": w, "hardware_key": h} for w, h in sorted(pairs)])

    def _write_trial(self, conn: sa.Connection, row: dict[str, Any]) -> str:
        t = S.trials
        self._note_pairs(conn, [row])
        if insert_new(conn, t, row):
            return "inserted"
        finish = {k: v for k, v in row.items() if k not in ("uid", "opened_at", "origin", "bank_id")}
        res = conn.execute(sa.update(t).where(t.c.uid == row["uid"], t.c.state == OPEN).values(**finish))
        if res.rowcount == 1:
            return "finished"
        old = conn.execute(sa.select(t.c.record).where(t.c.uid == row["uid"])).scalar_one()
        if old == row["record"]:
            return "unchanged"
        raise BankError(
            f"trial {row['uid']} is already recorded with a different outcome; finished trials "
            "are immutable: record a re-measurement under a new trial_id"
        )

    def close_stale_trials(self, run_id: str | None, older_than_s: float) -> list[str]:
        """Close open trials not heartbeating for ``older_than_s`` as ERROR/INTERRUPTED, with
        the device-seconds consumed up to their last heartbeat. Returns their trial ids."""
        cutoff = time.time() - older_than_s
        t = S.trials

        def _do(conn: sa.Connection) -> list[str]:
            q = sa.select(t).where(t.c.state == OPEN, t.c.heartbeat_at < cutoff)
            if run_id is not None:
                q = q.where(t.c.run_id == run_id)
            closed = []
            for row in conn.execute(q).all():
                rec = self._interrupted_record(conn, row)
                values = self._trial_row(row.run_id, rec, row.origin, None)
                values = {k: v for k, v in values.items() if k not in ("uid", "opened_at", "origin", "bank_id")}
                values["finished_at"] = time.time()
                res = conn.execute(sa.update(t).where(
                    t.c.uid == row.uid, t.c.state == OPEN, t.c.heartbeat_at < cutoff
                ).values(**values))
                if res.rowcount == 1:
                    closed.append(row.trial_id)
                    self._note_pairs(conn, [values])
            return closed

        return self._store.tx(_do)

    def _interrupted_record(self, conn: sa.Connection, row: sa.Row) -> TrialRecord:
        run = self._require_run(conn, row.run_id)
        hw = HardwareFingerprint.from_dict(C.loads(run.fingerprint))
        alive = max(row.heartbeat_at - row.opened_at, 0.0)
        return TrialRecord(
            trial_id=row.trial_id, config=C.loads(row.config), status=TrialStatus.ERROR,
            backend=row.backend or "unknown",
            workload=WorkloadSignature.from_dict(C.loads(run.signature)), hardware=hw,
            error_kind=ErrorKind.INTERRUPTED,
            error_message=(f"the driver stopped heartbeating {alive:.1f}s after the trial "
                           "opened; closed as interrupted on the next start"),
            device_seconds=alive * hw.num_devices, wall_seconds=alive,
        )

    def open_trials(self, run_id: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """(run_id, trial_id, config) of trials opened and not yet finished."""
        q = sa.select(S.trials.c.run_id, S.trials.c.trial_id, S.trials.c.config).where(
            S.trials.c.state == OPEN)
        if run_id is not None:
            q = q.where(S.trials.c.run_id == run_id)
        return self._store.tx(
            lambda c: [(r[0], r[1], C.loads(r[2])) for r in c.execute(q.order_by(S.trials.c.id))],
            write=False,
        )

    def trials(
        self,
        run_id: str | None = None,
        workload: WorkloadSignature | None = None,
        hardware: HardwareFingerprint | None = None,
        status: TrialStatus | str | Iterable[TrialStatus | str] | None = None,
        *,
        origin: str | None = None,
        limit: int | None = None,
    ) -> list[TrialRecord]:
        """Finished trials matching every filter given, in the order they were recorded."""
        q = self._trial_query(run_id, workload, hardware, status, origin)
        q = q.with_only_columns(S.trials.c.record).order_by(S.trials.c.id)
        if limit is not None:
            q = q.limit(limit)
        return self._store.tx(
            lambda c: [TrialRecord.from_dict(C.loads(r[0])) for r in c.execute(q)], write=False
        )

    def trial_origins(self, run_id: str) -> dict[str, str]:
        q = sa.select(S.trials.c.trial_id, S.trials.c.origin).where(S.trials.c.run_id == run_id)
        return self._store.tx(lambda c: dict(c.execute(q).all()), write=False)

    def count_trials(
        self, run_id: str | None = None, workload: WorkloadSignature | None = None,
        hardware: HardwareFingerprint | None = None,
    ) -> dict[str, int]:
        """Trial counts by status ("ok", "oom", "error", "rejected", "open") and "total"."""
        t = S.trials
        q = sa.select(t.c.status, sa.func.count()).group_by(t.c.status)
        if run_id is not None:
            q = q.where(t.c.run_id == run_id)
        if workload is not None:
            q = q.where(t.c.workload_key == C.workload_key(workload))
        if hardware is not None:
            q = q.where(t.c.hardware_key == C.hardware_key(hardware))
        counts = {s.value: 0 for s in TrialStatus} | {OPEN: 0}
        for status, n in self._store.tx(lambda c: c.execute(q).all(), write=False):
            counts[status or OPEN] += n
        counts["total"] = sum(counts.values())
        return counts

    def _trial_query(self, run_id, workload, hardware, status, origin) -> sa.Select:
        t = S.trials
        q = sa.select(t.c.id).where(t.c.state == FINISHED)
        if run_id is not None:
            q = q.where(t.c.run_id == run_id)
        if workload is not None:
            q = q.where(t.c.workload_key == C.workload_key(workload))
        if hardware is not None:
            q = q.where(t.c.hardware_key == C.hardware_key(hardware))
        if status is not None:
            wanted = [status] if isinstance(status, (str, TrialStatus)) else list(status)
            q = q.where(t.c.status.in_([TrialStatus(s).value for s in wanted]))
        if origin is not None:
            q = q.where(t.c.origin == origin)
        return q


def _uid(run_id: str, item_id: str) -> str:
    return f"{run_id}/{item_id}"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return "unknown"


def _new_run_id(task_name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", task_name).strip("-")[:60] or "run"
    return f"{slug}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def _existing_uids(conn: sa.Connection, table: sa.Table, uids: list[str], col: str = "uid") -> set[str]:
    c = table.c[col]
    have: set[str] = set()
    for i in range(0, len(uids), 500):
        have.update(conn.execute(sa.select(c).where(c.in_(uids[i:i + 500]))).scalars())
    return have


def _run_select() -> sa.Select:
    return sa.select(S.runs, S.workloads.c.signature, S.hardware.c.fingerprint).join(
        S.workloads, S.workloads.c.key == S.runs.c.workload_key
    ).join(S.hardware, S.hardware.c.key == S.runs.c.hardware_key)


def _run_info(r: sa.Row) -> RunInfo:
    return RunInfo(
        run_id=r.run_id, task_name=r.task_name, lineage=r.lineage, contract_hash=r.contract_hash,
        workload=WorkloadSignature.from_dict(C.loads(r.signature)),
        hardware=HardwareFingerprint.from_dict(C.loads(r.fingerprint)),
        software=SoftwareVersions(**C.loads(r.software)), meta=C.loads(r.meta), status=r.status,
        started_at=r.started_at, finished_at=r.finished_at, host=r.host, user=r.username,
        origin=r.origin, bank_id=r.bank_id,
    )


def default_bank_url() -> str:
    return default_url()
