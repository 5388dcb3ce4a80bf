"""The table backend replays exactly what was measured, OOM included, and refuses bad specs."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from infrarsi.backends import TableBackend
from infrarsi.errors import ConfigError, IllegalConfigError
from infrarsi.trial import ErrorKind, TrialStatus

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "configs" / "tables" / "ultrascale.yaml"
COLS = {"data_parallel_degree": "dp", "tensor_parallel_degree": "tp",
        "pipeline_parallel_degree": "pp", "micro_batch_size": "mbs",
        "gradient_accumulation_steps": "grad_acc", "zero_stage": "zero"}


def _rows(path: Path, model: str, nodes: int) -> list[dict]:
    with path.open() as f:
        return [r for r in csv.DictReader(f) if r["model"] == model and int(r["nodes"]) == nodes]


def _key(row: dict) -> tuple:
    return tuple(int(row[c]) for c in COLS.values())


# ---- the real Ultra-Scale table ---------------------------------------------------------------
def test_replays_the_measured_row_exactly(ultrascale_csv):
    b = TableBackend.from_spec(SPEC, {"model": "1B", "nodes": 1}, seed=0, csv_path=ultrascale_csv)
    rows = _rows(ultrascale_csv, "1B", 1)
    counts = Counter(_key(r) for r in rows)
    assert len(b.space.allowed) == len(counts)
    ok = next(r for r in rows if r["status"] == "ok" and counts[_key(r)] == 1)
    config = {name: int(ok[col]) for name, col in COLS.items()}
    rec = b.execute(config)
    assert rec.status is TrialStatus.OK
    assert b.objective(rec) == float(ok["tok_s_gpu"])
    assert rec.tokens_per_s == pytest.approx(float(ok["tok_s_gpu"]) * 8, rel=1e-12)
    assert rec.peak_memory_bytes == (round(float(ok["gpu_mem_gb"]) * 1e9),)
    assert rec.tokens_per_step == 256 * 4096
    cost = b.spec.trial_cost
    assert rec.device_seconds == pytest.approx(8 * (cost.startup_s + 13 * rec.step_time_s))
    assert rec.workload.num_layers == 16 and rec.hardware.num_devices == 8


def test_oom_row_is_censored_at_capacity(ultrascale_csv):
    b = TableBackend.from_spec(SPEC, {"model": "8B", "nodes": 1}, csv_path=ultrascale_csv)
    rows = _rows(ultrascale_csv, "8B", 1)
    counts = Counter(_key(r) for r in rows)
    bad = next(r for r in rows if r["status"] == "crashed_or_oom" and counts[_key(r)] == 1)
    rec = b.execute({name: int(bad[col]) for name, col in COLS.items()})
    assert rec.status is TrialStatus.OOM
    assert rec.peak_memory_bytes is None
    assert rec.memory_censor_bytes == b.hardware.memory_bytes == 80 * 10**9
    assert rec.memory_observation == (80e9, False)
    assert b.objective(rec) is None
    assert rec.device_seconds == 8 * b.spec.trial_cost.startup_s


def test_unmeasured_config_is_illegal(ultrascale_csv):
    b = TableBackend.from_spec(SPEC, {"model": "1B", "nodes": 1}, csv_path=ultrascale_csv)
    config = {k: b.space.knob(k).values[-1] for k in b.space.names}  # all maxima: never run
    assert not b.space.is_legal(config)
    with pytest.raises(IllegalConfigError, match="never measured"):
        b.execute(config)
    assert b.resolve({"tensor_parallel_degree": 8, "pipeline_parallel_degree": 8}) is None


def test_duplicates_are_drawn_at_random_and_seeded(ultrascale_csv):
    rows_all = list(csv.DictReader(ultrascale_csv.open()))
    groups: dict = {}
    for r in rows_all:
        groups.setdefault((r["model"], int(r["nodes"]), _key(r)), []).append(r)
    (model, nodes, key), dup = next(
        (k, v) for k, v in groups.items() if len({(r["status"], r["tok_s_gpu"]) for r in v}) > 1)
    config = dict(zip(COLS, key, strict=True))
    b = TableBackend.from_spec(SPEC, {"model": model, "nodes": nodes}, seed=3,
                               csv_path=ultrascale_csv)
    seen = [(r.status, b.objective(r)) for r in (b.execute(config) for _ in range(40))]
    assert len(set(seen)) == len({(r["status"], r["tok_s_gpu"]) for r in dup})
    b.reseed(3)
    assert [(r.status, b.objective(r)) for r in (b.execute(config) for _ in range(40))] == seen


def test_workloads_baseline_and_records(ultrascale_csv):
    ws = TableBackend.workloads(SPEC, csv_path=ultrascale_csv)
    assert {"model": "80B", "nodes": 64} in ws and len(ws) == 28
    b = TableBackend.from_spec(SPEC, {"model": "3B", "nodes": 2}, csv_path=ultrascale_csv)
    base = b.baseline_config()
    assert b.space.is_legal(base) and b.execute(base).ok  # the user's baseline runs today
    assert len(b.records()) == len(_rows(ultrascale_csv, "3B", 2))
    assert b.best_objective() == max(float(r["tok_s_gpu"]) for r in _rows(ultrascale_csv, "3B", 2)
                                     if r["status"] == "ok")
    assert TableBackend.from_spec(SPEC, {"model": "80B", "nodes": 1},
                                  csv_path=ultrascale_csv).best_objective() is None


# ---- another table, other knobs: no code change ------------------------------------------------
SYN_CSV = """\
cluster,ckpt,attn,seq_parallel,zero,mbs,status,step_tok_s,mem_mib
a,true,flash,false,1,2,ok,1000,30000
a,false,flash,false,1,2,OOM,,
a,true,sdpa,true,2,4,ok,900,50000
a,false,sdpa,true,3,4,nccl_timeout,,
a,true,flash,false,1,2,ok,1100,30100
b,true,flash,false,1,2,ok,2000,20000
"""

SYN_SPEC = """\
name: synthetic
csv: {csv}
workload_columns: [cluster]
knobs:
  - {{name: activation_checkpointing, column: ckpt, kind: bool}}
  - {{name: attention_kernel, column: attn, kind: categorical}}
  - {{name: sequence_parallel, column: seq_parallel, kind: bool}}
  - {{name: zero_stage, column: zero}}
  - {{name: micro_batch_size, column: mbs}}
