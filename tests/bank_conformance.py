"""The experience bank's storage conformance suite: one set of tests, every backend.

``bank_url`` is parametrized over SQLite (always) and PostgreSQL (when
``INFRARSI_TEST_POSTGRES_URL`` is set, e.g. by ``scripts/with_postgres.sh``; each test gets
its own PostgreSQL schema). Test modules import the fixtures and tests from here
(``from bank_conformance import *``), like Optuna's ``pytest_storages``.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from infrarsi.bank import ExperienceBank
from infrarsi.errors import BankError
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    SoftwareVersions,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

PG_ENV = "INFRARSI_TEST_POSTGRES_URL"
BACKENDS = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
]

GPT = WorkloadSignature("dense", 124_000_000, 12, 768, 12, 1024, 32, vocab_size=50304, name="gpt2")
GPT_BIG = WorkloadSignature("dense", 350_000_000, 24, 1024, 16, 1024, 32, name="gpt2-medium")
MOE = WorkloadSignature("moe", 1_000_000_000, 16, 2048, 16, 4096, 256, 8, 2, name="moe-1b")
CPU = HardwareFingerprint("cpu", 8 << 30, 2, 1, "loopback", 2e11)
A100 = HardwareFingerprint("A100-80GB", 80 << 30, 8, 1, "nvlink", 312e12)
H100 = HardwareFingerprint("H100-80GB", 80 << 30, 8, 1, "nvlink", 989e12)
SOFTWARE = SoftwareVersions(torch="2.13.0", cuda="", ray="2.60.0", python="3.11.7")


def make_url(backend: str, tmp_path) -> tuple[str, object]:
    """A fresh, empty bank URL and a cleanup callable."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / f'bank-{uuid.uuid4().hex[:6]}.sqlite'}", lambda: None
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL cases need {PG_ENV}; run under scripts/with_postgres.sh")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(base, pool_pre_ping=True)
    with engine.begin() as c:
        c.execute(sa.text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in base else "?"
    url = f"{base}{sep}options={quote(f'-csearch_path={schema}')}"

    def cleanup() -> None:
        with engine.begin() as c:
            c.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()

    return url, cleanup


@pytest.fixture(params=BACKENDS)
def bank_url(request, tmp_path):
    url, cleanup = make_url(request.param, tmp_path)
    yield url
    cleanup()


@pytest.fixture
def bank(bank_url):
    b = ExperienceBank.open(bank_url, retry_s=10)
    yield b
    b.close()


def ok_trial(tid: str, mbs: int, step_s: float, *, workload=GPT, hardware=CPU, peak=1 << 30,
             **kw) -> TrialRecord:
    return TrialRecord(
        trial_id=tid, config={"micro_batch_size": mbs, "activation_checkpointing": "none"},
        status=TrialStatus.OK, backend="table", workload=workload, hardware=hardware,
        step_times_s=(step_s * 1.01, step_s, step_s * 0.99), peak_memory_bytes=(peak, peak - 7),
        memory_capacity_bytes=hardware.memory_bytes, loss_trace=(10.5, 9.25, 8.125),
        phase_times_s={"forward": step_s / 3, "backward": step_s / 2},
        tokens_per_step=workload.tokens_per_step, device_seconds=12.5, wall_seconds=6.25, **kw,
    )


def oom_trial(tid: str, mbs: int, *, workload=GPT, hardware=CPU) -> TrialRecord:
    return TrialRecord(
        trial_id=tid, config={"micro_batch_size": mbs, "activation_checkpointing": "none"},
        status=TrialStatus.OOM, backend="table", workload=workload, hardware=hardware,
        memory_capacity_bytes=hardware.memory_bytes, memory_censor_bytes=hardware.memory_bytes,
        device_seconds=3.0, error_message="CUDA out of memory",
    )


def start(bank, workload=GPT, hardware=CPU, task="gpt2-cpu", **kw) -> str:
    return bank.start_run(task, "c0ffee", workload, hardware, SOFTWARE, {"who": "test"}, **kw)


def _dicts(records):
    return [r.to_dict() for r in records]


# ---- schema and runs ----------------------------------------------------------------------
def test_open_creates_and_reopens_same_bank(bank_url):
    a = ExperienceBank.open(bank_url)
    bank_id = a.bank_id
    a.close()
    b = ExperienceBank.open(bank_url)
    assert b.bank_id == bank_id and len(bank_id) == 32
    b.close()


def test_newer_schema_is_refused_with_upgrade_command(bank_url):
    ExperienceBank.open(bank_url).close()
    engine = sa.create_engine(bank_url)
    with engine.begin() as c:
        c.execute(sa.text("UPDATE bank_meta SET value='99' WHERE key='schema_version'"))
    engine.dispose()
    with pytest.raises(BankError, match="infrarsi bank upgrade"):
        ExperienceBank.open(bank_url)
    with pytest.raises(BankError, match="newer"):
        ExperienceBank.upgrade(bank_url)


def test_older_schema_refused_then_upgraded(bank_url, monkeypatch):
    from infrarsi.bank import _engine

    ExperienceBank.open(bank_url).close()
    engine = sa.create_engine(bank_url)
    with engine.begin() as c:
        c.execute(sa.text("UPDATE bank_meta SET value='0' WHERE key='schema_version'"))
    engine.dispose()
    with pytest.raises(BankError, match="older.*infrarsi bank upgrade"):
        ExperienceBank.open(bank_url)
    ran = []
    monkeypatch.setitem(_engine.MIGRATIONS, 0, lambda conn: ran.append(conn))
    assert ExperienceBank.upgrade(bank_url) == (0, 1)
    assert len(ran) == 1
    ExperienceBank.open(bank_url).close()
    assert ExperienceBank.upgrade(bank_url) == (1, 1)


def test_runs_start_get_list_finish_resume(bank):
    rid = start(bank)
    info = bank.get_run(rid)
    assert (info.task_name, info.workload, info.hardware, info.status) == ("gpt2-cpu", GPT, CPU, "running")
    assert info.software == SOFTWARE and info.meta == {"who": "test"} and info.lineage == "gpt2-cpu"
    assert start(bank, run_id=rid) == rid  # resuming is idempotent
    with pytest.raises(BankError, match="already exists"):
        bank.start_run("other", "c0ffee", GPT, CPU, SOFTWARE, {}, run_id=rid)
    rid2 = start(bank, hardware=H100, task="gpt2-h100")
    bank.finish_run(rid, "finished")
    bank.finish_run(rid, "finished")
    assert bank.get_run(rid).status == "finished" and bank.get_run(rid).finished_at
    assert [r.run_id for r in bank.list_runs()] == [rid, rid2]
    assert [r.run_id for r in bank.list_runs(hardware=H100)] == [rid2]
    assert [r.run_id for r in bank.list_runs(status="running")] == [rid2]
    with pytest.raises(BankError, match="no run"):
        bank.get_run("nope")


# ---- trials -------------------------------------------------------------------------------
def test_trials_round_trip_exactly(bank):
    rid = start(bank)
    nan_loss = TrialRecord(
        trial_id="nan", config={"micro_batch_size": 2, "compile": "default", "bucket": [1, 2]},
        status=TrialStatus.REJECTED, backend="ray_train", workload=GPT, hardware=CPU,
        step_times_s=(0.5,), peak_memory_bytes=(5, 6), loss_trace=(1.0, math.nan),
        error_message="loss drifted", extra={"nested": {"a": [1, 2.5, None]}}, startup_seconds=1.5,
    )
    err = TrialRecord(
        trial_id="err", config={"micro_batch_size": 4}, status=TrialStatus.ERROR,
        backend="ray_train", workload=GPT, hardware=CPU, error_kind=ErrorKind.COMMUNICATION,
        error_message="gloo: connection reset\nline two", device_seconds=0.1 + 0.2,
    )
    records = [ok_trial("a", 1, 0.123456789012345), oom_trial("b", 64), nan_loss, err]
    for r in records:
        assert bank.record_trial(rid, r, origin="search") == "inserted"
    assert _dicts(bank.trials(rid)) == _dicts(records)
    assert bank.trials(rid)[0] == records[0]
    assert _dicts(bank.trials(status="oom")) == _dicts([records[1]])
    assert _dicts(bank.trials(status=["oom", TrialStatus.ERROR])) == _dicts(records[1:2] + records[3:])
    assert bank.trials(workload=GPT_BIG) == [] and len(bank.trials(hardware=CPU)) == 4
    counts = bank.count_trials(rid)
    assert counts == {"ok": 1, "oom": 1, "error": 1, "rejected": 1, "open": 0, "total": 4}


def test_record_trial_is_idempotent_and_finished_rows_immutable(bank):
    rid = start(bank)
    rec = ok_trial("1", 2, 0.2)
    assert bank.record_trial(rid, rec) == "inserted"
    assert bank.record_trial(rid, rec) == "unchanged"  # a retry after a lost connection
    with pytest.raises(BankError, match="immutable"):
        bank.record_trial(rid, ok_trial("1", 2, 0.3))
    assert bank.count_trials(rid)["total"] == 1
    assert _dicts(bank.trials(rid)) == _dicts([rec])
    with pytest.raises(BankError, match="start_run"):
        bank.record_trial("no-such-run", rec)


def test_open_trial_then_record_finishes_it(bank):
    rid = start(bank)
    bank.open_trial(rid, "7", {"micro_batch_size": 1}, "search", backend="table")
    bank.open_trial(rid, "7", {"micro_batch_size": 1}, "search")  # idempotent
    assert bank.open_trials(rid) == [(rid, "7", {"micro_batch_size": 1})]
    assert bank.count_trials(rid)["open"] == 1 and bank.trials(rid) == []
    assert bank.record_trial(rid, ok_trial("7", 1, 0.1)) == "finished"
    assert bank.open_trials(rid) == [] and bank.count_trials(rid)["ok"] == 1
    assert bank.trial_origins(rid) == {"7": "search"}


def test_stale_open_trial_closed_as_interrupted_with_cost(bank):
    rid = start(bank, hardware=A100)
    bank.open_trial(rid, "dead", {"micro_batch_size": 8}, backend="ray_train")
    time.sleep(0.3)
    bank.heartbeat(rid, "dead")  # it lived a while, then the driver died
    bank.open_trial(rid, "alive", {"micro_batch_size": 4})
    time.sleep(0.25)
    bank.heartbeat(rid, "alive")
    assert bank.close_stale_trials(rid, older_than_s=0.2) == ["dead"]
    assert bank.close_stale_trials(rid, older_than_s=0.2) == []
    (rec,) = bank.trials(rid)
    assert rec.status is TrialStatus.ERROR and rec.error_kind is ErrorKind.INTERRUPTED
    assert rec.backend == "ray_train" and rec.config == {"micro_batch_size": 8}
    assert rec.wall_seconds >= 0.29 and rec.device_seconds == pytest.approx(8 * rec.wall_seconds)
    assert [t[1] for t in bank.open_trials(rid)] == ["alive"]


def test_failed_batch_rolls_back_whole_transaction(bank):
    rid = start(bank)
    bank.record_trial(rid, ok_trial("x", 1, 0.5))
    batch = [ok_trial("y", 2, 0.4), ok_trial("x", 1, 0.9), ok_trial("z", 4, 0.3)]
    with pytest.raises(BankError, match="immutable"):
        bank.record_trials(rid, batch)
    assert [r.trial_id for r in bank.trials(rid)] == ["x"]
    assert bank.record_trials(rid, [ok_trial("y", 2, 0.4), ok_trial("x", 1, 0.5)]) == {
        "inserted": 1, "finished": 0, "unchanged": 1}


# ---- ledger -------------------------------------------------------------------------------
def test_baselines_patches_findings_promotion_llm_state(bank):
    rid = start(bank)
    bank.record_baseline(rid, {"step_time_s": 0.5, "noise": {"cv": 0.02}})
    time.sleep(0.01)
    bank.record_baseline(rid, {"step_time_s": 0.4, "noise": {"cv": 0.01}})
    bank.record_baseline(rid, {"step_time_s": 0.4, "noise": {"cv": 0.01}})  # retry: no-op
    latest = bank.latest_baseline(GPT, CPU)
    assert latest.payload == {"step_time_s": 0.4, "noise": {"cv": 0.01}} and latest.run_id == rid
    assert bank.latest_baseline(GPT, H100) is None

    bank.record_patch(rid, "p1", "--- a/x\n+++ b/x\n", ["x.py", "a.py"], {"speedup": 1.1}, True)
    bank.record_patch(rid, "p1", "--- a/x\n+++ b/x\n", ["a.py", "x.py"], {"speedup": 1.1}, True)
    with pytest.raises(BankError, match="different content"):
        bank.record_patch(rid, "p1", "other", ["x.py"], {}, False)
    (p,) = bank.patches(workload_lineage="gpt2-cpu")
    assert (p.patch_id, p.files, p.verified, p.evidence) == ("p1", ("a.py", "x.py"), True, {"speedup": 1.1})
    assert bank.patches(workload_lineage="other") == [] and bank.patches(verified=False) == []

    bank.record_finding(rid, "activation_checkpointing", "full", {"time": 1.3}, {"time": 1.25}, False)
    bank.record_finding(rid, "micro_batch_size", 8, {"mem": 2.0}, {"mem": 3.1}, True)
    bank.record_finding(rid, "micro_batch_size", 8, {"mem": 2.0}, {"mem": 3.1}, True)
    (f,) = bank.findings("micro_batch_size")
    assert (f.setting, f.measured, f.flagged, f.workload, f.hardware) == (8, {"mem": 3.1}, True, GPT, CPU)
    assert len(bank.findings()) == 2 and len(bank.findings(flagged=False, workload=GPT)) == 1

    assert bank.promotion(rid) is None
    bank.record_promotion(rid, {"micro_batch_size": 4}, ["p1"], {"speedup": 1.2, "ci": [1.1, 1.3]})
    bank.record_promotion(rid, {"micro_batch_size": 4}, ["p1"], {"speedup": 1.2, "ci": [1.1, 1.3]})
    with pytest.raises(BankError):
        bank.record_promotion(rid, {"micro_batch_size": 8}, [], {})
    assert bank.promotion(rid).config == {"micro_batch_size": 4}

    bank.record_llm_exchange(rid, "prompt ✓", "answer", {"model": "qwen"})
    assert bank.llm_exchanges(rid)[0]["prompt"] == "prompt ✓"

    assert bank.load_state(rid, "searcher") is None
    bank.save_state(rid, "searcher", {"seen": [1, 2], "rng": "abc"})
    bank.save_state(rid, "searcher", {"seen": [1, 2, 3], "rng": "def"})
    assert bank.load_state(rid, "searcher") == {"seen": [1, 2, 3], "rng": "def"}


# ---- queries ------------------------------------------------------------------------------
def test_nearest_orders_by_signature_then_speed(bank):
    r1 = start(bank, workload=GPT, hardware=CPU)
    r2 = start(bank, workload=GPT_BIG, hardware=CPU, task="big")
    r3 = start(bank, workload=MOE, hardware=H100, task="moe")
    bank.record_trials(r1, [ok_trial("slow", 1, 0.9), oom_trial("oom", 64), ok_trial("fast", 4, 0.3)])
    bank.record_trials(r2, [ok_trial("b1", 1, 2.0, workload=GPT_BIG)])
    bank.record_trials(r3, [ok_trial("m1", 1, 2.0, workload=MOE, hardware=H100)])
    near = bank.nearest(GPT, CPU, k=4)
    assert [n.record.trial_id for n in near] == ["fast", "slow", "oom", "b1"]
    assert near[0].distance == 0 and near[3].distance > 0 and near[0].run_id == r1
    sigs = bank.nearest_signatures(GPT_BIG, k=3)
    assert [s.workload for s in sigs] == [GPT_BIG, GPT, MOE] and sigs[1].num_trials == 3
    assert [n.record.trial_id for n in bank.nearest(MOE, k=1)] == ["m1"]
    assert [n.record.trial_id for n in bank.nearest(GPT, k=5, status="oom")] == ["oom"]


def test_same_workload_other_hardware(bank):
    r1 = start(bank, workload=GPT, hardware=CPU)
    renamed = WorkloadSignature(**{**GPT.to_dict(), "name": "my-gpt2"})
    r2 = start(bank, workload=renamed, hardware=A100, task="gpt2-a100")
    bank.record_trials(r1, [ok_trial("c1", 1, 0.9)])
    bank.record_trials(r2, [ok_trial("a1", 1, 0.01, workload=renamed, hardware=A100),
                            ok_trial("a2", 2, 0.02, workload=renamed, hardware=A100)])
    other = bank.same_workload_other_hardware(GPT, CPU)
    assert [(hw, [r.trial_id for r in recs]) for hw, recs in other] == [(A100, ["a1", "a2"])]
    assert [hw for hw, _ in bank.same_workload_other_hardware(GPT)] == [A100, CPU]


def test_stats(bank):
    rid = start(bank)
    bank.record_trials(rid, [ok_trial("1", 1, 0.1), oom_trial("2", 64)], origin="seed:test")
    st = bank.stats()
    assert st["tables"]["trials"] == 2 and st["trials_by_origin"] == {"seed:test": 2}
    assert st["trials_by_status"]["oom"] == 1 and st["schema_version"] == 1
