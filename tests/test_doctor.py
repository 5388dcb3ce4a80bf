"""Doctor: phase fractions add up, the noise model recovers known noise, a broken baseline is
reported as such, and (slow) the whole stage on cpu_dense through real Ray Train trials."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

from infrarsi.doctor import (
    BaselineUnusableError,
    bottleneck_findings,
    fractions,
    loss_spread,
    mde_at_pairs,
    mde_for,
    noise_model,
    required_steps,
    run_doctor,
    summarize_profile,
)
from infrarsi.harness.profile import PHASES, Event, attribute_phases
from infrarsi.search.verify import paired_speedup

sys.path.insert(0, str(Path(__file__).parent))
from conftest import copy_task  # noqa: E402
from test_harness import payload, tiny_spec  # noqa: E402

MS = 1_000_000


# ---- phase attribution (pure) ---------------------------------------------------------------
def _synthetic_events() -> list[Event]:
    """A 100 ms step: data 0-5, forward 5-30 (an item() at 20-24), backward 30-80 with compute
    until 60 and a gloo all-reduce 50-75 on another thread, optimizer 80-92, barrier 95-100."""
    main = 1
    return [
        Event("infrarsi::step", main, 0, 100 * MS),
        Event("infrarsi::data", main, 0, 5 * MS),
        Event("aten::randint", main, 1 * MS, 4 * MS),
        Event("infrarsi::forward", main, 5 * MS, 30 * MS),
        Event("aten::mm", main, 5 * MS, 20 * MS),
        Event("aten::item", main, 20 * MS, 24 * MS),
        Event("aten::_local_scalar_dense", main, 21 * MS, 24 * MS),
        Event("aten::mm", main, 24 * MS, 30 * MS),
        Event("infrarsi::backward", main, 30 * MS, 80 * MS),
        Event("AddmmBackward0", main, 30 * MS, 60 * MS),
        Event("c10d::allreduce_", main, 50 * MS, 51 * MS),
        Event("gloo:all_reduce", 7, 50 * MS, 75 * MS),
        Event("infrarsi::optimizer", main, 80 * MS, 92 * MS),
        Event("Optimizer.step#AdamW.step", main, 80 * MS, 92 * MS),
        Event("infrarsi::barrier", main, 95 * MS, 100 * MS),
        Event("gloo:barrier", 7, 95 * MS, 100 * MS),
    ]


def test_phase_attribution_adds_up_and_splits_overlap():
    out = attribute_phases(_synthetic_events())
    ph = out["phases_s"]
    assert set(ph) == set(PHASES)
    assert sum(ph.values()) == pytest.approx(out["step_s"]) == pytest.approx(0.100)
    assert all(v >= 0 for v in ph.values())
    assert ph["host_sync"] == pytest.approx(0.004)
    assert ph["idle"] == pytest.approx(0.005)  # the closing barrier, not communication
    # all-reduce 50-75 ms: 50-60 overlaps backward compute; 60-75 is exposed.
    assert ph["communication"] == pytest.approx(0.015)
    assert out["comm_total_s"] == pytest.approx(0.025)
    assert out["comm_overlapped_s"] == pytest.approx(0.010)
    assert ph["backward"] == pytest.approx(0.050 - 0.015)
    assert ph["forward"] == pytest.approx(0.025 - 0.004)
    assert ph["data"] == pytest.approx(0.005) and ph["optimizer"] == pytest.approx(0.012)
    assert ph["other"] == pytest.approx(0.003)  # 92-95 ms between labels
    assert fractions(ph)["communication"] == pytest.approx(0.15)


def test_profiled_step_fractions_add_up_on_a_real_step():
    from infrarsi.harness import train_worker

    p = payload(tiny_spec("moe"), num_workers=1)
    r = train_worker({**p, "profile": True})
    prof = r["profile"]["per_rank"][0]
    assert sum(r["phase_times_s"].values()) == pytest.approx(prof["step_s"], rel=1e-9)
    assert r["phase_times_s"]["forward"] > 0 and r["phase_times_s"]["backward"] > 0
    assert prof["sync_ops"]["aten::nonzero"] > 0  # MoE routing syncs with the host
    mem = prof["memory_bytes"]
    assert mem["optimizer_state"] == pytest.approx(2 * mem["params"], rel=0.01)  # AdamW m, v
    assert len(r["step_times_s"]) == 2  # the profiled step is not a measured step
    assert "profile" not in train_worker(p)  # not asked for: not taken


def test_summary_reports_missing_profile_parts():
    from infrarsi.trial import TrialRecord

    rec = TrialRecord.from_dict(_ok_record_dict("t0", extra={"profile": {"per_rank": [
        {"error": "RuntimeError: profiler unavailable"}]}}))
    out = summarize_profile([rec])
    assert "phase profile" in out["missing"] and "profiler unavailable" in out["errors"][0]
    assert bottleneck_findings(out, rec.config) == []


# ---- noise model (pure) ---------------------------------------------------------------------
def test_noise_model_recovers_known_noise():
    rng = random.Random(0)
    sigma_w, sigma_b, steps = 0.03, 0.02, 40
    series = []
    for _ in range(60):
        shift = rng.gauss(0, sigma_b)
        series.append([0.2 * math.exp(shift + rng.gauss(0, sigma_w)) for _ in range(steps)])
    n = noise_model(series, pairs=3, target_mde=0.05)
    assert n["within_cv"] == pytest.approx(sigma_w, rel=0.05)
    assert n["sigma_between"] == pytest.approx(sigma_b, rel=0.25)
    expect = math.sqrt(sigma_b**2 + (math.pi / 2) * sigma_w**2 / steps)
    assert n["between_cv"] == pytest.approx(expect, rel=0.25)
    assert n["mde"] == pytest.approx(mde_for(n["sigma_between"], n["within_cv"], steps, 3), rel=1e-9)
    assert n["too_noisy"] and n["required_measured_steps"] is None  # sigma_b alone is too big
    assert n["required_pairs"] is not None and "--pairs" in n["advice"]


def test_the_mde_at_doctors_advised_pairs_meets_the_target():
    """The verifier's bar for N pairs comes from the noise components, so the advice
    "verify with --pairs N" really brings the bar down to the target."""
    rng = random.Random(2)
    series = [[0.2 * math.exp(rng.gauss(0, 0.08)) for _ in range(5)] for _ in range(3)]
    n = noise_model(series, pairs=3, target_mde=0.05)
    assert n["too_noisy"] and f"--pairs {n['required_pairs']}" in n["advice"]
    assert mde_at_pairs(n, 3) == pytest.approx(n["mde"], rel=1e-12)
    assert mde_at_pairs(n, n["required_pairs"]) <= 0.05 < mde_at_pairs(n, n["required_pairs"] - 1)
    assert mde_at_pairs(n, 6) < mde_at_pairs(n, 4) < n["mde"]
    # a payload without the components (an older bank) keeps its own figure
    assert mde_at_pairs({"mde": 0.07}, 10) == 0.07


def test_mde_matches_the_verifiers_interval_under_the_null():
    """Simulated verifications of a null effect: the t-interval's half-width averages about mde."""
    rng = random.Random(1)
    sigma_w, steps, pairs = 0.05, 5, 3
    mde = mde_for(0.0, sigma_w, steps, pairs)
    sd_trial = math.sqrt(math.pi / 2) * sigma_w / math.sqrt(steps)
    halves, false_pos = [], 0
    for _ in range(2000):
        base = [math.exp(rng.gauss(0, sd_trial)) for _ in range(pairs)]
        cand = [math.exp(rng.gauss(0, sd_trial)) for _ in range(pairs)]
        s, lo, hi = paired_speedup(base, cand)
        halves.append(math.log(hi / s))
        false_pos += lo > 1.0
    rms_half = math.sqrt(sum(h * h for h in halves) / len(halves))
    assert rms_half == pytest.approx(math.log1p(mde), rel=0.1)
    assert false_pos / 2000 == pytest.approx(0.025, abs=0.015)


