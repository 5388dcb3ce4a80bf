"""Feature encoding, StepTimeModel calibration and priors, prior revision records."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from infrarsi.errors import ModelFallbackWarning
from infrarsi.models import (
    FeatureEncoder,
    KnobPrior,
    PeakMemoryModel,
    StepTimeModel,
    coef_prior,
    revise_priors,
)
from infrarsi.space import Knob, SearchSpace
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

WL = WorkloadSignature("dense", 1_000_000, 4, 128, 4, 256, 32, name="tiny")
HW = HardwareFingerprint("cpu", 8 * 2**30, 2)


def space() -> SearchSpace:
    return SearchSpace((
        Knob("micro_batch_size", (1, 2, 4, 8), 2, "ordinal"),
        Knob("activation_checkpointing", ("none", "selective", "full"), "none", "categorical"),
        Knob("zero", (0, 1), 0, "ordinal"),
        Knob("bucket_cap_mb", (5, 25), 25, "ordinal",
             active_if=lambda c: c.get("activation_checkpointing") == "none"),
        Knob("fused_patch", (False, True), False, "bool"),
    ))


# ---- encoding --------------------------------------------------------------------------------

def test_encoder_columns_follow_knob_declarations():
    enc = FeatureEncoder(space()).fit()
    names = list(enc.feature_names_out_)
    assert names[:7] == ["log2_micro_batch_size", "activation_checkpointing=selective",
                         "activation_checkpointing=full", "zero", "log2_bucket_cap_mb",
                         "fused_patch", "wl_moe"][:7]
    X = enc.transform([{"micro_batch_size": 8, "activation_checkpointing": "full", "zero": 1,
                        "bucket_cap_mb": 5, "fused_patch": True}], WL, HW)
    assert X.shape == (1, enc.n_features_out_)
    assert X[0, 0] == 2.0  # log2(8 / 2): centred on the default
    assert X[0, 1] == 0.0 and X[0, 2] == 1.0
    assert X[0, 3] == 1.0
    assert X[0, 4] == 0.0  # inactive under checkpointing -> read at its default
    assert X[0, 5] == 1.0
    np.testing.assert_allclose(X[0, 6:15], WL.vector())
    np.testing.assert_allclose(X[0, 15:19], HW.vector())
    # then the napkin physics of this config on WL and HW: its memory estimate, no pipeline,
    # its communication over compute
    assert list(enc.feature_names_out_[19:]) == ["phys_log2_mem_gib", "phys_log_bubble",
                                                 "phys_log_comm", "phys_log_s_per_token"]
    assert np.isfinite(X[0, 21]) and X[0, 21] >= 0.0
    assert np.isnan(enc.transform([{}], WL, None)[0, 21])  # no hardware: no link to judge
    heavy = enc.transform([{"micro_batch_size": 8}], WL, HW)[0, 19]
    light = enc.transform([{"micro_batch_size": 1, "activation_checkpointing": "full",
                            "zero": 1}], WL, HW)[0, 19]
    assert heavy > light and X[0, 20] == 0.0
    # the default config encodes to zeros in every knob column
    assert not enc.transform([{}], WL, HW)[0, :6].any()


def test_encoder_unfitted_and_records_path():
    enc = FeatureEncoder(space())
    with pytest.raises(NotFittedError):
        enc.transform([{}])
    enc.fit()
    recs = [
        TrialRecord("a", {"micro_batch_size": 4}, TrialStatus.OK, "table", WL, HW,
                    step_times_s=(0.5, 0.6, 0.5), peak_memory_bytes=(3 * 2**30, 2**30)),
        TrialRecord("b", {"micro_batch_size": 8}, TrialStatus.OOM, "table", WL, HW,
                    memory_capacity_bytes=8 * 2**30, memory_censor_bytes=8 * 2**30),
    ]
    X, y = enc.time_dataset(recs)
    assert X.shape[0] == 1 and y[0] == pytest.approx(math.log(0.5))
    Xm, mem, obs = enc.memory_dataset(recs)
    assert list(obs) == [True, False] and mem[1] == 8 * 2**30 and Xm[1, 0] == 2.0
    # no workload given -> NaN columns, which the models read as the prior's reference (0)
    assert np.isnan(enc.transform([{}])[0, -1])


def test_setting_delta_and_coef_prior():
    enc = FeatureEncoder(space(), workload_keys=False, hardware_keys=False).fit()
    np.testing.assert_allclose(enc.setting_delta("micro_batch_size", 8)[:1], [2.0])
    priors = [KnobPrior("micro_batch_size", 8, log_time_effect=-0.2, log_time_std=0.1),
              KnobPrior("micro_batch_size", 4, log_time_effect=-0.1, log_time_std=0.1),
              KnobPrior("activation_checkpointing", "full", log_time_effect=0.3)]
    m, s = coef_prior(enc, priors, "time")
    assert m[0] == pytest.approx(-0.1)  # both say -0.1 per doubling
    assert s[0] < 0.1  # two consistent priors: tighter than each
    assert m[2] == pytest.approx(0.3) and s[3] == 1.0


# ---- step time -------------------------------------------------------------------------------

def synthetic(n: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 4))
    f = 0.5 + X @ np.array([0.4, -0.3, 0.1, 0.0]) + 0.3 * np.sin(2 * X[:, 0]) * X[:, 1]
    return X, f + 0.05 * rng.normal(size=n)


@pytest.mark.parametrize("residual", ["gp", "none"])
def test_step_time_80pct_interval_is_calibrated(residual):
    X, y = synthetic(150, 0)
    Xt, yt = synthetic(600, 1)
    m = StepTimeModel(residual=residual).fit(X, y)
    mu, sd = m.predict(Xt, return_std=True)
    cover = float(np.mean(np.abs(yt - mu) <= 1.2816 * sd))
    assert 0.7 <= cover <= 0.92, cover
    if residual == "gp":  # the residual earns its keep
        lin = StepTimeModel(residual="none").fit(X, y).predict(Xt)
        assert np.mean((mu - yt) ** 2) < 0.5 * np.mean((lin - yt) ** 2)


def test_step_time_prior_moves_with_few_and_yields_to_many():
    enc = FeatureEncoder(space(), workload_keys=False, hardware_keys=False).fit()
    wrong = [KnobPrior("fused_patch", True, log_time_effect=-0.5, log_time_std=0.1, source="llm")]
    rng = np.random.default_rng(3)

    def data(n):
        cfgs = [{"micro_batch_size": int(rng.choice([1, 2, 4, 8])),
                 "fused_patch": bool(rng.integers(2))} for _ in range(n)]
        X = enc.transform(cfgs)
        return X, 0.1 * X[:, 0] + 0.2 * X[:, 5] + 0.03 * rng.normal(size=n)  # truth: +0.2

    j = 5
    Xf, yf = data(3)
    few = StepTimeModel.from_priors(enc, wrong).fit(Xf, yf)
    Xm, ym = data(300)
    many = StepTimeModel.from_priors(enc, wrong).fit(Xm, ym)
    assert few.coef_posterior()[0][j] < -0.2
    assert abs(many.coef_posterior()[0][j] - 0.2) < 0.03
    recs = revise_priors(wrong, enc, time_model=many)
    assert len(recs) == 1 and recs[0].flagged and recs[0].evidence_n > 100
    assert recs[0].source == "llm" and recs[0].target == "time"
    good = [KnobPrior("fused_patch", True, log_time_effect=0.15, log_time_std=0.1)]
    assert not revise_priors(good, enc, StepTimeModel.from_priors(enc, good).fit(Xm, ym))[0].flagged


def test_step_time_unseen_configs_extrapolate_loglinearly():
    enc = FeatureEncoder(space(), workload_keys=False, hardware_keys=False).fit()
    cfgs = [{"micro_batch_size": v} for v in (1, 2, 4) for _ in range(4)]
    X = enc.transform(cfgs)
    y = -0.3 * X[:, 0] + 0.01 * np.random.default_rng(0).normal(size=len(X))
    m = StepTimeModel().fit(X, y)
    mu, sd = m.predict(enc.transform([{"micro_batch_size": 8}]), return_std=True)
    assert mu[0] == pytest.approx(-0.6, abs=0.1)  # never seen, on the trend
    _, sd_seen = m.predict(enc.transform([{"micro_batch_size": 2}]), return_std=True)
    assert sd[0] > sd_seen[0]  # and less sure than where it has data


def test_step_time_degenerate_inputs_fall_back():
    enc = FeatureEncoder(space(), workload_keys=False, hardware_keys=False).fit()
    prior = [KnobPrior("micro_batch_size", 8, log_time_effect=-0.2)]
    with pytest.warns(ModelFallbackWarning, match="no ok trial"):
        m = StepTimeModel.from_priors(enc, prior).fit(np.zeros((0, 6)), np.zeros(0))
    mu, sd = m.predict(enc.transform([{"micro_batch_size": 8}]), return_std=True)
    assert mu[0] == pytest.approx(-0.2) and sd[0] > 1
    X = enc.transform([{"micro_batch_size": v} for v in (1, 2, 4, 8)])
    with pytest.warns(ModelFallbackWarning, match="dropped 1"):
        m = StepTimeModel().fit(X, [0.1, np.nan, -0.1, -0.2])
    assert np.isfinite(m.predict(X, return_std=True)[1]).all()
    with warnings.catch_warnings():  # constant features and a single row: no error, no warning
        warnings.simplefilter("error")
        StepTimeModel().fit(X[:1], [0.3]).predict(X)


def test_step_time_sklearn_conventions():
    with pytest.raises(NotFittedError):
        StepTimeModel().predict(np.zeros((1, 2)))
    m = clone(StepTimeModel(residual="none", max_gp_points=50))
    assert m.get_params()["max_gp_points"] == 50
    X, y = synthetic(30, 4)
    assert m.fit(X, y) is m and hasattr(m, "coef_mean_")
    with pytest.raises(ValueError, match="residual"):
        StepTimeModel(residual="boost").fit(X, y)


def test_memory_revision_record_from_the_memory_model():
    enc = FeatureEncoder(space(), workload_keys=False, hardware_keys=False).fit()
    rng = np.random.default_rng(5)
    cfgs = [{"activation_checkpointing": str(rng.choice(["none", "full"]))} for _ in range(60)]
    X = enc.transform(cfgs)
    logm = np.log(30) - 0.6 * X[:, 2] + 0.05 * rng.normal(size=60)
    bad = [KnobPrior("activation_checkpointing", "full", log_mem_effect=0.2, log_mem_std=0.1)]
    m = PeakMemoryModel.from_priors(enc, bad).fit(X, np.exp(logm))
    (r,) = revise_priors(bad, enc, memory_model=m)
    assert r.target == "memory" and r.flagged and r.posterior_mean < -0.3
    assert r.to_dict()["knob"] == "activation_checkpointing"


def test_crash_model_learns_a_conjunction_no_single_feature_explains():
    from infrarsi.models.crash import CrashModel

    rng = np.random.default_rng(0)
    X = rng.integers(0, 2, size=(300, 6)).astype(float)
    crashed = X[:, 0] * X[:, 1] * X[:, 2]  # crashes only when the three are on together
    m = CrashModel(random_state=0).fit(X, crashed)
    probe = np.array([[1, 1, 1, 0, 1, 0], [1, 1, 0, 0, 1, 0], [1, 0, 1, 1, 0, 1],
                      [0, 1, 1, 1, 1, 1]], dtype=float)
    p = m.p_crash(probe)
    assert p[0] > 0.8
    assert (p[1:] < 0.1).all()


def test_crash_model_without_crashes_blames_nothing_and_cluster_faults_are_no_evidence():
    from infrarsi.models.crash import CrashModel, crash_dataset, crash_label

    X = np.random.default_rng(1).normal(size=(20, 3))
    m = CrashModel().fit(X, np.zeros(20))
    assert (m.p_crash(X) == 0).all()
    with pytest.raises(ValueError, match="features"):
        m.p_crash(np.zeros((2, 4)))

    def rec(status, kind=None):
        return TrialRecord(trial_id="t", config={}, backend="x", workload=WL, hardware=HW,
                           status=status, error_kind=kind,
                           error_message="boom" if kind else "")

    assert crash_label(rec(TrialStatus.ERROR, ErrorKind.COMPILE)) == 1
    assert crash_label(rec(TrialStatus.ERROR, ErrorKind.WORKER_LOST)) is None
    assert crash_label(rec(TrialStatus.OOM)) == 0
    rows, y = crash_dataset([rec(TrialStatus.OK), rec(TrialStatus.ERROR, ErrorKind.COMMUNICATION),
                             rec(TrialStatus.ERROR, ErrorKind.CRASH)])
    assert len(rows) == 2 and list(y) == [0, 1]


def test_step_time_prior_scale_by_evidence_trusts_a_prior_the_data_bear_out_and_not_one_they_refute():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    prior = np.array([0.5, -0.3, 0.2])
    agree = X @ prior + rng.normal(0, 0.02, 12)
    refute = X @ np.array([-1.5, 1.2, 0.9]) + rng.normal(0, 0.02, 12)
    kw = dict(prior_mean=prior, prior_std=np.full(3, 0.1), residual="none",
              prior_scales=(0.5, 1.0, 4.0, 16.0))
    assert StepTimeModel(**kw).fit(X, agree).prior_scale_ <= 1.0
    m = StepTimeModel(**kw).fit(X, refute)
    assert m.prior_scale_ >= 4.0
    fixed = StepTimeModel(**{**kw, "prior_scales": (1.0,)}).fit(X, refute)
    err = lambda model: np.abs(model.predict(X) - refute).mean()  # noqa: E731
    assert err(m) < err(fixed)


def test_step_time_evidence_weighs_experience_the_trials_bear_out_above_one_they_refute():
    """The search averages experience's model with the cold one by this evidence (see
    Fitter._trust_experience): a ranking the own trials contradict must lose its weight."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(5, 3))
    truth = np.array([0.6, -0.4, 0.3])
    y = X @ truth + rng.normal(0, 0.02, 5)
    right, wrong = X @ truth, X @ -truth  # what two experiences predict for these trials

    def evidence(offset):
        m = StepTimeModel(default_prior_std=0.3, residual="none", prior_scales=(0.5, 1.0, 2.0))
        return m.fit(X, y - offset).log_evidence_

    cold = StepTimeModel(default_prior_std=1.0, residual="none").fit(X, y).log_evidence_
    assert evidence(right) > cold > evidence(wrong)


