"""Queries for transfer: nearest experience by signature distance, same workload elsewhere.

Distances use the vectors stored with each workload/hardware row (weights in ``_codec``), so
a query touches the small signature tables plus an index range of the trial table; it never
parses trial JSON beyond the ``k`` rows it returns.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import sqlalchemy as sa

from infrarsi.bank import _codec as C
from infrarsi.bank import _schema as S
from infrarsi.bank._bank import FINISHED, BankCore
from infrarsi.bank._types import Neighbour, SignatureMatch
from infrarsi.trial import HardwareFingerprint, TrialRecord, TrialStatus, WorkloadSignature


class QueryMixin(BankCore):
    def _signature_rows(self, conn: sa.Connection, wkeys: set[str], hkeys: set[str]):
        """Workload/hardware rows by key, cached: they are content-addressed and never change."""
        cache = self.__dict__.setdefault("_sig_cache", {"w": {}, "h": {}})
        for kind, table, keys, col in (("w", S.workloads, wkeys, "signature"),
                                       ("h", S.hardware, hkeys, "fingerprint")):
            missing = sorted(keys - cache[kind].keys())
            for i in range(0, len(missing), 500):
                for r in conn.execute(sa.select(table.c.key, table.c.vector, table.c[col])
                                      .where(table.c.key.in_(missing[i:i + 500]))):
                    name = r[2] if kind == "w" else C.loads(r[2])["device_name"]
                    cache[kind][r.key] = (C.loads(r.vector), r[2], name)
        return cache["w"], cache["h"]

    def nearest_signatures(
        self, workload: WorkloadSignature, hardware: HardwareFingerprint | None = None,
        k: int = 5,
    ) -> list[SignatureMatch]:
        """The ``k`` (workload, hardware) pairs with finished trials nearest to the query.

        Distance: Euclidean over the weighted workload vector, plus the weighted hardware
        vector and a device-name mismatch term when ``hardware`` is given.
        """
        return self._store.tx(lambda c: self._nearest_pairs(c, workload, hardware, k),
                              write=False)

    def _ranked_pairs(self, conn, workload, hardware) -> list[tuple[float, str, str]]:
        """Every (workload, hardware) pair with finished trials, nearest first."""
        sp = S.signature_pairs
        pairs = conn.execute(sa.select(sp.c.workload_key, sp.c.hardware_key)).all()
        if not pairs:
            return []
        wl, hw = self._signature_rows(conn, {p[0] for p in pairs}, {p[1] for p in pairs})
        qw = np.array(C.weighted(workload.vector(), C.WORKLOAD_WEIGHTS))
        d2 = ((np.array([wl[p[0]][0] for p in pairs]) - qw) ** 2).sum(axis=1)
        if hardware is not None:
            qh = np.array(C.weighted(hardware.vector(), C.HARDWARE_WEIGHTS))
            d2 = d2 + ((np.array([hw[p[1]][0] for p in pairs]) - qh) ** 2).sum(axis=1)
            names = np.array([hw[p[1]][2] != hardware.device_name for p in pairs])
            d2 = d2 + names * C.DEVICE_NAME_MISMATCH**2
        dist = np.sqrt(d2)
        return [(float(dist[i]), *pairs[i]) for i in np.argsort(dist, kind="stable")]

    def _nearest_pairs(self, conn, workload, hardware, k) -> list[SignatureMatch]:
        t = S.trials
        ranked = self._ranked_pairs(conn, workload, hardware)[:k]
        cache = self.__dict__.get("_sig_cache", {"w": {}, "h": {}})
        wl, hw = cache["w"], cache["h"]
        out = []
        for dist, wk, hk in ranked:
            n = conn.execute(sa.select(sa.func.count()).select_from(t).where(
                t.c.workload_key == wk, t.c.hardware_key == hk, t.c.state == FINISHED)).scalar_one()
            out.append(SignatureMatch(
                dist, WorkloadSignature.from_dict(C.loads(wl[wk][1])),
                HardwareFingerprint.from_dict(C.loads(hw[hk][1])), int(n)))
        return out

    def nearest(
        self, workload: WorkloadSignature, hardware: HardwareFingerprint | None = None,
        k: int = 20, *, status: TrialStatus | str | Iterable[TrialStatus | str] | None = None,
    ) -> list[Neighbour]:
        """The ``k`` most relevant finished trials: nearest signatures first; within one
        signature, ok trials fastest first, then OOMs (memory boundary), then the rest."""
        t = S.trials
        order = [
            sa.case((t.c.status == "ok", 0), (t.c.status == "oom", 1), else_=2),
            sa.nulls_last(t.c.tokens_per_s.desc()), sa.nulls_last(t.c.step_time_s.asc()), t.c.id,
        ]
        wanted = None
        if status is not None:
            wanted = [status] if isinstance(status, (str, TrialStatus)) else list(status)
            wanted = [TrialStatus(s).value for s in wanted]

        def _do(conn: sa.Connection) -> list[Neighbour]:
            out: list[Neighbour] = []
            for dist, wk, hk in self._ranked_pairs(conn, workload, hardware):
                q = (sa.select(t.c.record, t.c.run_id, t.c.origin)
                     .where(t.c.state == FINISHED, t.c.workload_key == wk,
                            t.c.hardware_key == hk)
                     .order_by(*order).limit(k - len(out)))
                if wanted is not None:
                    q = q.where(t.c.status.in_(wanted))
                out.extend(Neighbour(dist, TrialRecord.from_dict(C.loads(r.record)),
                                     r.run_id, r.origin) for r in conn.execute(q))
                if len(out) >= k:
                    break
            return out

        return self._store.tx(_do, write=False)

    def same_workload_other_hardware(
        self, workload: WorkloadSignature, hardware: HardwareFingerprint | None = None,
    ) -> list[tuple[HardwareFingerprint, list[TrialRecord]]]:
        """Finished trials of this workload's shape (its name ignored) on each hardware other
        than ``hardware`` (all hardware when None), most trials first."""
        shape = _shape(workload.to_dict())
        wl = self._store.tx(
            lambda c: c.execute(sa.select(S.workloads.c.key, S.workloads.c.signature)).all(),
            write=False)
        keys = [k for k, sig in wl if _shape(C.loads(sig)) == shape]
        if not keys:
            return []
        t = S.trials
        skip = C.hardware_key(hardware) if hardware is not None else None
        q = (sa.select(t.c.hardware_key, S.hardware.c.fingerprint, t.c.record)
             .join(S.hardware, S.hardware.c.key == t.c.hardware_key)
             .where(t.c.state == FINISHED, t.c.workload_key.in_(keys)).order_by(t.c.id))
        if skip is not None:
            q = q.where(t.c.hardware_key != skip)
        groups: dict[str, tuple[HardwareFingerprint, list[TrialRecord]]] = {}
        for hk, fp, rec in self._store.tx(lambda c: c.execute(q).all(), write=False):
            if hk not in groups:
                groups[hk] = (HardwareFingerprint.from_dict(C.loads(fp)), [])
            groups[hk][1].append(TrialRecord.from_dict(C.loads(rec)))
        return sorted(groups.values(), key=lambda g: -len(g[1]))

    def stats(self) -> dict[str, object]:
        """Row counts per table, trials per status and origin, schema version, bank id."""
        def _do(conn: sa.Connection) -> dict[str, object]:
            tables = {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                      for t in S.LEDGER_TABLES}
            by_origin = dict(conn.execute(
                sa.select(S.trials.c.origin, sa.func.count()).group_by(S.trials.c.origin)).all())
            return {"tables": tables, "trials_by_origin": by_origin}

        out = self._store.tx(_do, write=False)
        return {"url": self.url, "bank_id": self.bank_id, "schema_version": S.SCHEMA_VERSION,
                **out, "trials_by_status": self.count_trials()}


def _shape(sig: dict) -> dict:
    return {k: v for k, v in sig.items() if k != "name"}