def test_required_steps_reach_the_target_and_quiet_machines_pass():
    steps = required_steps(0.0, 0.08, 3, 0.05)
    assert steps is not None and mde_for(0.0, 0.08, steps, 3) <= 0.05 < mde_for(0.0, 0.08, steps - 1, 3)
    quiet = noise_model([[0.1 * (1 + 0.001 * ((i * 7) % 5)) for i in range(10)]] * 3, pairs=3)
    assert not quiet["too_noisy"] and quiet["mde"] < 0.01
    noisy = noise_model([[0.1, 0.13, 0.09, 0.12, 0.1]] * 3, pairs=3, target_mde=0.05)
    assert noisy["too_noisy"] and noisy["required_measured_steps"] > 5
    assert "timing.measured_steps" in noisy["advice"]


def test_loss_spread():
    assert loss_spread([[1.0, 2.0], [1.0, 2.0]]) == [0.0, 0.0]
    assert loss_spread([[1.0, 2.0], [1.1, 2.0]])[0] == pytest.approx(0.1 / 1.05)


# ---- a broken baseline ------------------------------------------------------------------------
class _FakeBackend:
    """A backend that returns fixed records (a boundary stand-in: no Ray trial needed)."""

    def __init__(self, spec, records):
        from infrarsi.backends.ray_train.backend import hardware_fingerprint, workload_signature

        self.workload, self.hardware = workload_signature(spec), hardware_fingerprint(spec)
        self._records = list(records)
        self.calls = 0

    def baseline_config(self):
        return dict(self._records[0]["config"])

    def execute(self, config, *, trial_id=None, stop_slower_than_s=None):
        from infrarsi.trial import TrialRecord

        d = dict(self._records[min(self.calls, len(self._records) - 1)])
        self.calls += 1
        return TrialRecord.from_dict({**d, "trial_id": trial_id,
                                      "workload": self.workload.to_dict(),
                                      "hardware": self.hardware.to_dict()})