def test_physics_estimates_follow_the_textbook_layouts():
    from infrarsi.models.physics import memory_estimate_bytes, pipeline_bubble

    wl = WorkloadSignature("dense", 8_000_000_000, 32, 4096, 32, 4096, 256, vocab_size=128_256)
    base = {"data_parallel_degree": 8, "micro_batch_size": 1, "zero_stage": 0}
    m0 = memory_estimate_bytes(base, wl)
    # 16 bytes of Adam state per parameter unsharded: 128 GB of states alone at 8B params
    assert 128e9 < m0 < 200e9
    # ZeRO-1 shards the 12 optimizer bytes over dp: states 8B * (2 + 2 + 12/8) = 44 GB, not 128
    assert memory_estimate_bytes({**base, "zero_stage": 1}, wl) == pytest.approx(m0 - 84e9)
    # tensor parallelism divides states and activations alike
    assert memory_estimate_bytes({**base, "tensor_parallel_degree": 8}, wl) < m0 / 7
    # the table's short names are the same roles
    assert memory_estimate_bytes({"dp": 8, "mbs": 1, "zero": 1}, wl) == pytest.approx(
        memory_estimate_bytes({**base, "zero_stage": 1}, wl))
    # 1F1B bubble: (pp - 1) / micro-batches, interleaving divides it by the virtual stages
    pipe = {"data_parallel_degree": 2, "pipeline_parallel_degree": 4, "micro_batch_size": 4}
    assert pipeline_bubble(pipe, wl) == pytest.approx(3 / 32)
    assert pipeline_bubble({**pipe, "pipeline_schedule": "interleaved_1f1b",
                            "num_virtual_pipeline_stages": 2}, wl) == pytest.approx(3 / 64)
    assert pipeline_bubble(base, wl) == 0.0


