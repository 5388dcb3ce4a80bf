"""Export -> import round trips exactly; bad bundles are refused with nothing half-imported."""

from __future__ import annotations

import json

import bank_conformance as bc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from bank_conformance import CPU, GPT, H100, ok_trial, oom_trial, start

from infrarsi.bank import ExperienceBank
from infrarsi.bank import _bundle as B
from infrarsi.bank import _schema as S
from infrarsi.errors import BankError

bank_url, bank = bc.bank_url, bc.bank  # the shared suite's fixtures (SQLite + PostgreSQL)


def _fill(bank) -> str:
    rid = start(bank)
    bank.record_trials(rid, [ok_trial(str(i), 1 + i % 4, 0.1 + i / 100) for i in range(20)])
    bank.record_trial(rid, oom_trial("oom", 64), origin="search", knob_encoding={"x": [1.0, 0.0]})
    bank.open_trial(rid, "still-open", {"micro_batch_size": 2})
    bank.record_baseline(rid, {"step_time_s": 0.5})
    bank.record_patch(rid, "p", "diff", ["a.py"], {"ok": True}, True)
    bank.record_finding(rid, "micro_batch_size", 4, {"t": 0.9}, {"t": 0.8}, False)
    bank.record_promotion(rid, {"micro_batch_size": 4}, ["p"], {"speedup": 1.2})
    bank.record_llm_exchange(rid, "q", "a", {"model": "m"})
    bank.save_state(rid, "searcher", {"n": 3})
    bank.finish_run(rid)
    return rid


def _table_rows(bank) -> dict[str, list[tuple]]:
    out = {}
    with bank._store.engine.connect() as c:
        for t in S.LEDGER_TABLES:
            cols = [t.c[n] for n in S.exported_columns(t)]
            q = sa.select(*cols)
            if t is S.trials:
                q = q.where(t.c.state == "finished")
            out[t.name] = sorted(tuple(r) for r in c.execute(q))
    return out


@pytest.fixture
def exported(tmp_path):
    src = ExperienceBank.open(f"sqlite:///{tmp_path / 'src.sqlite'}")
    rid = _fill(src)
    manifest = src.export(tmp_path / "bundle")
    yield src, rid, tmp_path / "bundle", manifest
    src.close()


def test_export_import_round_trips_exactly(exported, bank, tmp_path):
    src, rid, path, manifest = exported
    assert manifest["tables"]["trials"]["rows"] == 21  # the open trial stays home
    first = bank.import_bundle(path)
    assert first["trials"]["inserted"] == 21 and first["runs"]["inserted"] == 1
    assert _table_rows(bank) == _table_rows(src)
    assert [r.to_dict() for r in bank.trials(rid)] == [r.to_dict() for r in src.trials(rid)]
    assert bank.trial_origins(rid)["oom"] == "search"
    assert bank.get_run(rid).bank_id == src.bank_id != bank.bank_id  # rows keep their origin
    before = _table_rows(bank)
    again = bank.import_bundle(path)
    assert all(v["inserted"] == 0 and v["updated"] == 0 for v in again.values())
    assert _table_rows(bank) == before
    bank.export(tmp_path / "bundle2")
    _, data1 = B.read_bundle(path)
    _, data2 = B.read_bundle(tmp_path / "bundle2")
    assert data1 == data2


def _rewrite_manifest(path, **changes) -> None:
    m = json.loads((path / B.MANIFEST).read_text())
    m.update(changes)
    m["checksum"] = B._manifest_checksum(m)
    (path / B.MANIFEST).write_text(json.dumps(m))


def _corrupt_truncate(path):
    f = path / "trials.parquet"
    f.write_bytes(f.read_bytes()[:-100])


def _corrupt_bad_checksum(path):
    m = json.loads((path / B.MANIFEST).read_text())
    m["tables"]["trials"]["sha256"] = "0" * 64
    (path / B.MANIFEST).write_text(json.dumps(m))


def _corrupt_garbage_manifest(path):
    (path / B.MANIFEST).write_text("{not json")


def _corrupt_other_schema(path):
    _rewrite_manifest(path, schema_version=S.SCHEMA_VERSION + 1)


def _corrupt_schema_violation(path):
    f = path / "trials.parquet"
    tab = pq.read_table(f)
    idx = tab.schema.get_field_index("record")
    col = pa.array(["{\"broken\": true}"] * tab.num_rows, pa.string())
    pq.write_table(tab.set_column(idx, "record", col), f)
    m = json.loads((path / B.MANIFEST).read_text())
    m["tables"]["trials"]["sha256"] = B._sha256(f)
    _rewrite_manifest(path, tables=m["tables"])


def _corrupt_missing_run(path):
    f = path / "runs.parquet"
    tab = pq.read_table(f)
    pq.write_table(tab.slice(0, 0), f)
    m = json.loads((path / B.MANIFEST).read_text())
    m["tables"]["runs"].update(sha256=B._sha256(f), rows=0)
    _rewrite_manifest(path, tables=m["tables"])


@pytest.mark.parametrize("corrupt, message", [
    (_corrupt_truncate, "checksum mismatch"),
    (_corrupt_bad_checksum, "manifest checksum mismatch"),
    (_corrupt_garbage_manifest, "corrupt"),
    (_corrupt_other_schema, "schema version"),
    (_corrupt_schema_violation, "does not parse"),
    (_corrupt_missing_run, "neither the bundle nor this bank"),
])
def test_bad_bundles_refused_nothing_imported(exported, bank, corrupt, message):
    _, _, path, _ = exported
    corrupt(path)
    before = _table_rows(bank)
    with pytest.raises(BankError, match=message):
        bank.import_bundle(path)
    assert _table_rows(bank) == before


def test_conflicting_row_aborts_whole_import(exported, bank):
    src, rid, path, _ = exported
    bank.start_run("gpt2-cpu", "c0ffee", GPT, CPU, src.get_run(rid).software, {}, run_id=rid)
    bank.record_trial(rid, ok_trial("5", 9, 9.9))  # same id, different outcome
    before = _table_rows(bank)
    with pytest.raises(BankError, match="conflicts"):
        bank.import_bundle(path)
    assert _table_rows(bank) == before


def test_import_finishes_local_open_trial_and_running_run(tmp_path):
    a = ExperienceBank.open(f"sqlite:///{tmp_path / 'a.sqlite'}")
    rid = start(a, hardware=H100)
    a.open_trial(rid, "t", {"micro_batch_size": 1})
    b = ExperienceBank.open(f"sqlite:///{tmp_path / 'b.sqlite'}")
    a.export(tmp_path / "b1")
    b.import_bundle(tmp_path / "b1")
    assert b.get_run(rid).status == "running"
    a.record_trial(rid, ok_trial("t", 1, 0.1, hardware=H100))
    a.finish_run(rid)
    a.export(tmp_path / "b2")
    summary = b.import_bundle(tmp_path / "b2")
    assert summary["runs"]["updated"] == 1 and summary["trials"]["inserted"] == 1
    assert b.get_run(rid).status == "finished"
    a.close()
    b.close()


def test_export_refuses_non_empty_directory(exported):
    src, _, path, _ = exported
    with pytest.raises(BankError, match="not empty"):
        src.export(path)