def _ok_record_dict(trial_id: str, **kw) -> dict:
    from infrarsi.backends.ray_train.backend import hardware_fingerprint, workload_signature

    spec = tiny_spec()
    d = {"trial_id": trial_id, "config": {"num_workers": 1, "precision": "fp32"}, "status": "ok",
         "backend": "fake", "workload": workload_signature(spec).to_dict(),
         "hardware": hardware_fingerprint(spec).to_dict(),
         "step_times_s": [0.1, 0.1], "loss_trace": [1.0]}
    return {**d, **kw}


def _locked_contract(tmp_path):
    from infrarsi.contract import load_task, lock
    from infrarsi.workloads.shape import shape_stats

    spec = load_task(copy_task(tmp_path))
    contract = lock(spec, baseline_config=dict(spec.search.baseline), loss_trace=[7.6] * 4,
                    model_stats=shape_stats(spec))
    run_dir = tmp_path / "run"
    contract.save(run_dir)
    return spec, contract, run_dir


def test_oom_baseline_is_reported_unusable_and_recorded(tmp_path):
    spec, contract, run_dir = _locked_contract(tmp_path)
    oom = {**_ok_record_dict("x", config=contract.baseline_config), "status": "oom",
           "step_times_s": [], "loss_trace": [], "memory_censor_bytes": 2**27,
           "error_message": "emulated device out of memory"}
    backend = _FakeBackend(spec, [oom])
    url = f"sqlite:///{tmp_path / 'bank.sqlite'}"
    with pytest.raises(BaselineUnusableError, match="out of memory.*unusable.*micro_batch_size"):
        run_doctor(run_dir, repeats=3, bank_url=url, backend=backend, out=lambda s: None)
    assert backend.calls == 1  # no point repeating an OOM
    doc = json.loads((run_dir / "doctor.json").read_text())
    assert doc["status"] == "failed" and "out of memory" in doc["error"]
    from infrarsi.bank import ExperienceBank

    with ExperienceBank.open(url) as bank:
        assert [r.status.value for r in bank.trials(doc["run_id"])] == ["oom"]
        assert bank.latest_baseline(backend.workload, backend.hardware) is None