def test_a_mixture_of_experts_stores_its_mlp_activations_once_per_routed_expert():
    from infrarsi.models.physics import memory_estimate_bytes

    # Mixtral-like: 8 experts of width 14336 per layer, 2 per token
    def moe(top_k):
        return WorkloadSignature("moe", 46_700_000_000, 32, 4096, 32, 4096, 256, num_experts=8,
                                 top_k=top_k, vocab_size=32_000)

    lay = {"data_parallel_degree": 32, "expert_parallel_degree": 8, "micro_batch_size": 4,
           "zero_stage": 1}

    def acts(wl, ac):  # what recompute saves is activations only: states cancel
        return (memory_estimate_bytes({**lay, "activation_checkpointing": ac}, wl)
                - memory_estimate_bytes({**lay, "activation_checkpointing": "full"}, wl))

    # each routed copy holds an expert's input and three SwiGLU intermediates: two experts per
    # token store about twice the MLP activations of one (attention's share is the same)
    assert acts(moe(2), "none") > 1.6 * acts(moe(1), "none")
    # and far more than the dense table's 34 h per token says
    dense = WorkloadSignature("dense", 46_700_000_000, 32, 4096, 32, 4096, 256,
                              vocab_size=32_000)
    assert acts(moe(2), "none") > 1.5 * acts(dense, "none")
    # selective keeps about half of them (the mean of none and full)
    assert acts(moe(2), "selective") == pytest.approx(0.5 * acts(moe(2), "none"), rel=0.1)


