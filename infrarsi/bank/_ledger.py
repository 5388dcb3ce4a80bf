"""Baselines, patches, findings, promotions, LLM exchanges and searcher state.

All rows but searcher state are append-only and keyed by a natural ``uid`` (a content hash
unless the caller's id is natural), so a retried write is a no-op and a conflicting rewrite of
an immutable row raises :class:`BankError`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from infrarsi.bank import _codec as C
from infrarsi.bank import _schema as S
from infrarsi.bank._bank import BankCore
from infrarsi.bank._engine import insert_new
from infrarsi.bank._types import BaselineEntry, Finding, PatchEntry, Promotion
from infrarsi.errors import BankError
from infrarsi.trial import HardwareFingerprint, WorkloadSignature


class LedgerMixin(BankCore):
    def _append(self, table: sa.Table, row: dict[str, Any], compare: Iterable[str]) -> bool:
        """Insert ``row`` unless its uid exists; an existing row must agree on ``compare``."""
        row = {"origin": "local", "created_at": time.time(), "bank_id": self.bank_id} | row

        def _do(conn: sa.Connection) -> bool:
            run = self._require_run(conn, row["run_id"])
            for k in ("workload_key", "hardware_key"):
                if k in table.c and k not in row:
                    row[k] = run._mapping[k]
            if insert_new(conn, table, row):
                return True
            cols = [table.c[c] for c in compare]
            old = conn.execute(sa.select(*cols).where(table.c.uid == row["uid"])).one()
            if tuple(old) != tuple(row[c] for c in compare):
                raise BankError(
                    f"{table.name} row {row['uid']} already exists with different content; "
                    "these rows are immutable: record it under a new id"
                )
            return False

        return self._store.tx(_do)

    # ---- baselines ----------------------------------------------------------------------
    def record_baseline(self, run_id: str, payload: dict[str, Any], origin: str = "doctor") -> None:
        """Store doctor's baseline record and noise model (JSON-able dict) for this run."""
        text = C.dumps(payload)
        self._append(S.baselines, {"uid": f"{run_id}/{C.digest(text)}", "run_id": run_id,
                                   "payload": text, "origin": origin}, ["payload"])

    def latest_baseline(
        self, workload: WorkloadSignature, hardware: HardwareFingerprint
    ) -> BaselineEntry | None:
        b = S.baselines
        q = (sa.select(b).where(b.c.workload_key == C.workload_key(workload),
                                b.c.hardware_key == C.hardware_key(hardware))
             .order_by(b.c.created_at.desc(), b.c.id.desc()).limit(1))
        row = self._store.tx(lambda c: c.execute(q).first(), write=False)
        if row is None:
            return None
        return BaselineEntry(row.run_id, C.loads(row.payload), row.created_at, row.origin)

    # ---- patches ------------------------------------------------------------------------
    def record_patch(
        self, run_id: str, patch_id: str, diff: str, files: Iterable[str],
        evidence: dict[str, Any], verified: bool, origin: str = "search",
    ) -> None:
        lineage = self.get_run(run_id).lineage
        row = {"uid": f"{run_id}/{patch_id}", "run_id": run_id, "patch_id": patch_id,
               "lineage": lineage, "diff": diff, "files": C.dumps(sorted(files)),
               "evidence": C.dumps(evidence), "verified": bool(verified), "origin": origin}
        self._append(S.patches, row, ["diff", "files", "evidence", "verified"])

    def patches(
        self, workload_lineage: str | None = None, *, run_id: str | None = None,
        verified: bool | None = None,
    ) -> list[PatchEntry]:
        """Patches recorded for a source lineage (runs' ``meta["workload_lineage"]``, default
        the task name), optionally of one run, optionally only verified ones."""
        p = S.patches
        q = sa.select(p).order_by(p.c.id)
        if workload_lineage is not None:
            q = q.where(p.c.lineage == workload_lineage)
        if run_id is not None:
            q = q.where(p.c.run_id == run_id)
        if verified is not None:
            q = q.where(p.c.verified == verified)
        return self._store.tx(lambda c: [
            PatchEntry(r.run_id, r.patch_id, r.lineage, r.diff, tuple(C.loads(r.files)),
                       C.loads(r.evidence), bool(r.verified), r.created_at, r.origin)
            for r in c.execute(q)
        ], write=False)

    # ---- findings -----------------------------------------------------------------------
    def record_finding(
        self, run_id: str, knob: str, setting: Any, prior: dict[str, Any],
        measured: dict[str, Any], flagged: bool, origin: str = "search",
    ) -> None:
        """Prior vs measured effect of ``knob=setting`` on this run's workload and hardware."""
        body = [knob, setting, prior, measured, bool(flagged)]
        row = {"uid": f"{run_id}/{C.digest(*body)}", "run_id": run_id, "knob": knob,
               "setting": C.dumps(setting), "prior": C.dumps(prior),
               "measured": C.dumps(measured), "flagged": bool(flagged), "origin": origin}
        self._append(S.findings, row, ["prior", "measured"])

    def findings(
        self, knob: str | None = None, *, workload: WorkloadSignature | None = None,
        hardware: HardwareFingerprint | None = None, flagged: bool | None = None,
        run_id: str | None = None,
    ) -> list[Finding]:
        f = S.findings
        q = (sa.select(f, S.workloads.c.signature, S.hardware.c.fingerprint)
             .join(S.workloads, S.workloads.c.key == f.c.workload_key)
             .join(S.hardware, S.hardware.c.key == f.c.hardware_key).order_by(f.c.id))
        if knob is not None:
            q = q.where(f.c.knob == knob)
        if workload is not None:
            q = q.where(f.c.workload_key == C.workload_key(workload))
        if hardware is not None:
            q = q.where(f.c.hardware_key == C.hardware_key(hardware))
        if flagged is not None:
            q = q.where(f.c.flagged == flagged)
        if run_id is not None:
            q = q.where(f.c.run_id == run_id)
        return self._store.tx(lambda c: [
            Finding(r.run_id, r.knob, C.loads(r.setting),
                    WorkloadSignature.from_dict(C.loads(r.signature)),
                    HardwareFingerprint.from_dict(C.loads(r.fingerprint)),
                    C.loads(r.prior), C.loads(r.measured), bool(r.flagged), r.created_at,
                    r.origin)
            for r in c.execute(q)
        ], write=False)

    # ---- promotion ----------------------------------------------------------------------
    def record_promotion(
        self, run_id: str, config: dict[str, Any], patches: Iterable[str],
        evidence: dict[str, Any], origin: str = "verifier",
    ) -> None:
        """The run's final promoted candidate (one per run, immutable)."""
        row = {"uid": run_id, "run_id": run_id, "config": C.dumps(config),
               "patches": C.dumps(list(patches)), "evidence": C.dumps(evidence), "origin": origin}
        self._append(S.promotions, row, ["config", "patches", "evidence"])

    def promotion(self, run_id: str) -> Promotion | None:
        p = S.promotions
        row = self._store.tx(lambda c: c.execute(sa.select(p).where(p.c.uid == run_id)).first(),
                             write=False)
        if row is None:
            return None
        return Promotion(row.run_id, C.loads(row.config), tuple(C.loads(row.patches)),
                         C.loads(row.evidence), row.created_at, row.origin)

    # ---- LLM audit ----------------------------------------------------------------------
    def record_llm_exchange(
        self, run_id: str, prompt: str, answer: str, meta: dict[str, Any] | None = None,
        origin: str = "proposer:llm",
    ) -> None:
        """Audit log of one prompt and answer (``meta``: model, temperature, request id...)."""
        meta = meta or {}
        row = {"uid": f"{run_id}/{C.digest(prompt, answer, meta)}", "run_id": run_id,
               "prompt": prompt, "answer": answer, "meta": C.dumps(meta), "origin": origin}
        self._append(S.llm_exchanges, row, ["prompt", "answer"])

    def llm_exchanges(self, run_id: str) -> list[dict[str, Any]]:
        x = S.llm_exchanges
        q = sa.select(x).where(x.c.run_id == run_id).order_by(x.c.id)
        return self._store.tx(lambda c: [
            {"prompt": r.prompt, "answer": r.answer, "meta": C.loads(r.meta),
             "created_at": r.created_at, "origin": r.origin} for r in c.execute(q)
        ], write=False)

    # ---- searcher state -----------------------------------------------------------------
    def save_state(self, run_id: str, key: str, state: dict[str, Any]) -> None:
        """Replace the searcher's plain-dict state under ``key`` (JSON; atomic)."""
        s = S.searcher_state
        text = C.dumps(state)
        uid = f"{run_id}/{key}"

        def _do(conn: sa.Connection) -> None:
            self._require_run(conn, run_id)
            if not insert_new(conn, s, {
                    "uid": uid, "run_id": run_id, "key": key, "state": text,
                    "updated_at": time.time(), "origin": "local", "bank_id": self.bank_id}):
                conn.execute(sa.update(s).where(s.c.uid == uid).values(
                    state=text, updated_at=time.time()))

        self._store.tx(_do)

    def load_state(self, run_id: str, key: str) -> dict[str, Any] | None:
        s = S.searcher_state
        text = self._store.tx(
            lambda c: c.execute(sa.select(s.c.state).where(s.c.uid == f"{run_id}/{key}")).scalar(),
            write=False)
        return C.loads(text)