def test_nondeterministic_loss_is_refused_with_the_spread(tmp_path):
    spec, contract, run_dir = _locked_contract(tmp_path)
    good = _ok_record_dict("x", config=contract.baseline_config, loss_trace=[7.6] * 4)
    drift = {**good, "status": "rejected", "loss_trace": [7.6, 7.9, 7.6, 7.6],
             "error_message": "loss drifted at step 1: 7.900000 vs reference 7.600000"}
    backend = _FakeBackend(spec, [good, drift])
    with pytest.raises(BaselineUnusableError, match=r"3\.95e-02.*non-deterministic.*rtol: 0.08"):
        run_doctor(run_dir, repeats=3, bank_url=f"sqlite:///{tmp_path / 'b.sqlite'}",
                   backend=backend, out=lambda s: None)


def test_the_run_stage_reads_doctors_baseline_trials_for_its_models(tmp_path):
    from infrarsi.search._session import RunSession

    spec, contract, run_dir = _locked_contract(tmp_path)
    good = _ok_record_dict("x", config=contract.baseline_config, loss_trace=[7.6] * 4)
    url = f"sqlite:///{tmp_path / 'b.sqlite'}"
    run_doctor(run_dir, repeats=3, bank_url=url, backend=_FakeBackend(spec, [good]),
               out=lambda s: None)
    with RunSession.open(run_dir, resume=False, bank_url=url, local_mode=True,
                         progress=lambda s: None) as session:
        assert [r.trial_id for r in session.baseline_records] == [
            "doctor-0", "doctor-1", "doctor-2"]
        assert all(r.step_time_s == pytest.approx(0.1) for r in session.baseline_records)
        # the proposers' digest: on CPU doctor measured the matmul speeds the bf16 prior reads
        mm = session.findings["matmul"]
        assert mm["fp32_flops"] > 0 and mm["bf16_flops"] > 0
        assert any("bf16 matmul" in b for b in session.findings["bottlenecks"])
        prior = next(p for p in session.priors() if p.knob == "precision")
        assert prior.source == "expert:precision:measured"


# ---- end to end -----------------------------------------------------------------------------
@pytest.mark.slow
def test_doctor_end_to_end_on_cpu_dense(tmp_path, ray_local):
    from infrarsi.bank import ExperienceBank
    from infrarsi.cli import main
    from infrarsi.init_stage import init_task

    task = copy_task(tmp_path, **{"timing.measured_steps": 3})
    _, _, _ = init_task(task, run_dir=tmp_path / "run")
    url = f"sqlite:///{tmp_path / 'bank.sqlite'}"
    rc = main(["doctor", "--run-dir", str(tmp_path / "run"), "--repeats", "2", "--bank-url", url])
    assert rc == 0
    doc = json.loads((tmp_path / "run" / "doctor.json").read_text())
    assert doc["baseline_step_s"] > 0 and 0 < doc["noise"]["mde"] < 10
    assert sum(doc["profile"]["fractions"].values()) == pytest.approx(1.0)
    assert len(doc["profile"]["per_rank"]) == 2
    assert doc["mfu"]["peak_label"].startswith("CPU measured matmul peak") and 0 < doc["mfu"]["mfu"] < 1
    assert {"kind", "fraction", "message"} <= set(doc["findings"][0])
    assert doc["matmul"]["fp32_flops"] > 0 and doc["matmul"]["bf16_flops"] > 0
    assert any(f["kind"] == "precision" for f in doc["findings"])
    with ExperienceBank.open(url) as bank:
        run = bank.get_run(doc["run_id"])
        entry = bank.latest_baseline(run.workload, run.hardware)
        assert entry.payload["noise"]["mde"] == doc["noise"]["mde"]
        assert entry.payload["baseline_step_s"] == doc["baseline_step_s"]
        assert {r.trial_id for r in bank.trials(doc["run_id"])} == set(doc["records"])
        assert all(r.phase_times_s for r in bank.trials(doc["run_id"]))