def test_communication_estimate_knows_which_groups_leave_the_node():
    from infrarsi.models.physics import communication_ratio

    wl = WorkloadSignature("dense", 8_000_000_000, 32, 4096, 32, 4096, 256, vocab_size=128_256)
    four = HardwareFingerprint("H100-80GB", 80 * 2**30, 8, num_nodes=4,
                               interconnect="nvlink+infiniband", peak_flops=989e12)
    one = HardwareFingerprint("H100-80GB", 80 * 2**30, 8, num_nodes=1, interconnect="nvlink",
                              peak_flops=989e12)

    def ratio(hw, **knobs):
        return communication_ratio({"micro_batch_size": 1, "zero_stage": 1, **knobs}, wl, hw)

    # tensor parallel inside a node is cheap; 16-way spans two nodes and moves at the NIC rate
    assert ratio(four, tp=16, dp=2) > 5 * ratio(four, tp=8, dp=4)
    # ZeRO-3 gathers the weights every micro-batch: far more traffic than a ZeRO-1 step
    assert ratio(four, dp=32, zero_stage=3) > 10 * ratio(four, dp=32)
    # the same layout inside one node's NVLink costs less than across nodes' NICs
    assert ratio(one, dp=8) < ratio(four, dp=8, tp=1, pp=4) * 8
    assert ratio(one, dp=8) < ratio(HardwareFingerprint("H100-80GB", 80 * 2**30, 8, 2,
                                                        "nvlink+infiniband", 989e12), dp=16)
    # a single device communicates nothing
    assert ratio(one, dp=1) == 0.0


