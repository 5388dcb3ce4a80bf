"""The GPU-cluster simulator: memory moves the right way with each knob, OOM boundary follows
capacity, illegal configs are refused naming the field, seeded noise, known compile failures,
calibration fidelity on the measured table."""

from __future__ import annotations

import math
import random

import pytest

from infrarsi.backends import Backend
from infrarsi.backends.simulator import SimulatorBackend, SimWorkload
from infrarsi.backends.simulator import calibration as cal
from infrarsi.errors import ConfigError, IllegalConfigError
from infrarsi.trial import ErrorKind, TrialRecord, TrialStatus

DENSE = SimWorkload("t-dense", "llama-3.1-8b", "H100-80GB", 1, 4096, 256,
                    baseline={"data_parallel_degree": 8})


@pytest.fixture(scope="module")
def dense() -> SimulatorBackend:
    return SimulatorBackend(DENSE, seed=0)


def peak(b: SimulatorBackend, **cfg) -> int:
    return max(b.simulate({**b.baseline_config(), **cfg}).peak_bytes)


def test_builtins_are_backends_with_legal_ok_baselines():
    assert len(SimulatorBackend.builtin_names()) == 4
    for name in SimulatorBackend.builtin_names():
        b = SimulatorBackend.builtin(name, seed=1)
        assert isinstance(b, Backend)
        rec = b.execute(b.baseline_config(), trial_id="base")
        assert rec.ok, rec.summary()
        assert rec.tokens_per_step == b.workload.tokens_per_step
        assert rec.device_seconds > rec.hardware.num_devices * sum(rec.step_times_s)
        assert set(rec.phase_times_s) >= {"compute", "communication", "bubble"}
        assert TrialRecord.from_dict(rec.to_dict()) == rec
        assert b.space.sample(20, random.Random(0))


def test_memory_moves_the_right_way_with_each_knob(dense):
    base = {"zero_stage": 1, "micro_batch_size": 2}
    p = lambda **kw: peak(dense, **{**base, **kw})  # noqa: E731
    assert p(micro_batch_size=4) > p() > p(micro_batch_size=1)
    assert p(activation_checkpointing="selective") < p()
    assert p(activation_checkpointing="full") < p(activation_checkpointing="selective")
    assert p(zero_stage=0) > p(zero_stage=1) > p(zero_stage=2) > p(zero_stage=3)
    assert p(tensor_parallel_degree=2, data_parallel_degree=4) < p()
    assert p(tensor_parallel_degree=4, data_parallel_degree=2) < p(
        tensor_parallel_degree=2, data_parallel_degree=4)
    assert p(context_parallel_degree=2, data_parallel_degree=4) < p()
    assert p(precision="fp8") < p()  # fp8 activations outweigh the fp8 weight cache here


def test_oom_boundary_moves_with_capacity():
    h100 = SimulatorBackend(DENSE)
    h200 = SimulatorBackend(SimWorkload("t-h200", "llama-3.1-8b", "H200-141GB", 1, 4096, 256,
                                        baseline={"data_parallel_degree": 8}))
    cfg = {"zero_stage": 2, "micro_batch_size": 2}
    a, b = h100.execute(cfg), h200.execute(cfg)
    assert a.status is TrialStatus.OOM and b.ok
    assert a.peak_memory_bytes is None and a.memory_censor_bytes == a.hardware.memory_bytes
    assert a.memory_observation == (float(a.hardware.memory_bytes), False)
    assert a.device_seconds > 0 and not a.step_times_s
    assert max(b.peak_memory_bytes) > h100.hardware.memory_bytes  # same peak, more room

    def largest_ok_mbs(backend):
        fits = [m for m in (1, 2, 4, 8, 16)
                if backend.simulate({**cfg, "micro_batch_size": m}).status is TrialStatus.OK]
        return max(fits)

    assert largest_ok_mbs(h200) > largest_ok_mbs(h100)


def test_illegal_configs_are_refused_naming_the_field(dense):
    with pytest.raises(IllegalConfigError, match="tensor_parallel_degree=16"):
        dense.execute({"tensor_parallel_degree": 16, "data_parallel_degree": 1})
    with pytest.raises(IllegalConfigError, match="data_parallel_degree 4 x tensor_parallel_degree 1"):
        dense.execute({"data_parallel_degree": 4})
    with pytest.raises(IllegalConfigError, match="micro_batch_size"):
        SimulatorBackend(SimWorkload("t", "llama-3.1-8b", "H100-80GB", 1, 4096, 24,
                                     baseline={"data_parallel_degree": 8})).execute(
            {"data_parallel_degree": 8, "micro_batch_size": 2})
    with pytest.raises(IllegalConfigError, match="precision=bf16"):
        SimulatorBackend(SimWorkload("t", "llama-3.2-1b", "A100-80GB", 1, 4096, 256,
                                     baseline={"data_parallel_degree": 8})).execute(
            {"precision": "fp8"})
    moe = SimulatorBackend.builtin("moe-single-node")
    with pytest.raises(IllegalConfigError, match="expert_parallel_degree"):
        moe.execute({**moe.baseline_config(), "data_parallel_degree": 2,
                     "tensor_parallel_degree": 4, "expert_parallel_degree": 8})
    with pytest.raises(IllegalConfigError, match="unknown simulator workload"):
        SimulatorBackend.builtin("nope")