def test_one_stalled_step_does_not_set_the_noise_floor():
    """A trial is its median step; a single 3x stall (a GC pause) must not inflate the MDE."""

    from infrarsi.doctor.noise import noise_model

    rng = random.Random(0)
    quiet = [[0.2 * math.exp(rng.gauss(0, 0.02)) for _ in range(5)] for _ in range(3)]
    stalled = [list(s) for s in quiet]
    stalled[1][2] *= 3.0
    a, b = noise_model(quiet), noise_model(stalled)
    assert b["within_cv"] < 2 * max(a["within_cv"], 0.02)
    assert b["mde"] < 0.2
    # on plain normal jitter the robust estimate is the SD (consistent), not a fraction of it
    many = [[math.exp(rng.gauss(0, 0.05)) for _ in range(40)] for _ in range(5)]
    assert noise_model(many)["within_cv"] == pytest.approx(0.05, rel=0.2)


@pytest.mark.parametrize("example, seeding", [
    ("nanogpt", r"ctx\.generator\(step\)"),
    ("nanogpt_loop", r"torch\.manual_seed\(0\).*random\.seed\(0\).*"
                     r"generator=torch\.Generator\(\)\.manual_seed\(0\)"),
])
def test_nondeterministic_user_data_is_told_how_to_seed_it(tmp_path, example, seeding):
    """A user's job (adapter or own loop) whose baseline does not reproduce its loss: the
    refusal says how to seed their data, the usual cause, for the way in they use."""
    import shutil

    from infrarsi.contract import load_task, lock

    ws = tmp_path / example
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / example, ws,
                    ignore=shutil.ignore_patterns("__pycache__"))
    spec = load_task(ws / "infrarsi.yaml")
    trace = [4.2] * spec.loss_reference.steps
    contract = lock(spec, baseline_config={"num_workers": 1}, loss_trace=trace,
                    model_stats={"shape": {"num_layers": 2, "seq_len": 64},
                                 "tokens_per_step": 512, "num_params": 1000})
    run_dir = tmp_path / "run"
    contract.save(run_dir)
    good = _ok_record_dict("x", config={"num_workers": 1, "precision": "fp32"}, loss_trace=trace)
    drift = {**good, "status": "rejected", "loss_trace": [4.2, 4.5] + trace[2:],
             "error_message": "loss drifted at step 1: 4.500000 vs reference 4.200000"}
    with pytest.raises(BaselineUnusableError, match="non-deterministic.*" + seeding):
        run_doctor(run_dir, repeats=3, bank_url=f"sqlite:///{tmp_path / 'b.sqlite'}",
                   backend=_FakeBackend(spec, [good, drift]), out=lambda s: None)


def test_cpu_mfu_divides_by_the_faster_measured_matmul_so_a_bf16_config_is_not_near_100():
    """Every config is divided by the processor's best measured matmul speed (one denominator, as
    GPU MFU uses one datasheet peak); against the slower fp32 peak a bf16 run read ~99%."""
    from infrarsi.doctor.mfu import compute_mfu
    from infrarsi.doctor.stage import _best_cpu_peak

    matmul = {"fp32_flops": 1.0e10, "bf16_flops": 2.0e10}
    kw = {"step_s": 1.0, "tokens_per_step": 1000, "flops_per_token": 1.9e7, "num_workers": 1,
          "device": "cpu"}
    best = compute_mfu(**kw, **_best_cpu_peak(matmul))
    assert best["peak_flops"] == 2.0e10 and best["mfu"] == pytest.approx(0.95)
    assert "bf16" in best["peak_label"]
    slower_bf16 = compute_mfu(**kw, **_best_cpu_peak({**matmul, "bf16_flops": 0.5e10}))
    assert slower_bf16["peak_flops"] == 1.0e10 and "fp32" in slower_bf16["peak_label"]
    assert _best_cpu_peak(None) == {}