def test_physics_columns_carry_their_priors_and_the_expert_rules_are_not_counted_twice():
    from infrarsi.models.physics import PHYSICS_PRIORS

    enc = FeatureEncoder(space()).fit()
    names = list(enc.feature_names_out_)
    mem, bub, mbs = (names.index(n) for n in ("phys_log2_mem_gib", "phys_log_bubble",
                                              "log2_micro_batch_size"))
    expert = KnobPrior("micro_batch_size", 8, log_mem_effect=0.9, source="expert:micro_batch_size")
    measured = KnobPrior("micro_batch_size", 8, log_mem_effect=0.9, source="bank")
    m, s = coef_prior(enc, [expert], "memory")
    assert (m[mem], s[mem]) == PHYSICS_PRIORS["memory", "phys_log2_mem_gib"]
    assert m[mbs] == 0.0 and s[mbs] < 1.0  # the estimate carries it; the std stays
    m, _ = coef_prior(enc, [measured], "memory")
    assert m[mbs] == pytest.approx(0.45)  # a measured effect is kept: 0.9 over log2(8/2)
    m, _ = coef_prior(enc, [expert], "time")
    assert (m[bub], m[mem]) == (1.0, 0.0)
    # without the physics columns the expert rule is the only memory knowledge: kept
    plain = FeatureEncoder(space(), physics=False).fit()
    m, _ = coef_prior(plain, [expert], "memory")
    assert m[list(plain.feature_names_out_).index("log2_micro_batch_size")] == pytest.approx(0.45)


