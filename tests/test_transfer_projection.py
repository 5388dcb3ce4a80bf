"""Experience from another search space is projected, not dropped; table specs' value aliases
reach the physics; a spec's numbers and paths read as people write them."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest

from infrarsi.backends import TableBackend
from infrarsi.bank.transfer import project_records
from infrarsi.errors import ConfigError
from infrarsi.models.physics import memory_estimate_bytes
from infrarsi.search import SearchEngine

HEADER = ["model", "tp", "mbs", "zero", "ckpt", "status", "tok_s_gpu", "mem_gb"]

SPEC = """
name: {name}
csv: {csv}
workload_columns: [model]
knobs:
  - {{name: tensor_parallel_degree, column: tp, kind: ordinal, type: int}}
  - {{name: micro_batch_size, column: mbs, kind: ordinal, type: int}}
{extra}
objective: {{column: tok_s_gpu, direction: maximize, per_device: true}}
status: {{column: status, ok: [ok], oom: [oom]}}
memory: {{column: mem_gb, unit: GB}}
signature:
  common: {{model_family: dense, num_params: 1000000000, num_layers: 16, hidden_size: 2048,
           num_heads: 16, seq_len: 2048, global_batch_size: 64, vocab_size: 32000}}
hardware:
  common: {{device_name: {device}, memory_bytes: 40000000000, devices_per_node: 8,
           interconnect: nvlink, peak_flops: {flops}}}
"""


def _table(tmp_path: Path, name: str, rows: list[list], extra: str, device: str = "A100-40GB",
           flops: str = "3.12e14") -> Path:
    with (tmp_path / f"{name}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)
    spec = tmp_path / f"{name}.yaml"
    # csv is a bare file name: it resolves against the spec's folder, not the project root
    spec.write_text(SPEC.format(name=name, csv=f"{name}.csv", extra=extra, device=device,
                                flops=flops))
    return spec


def _h100_records(tmp_path: Path):
    rows = [["8B", tp, mbs, zero, "x", "ok", 1000 * tp + 10 * mbs + zero, 20 + mbs]
            for tp in (1, 2, 4) for mbs in (1, 2, 8) for zero in (0, 1)]
    spec = _table(tmp_path, "h100", rows,
                  "  - {name: zero_stage, column: zero, kind: ordinal, type: int}",
                  device="H100-80GB", flops="9.89e+14")
    return TableBackend.from_spec(spec, {"model": "8B"}).records()


def _a100_backend(tmp_path: Path) -> TableBackend:
    rows = [["3B", tp, mbs, 0, ckpt, "ok", 900 * tp + mbs, 10 + mbs]
            for tp in (1, 2) for mbs in (1, 2) for ckpt in ("every_layer", "disabled")]
    spec = _table(tmp_path, "a100", rows,
                  "  - {name: activation_checkpointing, column: ckpt, kind: categorical,\n"
                  "     values: {every_layer: full, disabled: none}}")
    return TableBackend.from_spec(spec, {"model": "3B"})


def test_a_record_from_another_knob_set_is_used_not_dropped(tmp_path):
    exp = _h100_records(tmp_path)
    target = _a100_backend(tmp_path)
    # every H100 record carries zero_stage (the A100 space lacks it) and lacks checkpointing;
    # mbs 8 and tp 4 lie outside the A100 domain (1, 2): the old filter kept none of them
    assert all("zero_stage" in r.config for r in exp)
    p = project_records(target.space, exp)
    assert len(p.records) == len(exp) and not p.dropped
    assert p.context_knobs == ("zero_stage",)
    assert p.extrapolated == sum(r.config["micro_batch_size"] == 8
                                 or r.config["tensor_parallel_degree"] == 4 for r in exp)
    engine = SearchEngine(target.space, target.workload, target.hardware, budget=4,
                          experience=exp, objective=target.objective)
    assert len(engine.experience) == len(exp)
    # the experience models fit and predict the A100 pool from them
    fit = engine._current_fit()
    assert fit.mu.shape == (len(engine.pool),) and (fit.mu != 0).any()


def test_the_projection_says_how_many_were_used_and_why_others_were_dropped(tmp_path):
    exp = _h100_records(tmp_path)
    target = _a100_backend(tmp_path)
    odd = [r.__class__.from_dict({**r.to_dict(),
                                  "config": {**r.config, "activation_checkpointing": "offload"}})
           for r in exp[:3]]
    p = project_records(target.space, exp + odd)
    line = p.summary()
    assert f"using {len(exp)} of {len(exp) + 3} records" in line
    assert "H100-80GB" in line and "zero_stage" in line
    assert "dropped 3: activation_checkpointing='offload'" in line


def test_a_spec_value_alias_changes_what_the_physics_reads(tmp_path):
    b = _a100_backend(tmp_path)
    assert set(b.space.knob("activation_checkpointing").values) == {"full", "none"}
    cfg = {"tensor_parallel_degree": 1, "micro_batch_size": 2}
    full = memory_estimate_bytes({**cfg, "activation_checkpointing": "full"}, b.workload)
    raw = memory_estimate_bytes({**cfg, "activation_checkpointing": "every_layer"}, b.workload)
    none = memory_estimate_bytes({**cfg, "activation_checkpointing": "none"}, b.workload)
    assert raw == none and full < 0.9 * none  # unaliased, "every_layer" read as no recompute


def test_values_the_physics_does_not_understand_are_warned_about(tmp_path):
    rows = [["3B", 1, 1, 0, c, "ok", 100, 10] for c in ("every_layer", "disabled")]
    spec = _table(tmp_path, "raw", rows,
                  "  - {name: activation_checkpointing, column: ckpt, kind: categorical}")
    with pytest.warns(UserWarning, match="every_layer"):
        TableBackend.from_spec(spec, {"model": "3B"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _a100_backend(tmp_path)  # the aliased spec is understood: no warning


def test_scientific_numbers_read_in_specs(tmp_path):
    b = _a100_backend(tmp_path)  # peak_flops: 3.12e14 (PyYAML alone reads it as text)
    assert b.hardware.peak_flops == pytest.approx(3.12e14)
    spec = _table(tmp_path, "bad", [["3B", 1, 1, 0, "x", "ok", 1, 1]], "", flops="abc3e14")
    with pytest.raises(ConfigError, match="expected a number"):
        TableBackend.from_spec(spec, {"model": "3B"})