def test_a_clearly_slow_simulated_trial_stops_early_like_the_harness():
    dense = SimulatorBackend.builtin(SimulatorBackend.builtin_names()[0], seed=1)
    base = dense.baseline_config()
    full = dense.execute(base)
    assert full.ok and "stopped_early" not in full.extra
    short = dense.execute(base, stop_slower_than_s=full.step_time_s / 10)
    assert short.ok and len(short.step_times_s) == 2 and short.extra["stopped_early"]
    assert short.device_seconds < full.device_seconds
    kept = dense.execute(base, stop_slower_than_s=full.step_time_s * 10)
    assert len(kept.step_times_s) == len(full.step_times_s)


def test_noise_is_seeded_and_reproducible():
    cfg = {"zero_stage": 3, "micro_batch_size": 1}
    a, b, c = (SimulatorBackend(DENSE, seed=s) for s in (7, 7, 8))
    ra, rb, rc = a.execute(cfg), b.execute(cfg), c.execute(cfg)
    assert ra.step_times_s == rb.step_times_s != rc.step_times_s
    again = a.execute(cfg)  # a repeat is a new measurement, but a reproducible one
    assert again.step_times_s != ra.step_times_s == rb.step_times_s
    assert b.execute(cfg).step_times_s == again.step_times_s
    truth = a.simulate(cfg).step_time_s
    assert all(abs(math.log(t / truth)) < 0.15 for t in ra.step_times_s)


def test_a_reseeded_trial_does_not_depend_on_what_ran_before():
    # a benchmark reseeds before each trial: one search's measurements must not change with
    # the searches that ran the same config on this backend before it
    cfg = {"zero_stage": 3, "micro_batch_size": 1}
    fresh, used = SimulatorBackend(DENSE, seed=7), SimulatorBackend(DENSE, seed=7)
    for _ in range(3):
        used.execute(cfg)
    fresh.reseed(42)
    used.reseed(42)
    assert fresh.execute(cfg).step_times_s == used.execute(cfg).step_times_s
    used.reseed(43)
    assert used.execute(cfg).step_times_s != fresh.execute(cfg).step_times_s
    # nor the experience records it hands to other workloads' searches
    assert [r.step_times_s for r in used.records(5)] == [
        r.step_times_s for r in SimulatorBackend(DENSE, seed=7).records(5)]


def test_known_compile_failures(dense):
    bad = {"zero_stage": 1, "precision": "fp8", "activation_checkpointing": "selective",
           "compile": "default"}
    rec = dense.execute(bad)
    assert rec.status is TrialStatus.ERROR and rec.error_kind is ErrorKind.COMPILE
    assert "torch.compile" in rec.error_message and rec.device_seconds > 0
    assert dense.execute({**bad, "compile": "off"}).status is not TrialStatus.ERROR
    moe = SimulatorBackend.builtin("moe-single-node")
    rec = moe.execute({**moe.baseline_config(), "moe_dispatch": "deepep", "compile": "default"})
    assert rec.error_kind is ErrorKind.COMPILE


def test_knobs_that_should_speed_up_do(dense):
    t = lambda **kw: dense.simulate({"zero_stage": 3, **kw}).step_time_s  # noqa: E731
    assert t(compile="default") < t()
    assert t(precision="fp8") < t()
    assert t(overlap_communication=False) > t()
    assert t(activation_checkpointing="full") > t()
    assert t(micro_batch_size=2, activation_checkpointing="full") < t(activation_checkpointing="full")


@pytest.fixture(scope="module")
def table():
    try:
        return cal.load_table()
    except (FileNotFoundError, ConfigError) as e:
        pytest.skip(f"measured table absent ({e}); set INFRARSI_DATA_DIR to run the fidelity check")


def test_calibration_fidelity_floor(table):
    # a quarter of the workloads keeps the test fast; scripts/sim_fidelity.py prints them all
    keep = table[table.nodes.isin([1, 8]) & table.model.isin(["1B", "8B"])]
    rows = cal.fidelity(keep, SimulatorBackend(DENSE).params)
    rhos = [f.spearman for f in rows if not math.isnan(f.spearman)]
    assert sorted(rhos)[len(rhos) // 2] >= 0.5, rows
    agree = sum(f.tp + f.tn for f in rows) / sum(f.rows for f in rows)
    assert agree >= 0.8, rows


def test_simulator_is_a_benchmark_source_scored_by_its_noise_free_best():
    from infrarsi.bench import run_bench
    from infrarsi.bench._report import metrics
    from infrarsi.bench._sources import WORKLOAD_SOURCES

    backends = WORKLOAD_SOURCES["simulator"]({"workloads": [{"name": "dense-single-node"}]})
    (b,) = backends
    best = b.best_objective()
    assert best and best > 0
    exp = b.records(n=20)
    assert len(exp) == 20 and exp is b.records(n=20)  # a seeded sample, made once
    assert any(r.ok for r in exp)
    for r in exp:
        if r.ok:  # no measured config beats the best of the space by more than noise
            assert r.extra["true_objective"] <= best * (1 + 1e-9)
    runs = run_bench(backends, searchers=["random"], budgets=[5], seeds=[0])
    (m,) = [metrics(r) for r in runs]
    assert m.trials == 5 and (m.fraction is None or 0.0 <= m.fraction <= 1.0 + 1e-9)
