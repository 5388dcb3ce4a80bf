"""Tensor, sequence and pipeline parallel layouts: the plan derived from a model's linear layers,
the legality rules (each naming its fix), the physics reading the same knobs, and real 2-rank
gloo trials held to the contract's loss check against one rank (slow: spawned ranks)."""

from __future__ import annotations

import pytest
import torch
from test_harness import WORKSPACE, payload, run, tiny_spec
from torch import nn

from infrarsi.contract.spec import TaskSpec
from infrarsi.harness.layout import Layout
from infrarsi.harness.pipeline import Stage, stage_bounds
from infrarsi.harness.tensor_parallel import (
    _permute_fused,
    projection_groups,
    tensor_parallel_plan,
    unpermute_fused,
)
from infrarsi.models.physics import layout
from infrarsi.workloads import build_torch_space
from infrarsi.workloads.knobs import derived


def _build(spec: TaskSpec) -> nn.Module:
    from infrarsi.harness._workspace import load_entry
    from infrarsi.harness.stats import shape_dict

    with load_entry(str(WORKSPACE), spec.workload.entry) as entry:
        return entry.build_model(shape_dict(spec), {"rank": 0, "world_size": 1,
                                                    "expert_parallel_degree": 1, "group": None})


# ---- the plan, from the model's linear layers ------------------------------------------------


def test_plan_reads_roles_off_the_linear_layers():
    groups = {g.path: g for g in projection_groups(_build(tiny_spec()))}
    attn, mlp = groups["layers.0.attn"], groups["layers.0.mlp"]
    assert (attn.inputs, attn.output, attn.fused) == (["wqkv"], "wo", {"wqkv": 3})
    assert (mlp.inputs, mlp.output, mlp.fused) == (["w1", "w3"], "w2", {})
    moe = {g.path for g in projection_groups(_build(tiny_spec("moe")))}
    assert "layers.1.mlp.experts.3" in moe and "layers.1.mlp" not in moe  # router stays whole


def test_plan_for_a_users_model_with_separate_projections():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads = 4
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(16, 16) for _ in range(3))
            self.o_proj = nn.Linear(16, 16)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 16)
            self.layers = nn.ModuleList([nn.ModuleDict({"norm": nn.LayerNorm(16), "attn": Attn()})])
            self.lm_head = nn.Linear(16, 32)

    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = tensor_parallel_plan(Model(), sequence_parallel=True)
    assert all(isinstance(plan[f"layers.0.attn.{n}_proj"], ColwiseParallel) for n in "qkv")
    assert isinstance(plan["layers.0.attn.o_proj"], RowwiseParallel)
    assert isinstance(plan["layers.0.norm"], SequenceParallel)
    assert isinstance(plan["layers.0.attn"], PrepareModuleInput)
    assert isinstance(plan["embed"], RowwiseParallel) and isinstance(plan["lm_head"], ColwiseParallel)


def test_fused_projection_rows_permute_per_rank_and_back():
    lin = nn.Linear(4, 12, bias=True)
    w = lin.weight.detach().clone()
    _permute_fused(lin, chunks=3, tp=2)
    # rank 0's shard (first 6 rows) holds q, k and v rows 0-1 of each chunk
    assert torch.equal(lin.weight[:6], torch.cat([w[0:2], w[4:6], w[8:10]]))
    assert torch.equal(unpermute_fused(lin.weight.detach(), 3, 2), w)


# ---- legality rules ----------------------------------------------------------------------------


def _violations(spec: TaskSpec, **knobs) -> list[str]:
    space = build_torch_space(spec)
    return space.violations(space.normalize({**space.defaults(), "num_workers": 2, **knobs},
                                            check=False))