def test_with_the_memory_estimate_a_column_workload_columns_add_little_to_memory():
    """An unseen workload's 80 layers against experience's 32 must not put 48 units of doubt
    on every memory prediction: the estimate carries size, the context columns a little."""
    from infrarsi.models.encoding import CONTEXT_SPANS
    from infrarsi.models.physics import CONTEXT_MEMORY_STD

    enc = FeatureEncoder(space()).fit()
    names = list(enc.feature_names_out_)
    m, s = coef_prior(enc, [], "memory")
    layers = names.index("wl_layers")
    assert m[layers] == 0.0 and s[layers] == pytest.approx(CONTEXT_MEMORY_STD / CONTEXT_SPANS["wl_layers"])
    assert 48 * s[layers] < 0.1
    assert all(s[names.index(n)] <= CONTEXT_MEMORY_STD for n in CONTEXT_SPANS)
    _, s_time = coef_prior(enc, [], "time")
    assert s_time[layers] == 1.0  # time keeps the weak default: the estimate is of memory
    plain = FeatureEncoder(space(), physics=False).fit()
    _, s_plain = coef_prior(plain, [], "memory")
    assert s_plain[list(plain.feature_names_out_).index("wl_layers")] == 1.0


def test_physics_reads_the_torch_workloads_launch_knobs():
    from infrarsi.models.physics import layout

    c = layout({"num_workers": 2, "data_parallel": "fsdp", "micro_batch_size": 4})
    assert (c["dp"], c["zero"], c["mbs"]) == (2, 3, 4)
    assert layout({"data_parallel": "fsdp", "reshard_after_forward": False})["zero"] == 2
    assert layout({"data_parallel": "ddp"})["zero"] == 0


def test_time_is_learned_relative_to_the_compute_estimate_which_carries_across_gpus():
    """The compute estimate scales with the device's peak and the model's size, so a time
    model whose coefficient on it is 1 predicts an A100 run from H100 runs as a ratio; the
    expert micro-batch time rule is not counted on top of the estimate's overhead term."""
    import dataclasses

    from infrarsi.models.physics import PHYSICS_PRIORS, device_seconds_per_token

    h100 = dataclasses.replace(HW, peak_flops=9.89e14)
    a100 = dataclasses.replace(HW, peak_flops=3.12e14)
    wl = WorkloadSignature("dense", 1_235_814_400, 16, 2048, 32, 4096, 256, vocab_size=128256)
    big = dataclasses.replace(wl, num_params=wl.num_params * 4)
    cfg = {"micro_batch_size": 1}
    s_h, s_a = device_seconds_per_token(cfg, wl, h100), device_seconds_per_token(cfg, wl, a100)
    assert 2.0 < s_a / s_h < 9.89 / 3.12  # compute scales by the peak, the overhead does not
    assert 3.0 < device_seconds_per_token(cfg, big, h100) / s_h < 4.0
    # a bigger micro-batch saves overhead, with diminishing returns
    s1, s4, s16 = (device_seconds_per_token({"micro_batch_size": m}, wl, h100) for m in (1, 4, 16))
    assert s1 > s4 > s16 and (s1 - s4) > 3 * (s4 - s16)
    enc = FeatureEncoder(space()).fit()
    names = list(enc.feature_names_out_)
    j, mbs = names.index("phys_log_s_per_token"), names.index("log2_micro_batch_size")
    m, s = coef_prior(enc, [KnobPrior("micro_batch_size", 8, log_time_effect=-0.3,
                                      source="expert:micro_batch_size")], "time")
    assert (m[j], s[j]) == PHYSICS_PRIORS["time", "phys_log_s_per_token"]
    assert m[mbs] == 0.0
    m, _ = coef_prior(enc, [KnobPrior("micro_batch_size", 8, log_time_effect=-0.3, source="bank")],
                      "time")
    assert m[mbs] == pytest.approx(-0.15)  # a measured effect is kept
    m, _ = coef_prior(enc, [], "memory")
    assert m[j] == 0.0