objective: {{column: step_tok_s, direction: maximize}}
status: {{column: status, ok: [ok], oom: [OOM], error: {{nccl_timeout: timeout}}}}
memory: {{column: mem_mib, unit: MiB}}
signature:
  common: {{model_family: dense, num_params: 1000000, num_layers: 2, hidden_size: 64,
           num_heads: 4, seq_len: 128, global_batch_size: 8}}
hardware:
  common: {{device_name: cpu, memory_bytes: 68719476736, devices_per_node: 2}}
"""


def _synthetic(tmp_path: Path, csv_text: str = SYN_CSV, **replace: str) -> Path:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(csv_text)
    spec = SYN_SPEC.format(csv=csv_path)
    for old, new in replace.items():
        spec = spec.replace(old, new)
    path = tmp_path / "t.yaml"
    path.write_text(spec)
    return path


def test_other_knobs_need_no_code_change(tmp_path):
    spec = _synthetic(tmp_path)
    b = TableBackend.from_spec(spec, {"cluster": "a"}, seed=0)
    assert b.space.knob("activation_checkpointing").values == (False, True)
    assert b.space.knob("attention_kernel").values == ("flash", "sdpa")
    assert b.space.knob("attention_kernel").kind == "categorical"
    assert len(b.space.allowed) == 4  # 5 rows, one config measured twice
    rec = b.execute({"activation_checkpointing": True, "attention_kernel": "sdpa",
                     "sequence_parallel": True, "zero_stage": 2, "micro_batch_size": 4})
    assert rec.ok and b.objective(rec) == 900.0 and rec.peak_memory_bytes == (50000 * 2**20,)
    err = b.execute({"activation_checkpointing": False, "attention_kernel": "sdpa",
                     "sequence_parallel": True, "zero_stage": 3, "micro_batch_size": 4})
    assert err.status is TrialStatus.ERROR and err.error_kind is ErrorKind.TIMEOUT
    oom = b.execute({"activation_checkpointing": False, "attention_kernel": "flash",
                     "sequence_parallel": False, "zero_stage": 1, "micro_batch_size": 2})
    assert oom.status is TrialStatus.OOM and oom.memory_censor_bytes == 64 * 2**30
    assert b.baseline_config()["activation_checkpointing"] is True  # a config that ran
    assert [w["cluster"] for w in TableBackend.workloads(spec)] == ["a", "b"]


# ---- bad input ------------------------------------------------------------------------------
def test_spec_naming_a_missing_column(tmp_path):
    spec = _synthetic(tmp_path, **{"column: attn": "column: attention"})
    with pytest.raises(ConfigError, match=r"knobs\[1\]\.column.*'attention'"):
        TableBackend.from_spec(spec, {"cluster": "a"})


def test_status_value_not_mapped(tmp_path):
    spec = _synthetic(tmp_path, SYN_CSV.replace("nccl_timeout", "hang"))
    with pytest.raises(ConfigError, match=r"line 5.*'status'.*'hang' is not mapped"):
        TableBackend.from_spec(spec, {"cluster": "a"})


def test_knob_column_with_mixed_types(tmp_path):
    spec = _synthetic(tmp_path, SYN_CSV.replace("a,true,sdpa,true,2,4", "a,true,sdpa,true,two,4"))
    with pytest.raises(ConfigError, match=r"column 'zero' mixes types.*line 4.*'two'"):
        TableBackend.from_spec(spec, {"cluster": "a"})
    declared = _synthetic(tmp_path, SYN_CSV.replace("a,true,sdpa,true,2,4", "a,true,sdpa,true,two,4"),
                          **{"column: zero}": "column: zero, type: int}"})
    with pytest.raises(ConfigError, match=r"line 4, column 'zero'.*'two' is not a int"):
        TableBackend.from_spec(declared, {"cluster": "a"})


def test_empty_or_malformed_workload(tmp_path):
    spec = _synthetic(tmp_path)
    with pytest.raises(ConfigError, match=r"workload \{'cluster': 'zz'\} has no rows.*known"):
        TableBackend.from_spec(spec, {"cluster": "zz"})
    with pytest.raises(ConfigError, match=r"exactly the columns \['cluster'\]"):
        TableBackend.from_spec(spec, {"cluster": "a", "nodes": 1})


def test_unknown_spec_key_and_missing_csv(tmp_path):
    spec = _synthetic(tmp_path, **{"workload_columns:": "workload_cols:"})
    with pytest.raises(ConfigError, match="workload_cols"):
        TableBackend.from_spec(spec, {"cluster": "a"})
    spec = _synthetic(tmp_path)
    with pytest.raises(ConfigError, match="INFRARSI_DATA_DIR"):
        TableBackend.from_spec(spec, {"cluster": "a"}, csv_path=tmp_path / "absent.csv")


def test_ok_row_without_objective(tmp_path):
    spec = _synthetic(tmp_path, SYN_CSV.replace("ok,1000,30000", "ok,,30000"))
    with pytest.raises(ConfigError, match=r"line 2, column 'step_tok_s'.*numeric objective"):
        TableBackend.from_spec(spec, {"cluster": "a"})


def test_hidden_memory_gives_labels_only_records(ultrascale_csv):
    """``hide: [memory]``: an ok row carries no peak, so the memory model sees it left-censored
    at the device's capacity (and an OOM right-censored, as before)."""
    from dataclasses import replace

    from infrarsi.backends.table import load_table_spec
    from infrarsi.models.peak_memory import memory_bounds

    spec = replace(load_table_spec(SPEC), hide=("memory",))
    b = TableBackend.from_spec(spec, {"model": "8B", "nodes": 4}, csv_path=ultrascale_csv)
    recs = b.records()
    ok = [r for r in recs if r.ok]
    assert ok and all(r.peak_memory_bytes is None for r in ok)
    cap = float(b.hardware.memory_bytes)
    assert {memory_bounds(r) for r in ok} == {(0.0, cap)}
    shown = TableBackend.from_spec(SPEC, {"model": "8B", "nodes": 4}, csv_path=ultrascale_csv)
    assert any(r.peak_memory_bytes for r in shown.records())
    with pytest.raises(ConfigError, match="cannot be hidden"):
        replace(spec, hide=("objective",))