def test_illegal_layouts_are_refused_with_the_fix():
    spec = tiny_spec(gbs=4)
    odd = TaskSpec.from_dict({**spec.to_dict(), "workload": {
        **spec.to_dict()["workload"], "shape": {**spec.to_dict()["workload"]["shape"], "num_heads": 1,
                                                "hidden_size": 32}}})
    assert "divides the number of attention heads" in " ".join(
        _violations(odd, tensor_parallel_degree=2))
    assert "exceed num_layers 2" in " ".join(_violations(
        spec, pipeline_parallel_degree=2, pipeline_schedule="interleaved_1f1b"))
    assert "use pipeline_schedule=gpipe" in " ".join(_violations(
        spec, pipeline_parallel_degree=2, micro_batch_size=4))
    assert "does not divide num_workers 1" in " ".join(_violations(
        spec, num_workers=1, tensor_parallel_degree=2))
    assert _violations(spec, tensor_parallel_degree=2, sequence_parallel=True) == []
    for sched in ("gpipe", "1f1b"):
        assert _violations(spec, pipeline_parallel_degree=2, pipeline_schedule=sched) == []
    moe = tiny_spec("moe")
    assert "set expert_parallel_degree=1" in " ".join(
        _violations(moe, tensor_parallel_degree=2, expert_parallel_degree=2))


def test_data_parallel_knobs_are_inactive_without_data_parallel_replicas():
    space = build_torch_space(tiny_spec())
    c = space.normalize({**space.defaults(), "num_workers": 2, "tensor_parallel_degree": 2,
                         "data_parallel": "fsdp", "bucket_cap_mb": 100})
    assert (c["data_parallel"], c["bucket_cap_mb"]) == ("ddp", 25)  # inactive: back to default
    assert derived(c, 4) == {"per_rank_batch": 4, "gradient_accumulation_steps": 4}
    assert Layout.from_config(c, 2).dp == 1


def test_physics_reads_the_real_layout_knobs_as_a_tables():
    real = {"num_workers": 8, "tensor_parallel_degree": 2, "pipeline_parallel_degree": 2,
            "pipeline_schedule": "interleaved_1f1b", "num_virtual_pipeline_stages": 2,
            "micro_batch_size": 1}
    table = {"data_parallel_degree": 2, "tensor_parallel_degree": 2, "pipeline_parallel_degree": 2,
             "pipeline_schedule": "interleaved_1f1b", "num_virtual_pipeline_stages": 2,
             "micro_batch_size": 1}
    assert layout(real) == layout(table)
    assert layout(real)["dp"] == 2


def test_stage_bounds_and_stage_names():
    assert stage_bounds(5, 2) == [(0, 3), (3, 5)]
    with pytest.raises(Exception, match="lower pipeline_parallel_degree"):
        stage_bounds(2, 4)
    model = _build(tiny_spec())
    pre, post = list(model.named_children())[:1], list(model.named_children())[2:]
    whole = Stage(pre, list(enumerate(model.layers)), post)
    assert sorted(whole.names.values()) == sorted(n for n, _ in model.named_parameters())
    tokens = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        assert torch.allclose(whole(tokens)[0], model(tokens)[0])


# ---- real 2-rank trials (spawned gloo ranks) -------------------------------------------------

LAYOUTS = [
    pytest.param("dense", {"tensor_parallel_degree": 2}, id="tp2"),
    pytest.param("dense", {"tensor_parallel_degree": 2, "sequence_parallel": True}, id="tp2-sp"),
    pytest.param("moe", {"tensor_parallel_degree": 2, "sequence_parallel": True}, id="moe-tp2-sp"),
    pytest.param("dense", {"pipeline_parallel_degree": 2, "pipeline_schedule": "gpipe"},
                 id="pp2-gpipe"),
    pytest.param("dense", {"pipeline_parallel_degree": 2, "pipeline_schedule": "1f1b"},
                 id="pp2-1f1b"),
    pytest.param("dense4", {"pipeline_parallel_degree": 2, "pipeline_schedule": "interleaved_1f1b"},
                 id="pp2-interleaved"),
    pytest.param("moe", {"pipeline_parallel_degree": 2, "pipeline_schedule": "1f1b"}, id="moe-pp2"),
    # Compiled blocks take the embedding's async all-reduce (reduce-scatter with SP) as input.
    pytest.param("dense", {"tensor_parallel_degree": 2, "compile": "default"}, id="tp2-compile"),
    pytest.param("dense", {"tensor_parallel_degree": 2, "sequence_parallel": True,
                           "compile": "default"}, id="tp2-sp-compile"),
]


def _spec(kind: str) -> TaskSpec:
    if kind != "dense4":
        return tiny_spec(kind)
    d = tiny_spec().to_dict()
    d["workload"]["shape"]["num_layers"] = 4
    return TaskSpec.from_dict(d)


@pytest.mark.slow
@pytest.mark.parametrize("kind,knobs", LAYOUTS)
def test_two_rank_layout_passes_the_loss_check(kind, knobs):
    from infrarsi.contract.contract import lock
    from infrarsi.harness._local import run_local

    spec = _spec(kind)
    one = run(spec, micro_batch_size=1)  # the baseline: one rank, the whole model
    contract = lock(spec, baseline_config={}, loss_trace=one["loss_trace"], model_stats=one)
    results = run_local(payload(spec, num_workers=2, micro_batch_size=1, **knobs), 2)
    assert all(isinstance(r, dict) for r in results), results
    assert results[0]["loss_trace"] == results[1]["loss_trace"]
    assert contract.check_work(results[0]["tokens_per_step"]) is None  # the same work per step
    assert contract.check_loss(results[0]["loss_trace"], "fp32") is None
    assert results[0]["num_params"] == one["num_params"]
    assert results[0]["loss_trace"] == pytest.approx(one["loss_trace"], rel=1e-4)


@pytest.mark.slow
def test_two_rank_compiled_tp_trial_with_the_searchs_fast_knobs():
    """The combination every tp2 trial of a cpu_dense run crashed on ('Tensor' object has no
    attribute '_local_tensor' in backward): compiled blocks, bf16, fused AdamW, micro-batch 2."""
    from infrarsi.contract.contract import lock
    from infrarsi.harness._local import run_local

    spec = tiny_spec()
    one = run(spec, micro_batch_size=1)
    contract = lock(spec, baseline_config={}, loss_trace=one["loss_trace"], model_stats=one)
    knobs = {"tensor_parallel_degree": 2, "micro_batch_size": 2, "precision": "bf16",
             "compile": "max-autotune-no-cudagraphs", "optimizer_impl": "fused"}
    results = run_local(payload(spec, num_workers=2, **knobs), 2)
    assert all(isinstance(r, dict) for r in results), results
    assert contract.check_loss(results[0]["loss_trace"], "bf16") is None


# ---- real Ray Train trials (cpu_dense, 2 workers, gloo) --------------------------------------


@pytest.mark.slow
def test_ray_train_layout_trials_pass_the_contract(tmp_path, ray_local):
    from conftest import copy_task

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.backends.ray_train._pool import shutdown_process_pool
    from infrarsi.init_stage import init_task

    contract, _, baseline = init_task(copy_task(tmp_path, **{"timing.measured_steps": 2}))
    backend = RayTrainBackend(contract.spec(), contract=contract)
    try:
        for knobs in ({"tensor_parallel_degree": 2, "sequence_parallel": True},
                      {"pipeline_parallel_degree": 2, "pipeline_schedule": "1f1b"}):
            rec = backend.execute({**backend.baseline_config(), "num_workers": 2, **knobs})
            assert rec.ok, (knobs, rec.error_message)  # the backend applied the loss check
            assert rec.tokens_per_step == baseline.tokens_per_step
            assert {k: rec.config[k] for k in knobs} == knobs
    finally:
        shutdown_process_pool()


@pytest.mark.parametrize("task", ["cpu_dense", "cpu_moe"])
def test_reference_cpu_tasks_search_the_layout_knobs(task):
    from conftest import TASKS

    from infrarsi.contract import load_task
    from infrarsi.search._progress import layout_label

    space = build_torch_space(load_task(TASKS / f"{task}.yaml"))
    for name in ("tensor_parallel_degree", "sequence_parallel", "pipeline_parallel_degree",
                 "pipeline_schedule"):
        assert len(space.knob(name).values) > 1, name
    base = space.defaults()
    labels = {layout_label(c) for c in space.neighbours({**base, "num_workers": 2})}
    labels |= {layout_label(c) for c in space.neighbours(
        space.normalize({**base, "num_workers": 2, "pipeline_parallel_degree": 2}))}
    assert {"tp2", "pp2:1f1b", "pp2:gpipe", "pp2:i1f1bx2"} <= labels
