"""The reference workloads (the user's workspace) and the shipped task specs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from infrarsi.contract import load_task
from infrarsi.harness import model_stats
from infrarsi.harness._workspace import load_entry
from infrarsi.workloads import build_torch_space

ROOT = Path(__file__).resolve().parents[1]
WORKSPACE = ROOT / "infrarsi" / "workloads" / "reference"
SHAPE = dict(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, ffn_hidden_size=48,
             num_experts=0, top_k=0, aux_loss_weight=0.01, seq_len=16, family="dense")
MOE = {**SHAPE, "num_experts": 4, "top_k": 2, "family": "moe"}
SOLO = {"rank": 0, "world_size": 1, "expert_parallel_degree": 1, "group": None}


def build(shape: dict, seed: int = 0):
    with load_entry(WORKSPACE) as entry:
        torch.manual_seed(seed)
        return entry.build_model(shape, SOLO)


@pytest.mark.parametrize("shape", [SHAPE, MOE], ids=["dense", "moe"])
def test_forward_interface_and_causality(shape):
    model = build(shape)
    assert isinstance(model.layers, torch.nn.ModuleList) and len(model.layers) == 2
    tokens = torch.randint(0, 128, (3, 16))
    logits, aux = model(tokens)
    assert logits.shape == (3, 16, 128) and aux.dim() == 0
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 128
    logits2, _ = model(changed)
    torch.testing.assert_close(logits[:, :10], logits2[:, :10])
    assert not torch.allclose(logits[:, 10:], logits2[:, 10:])


def test_dense_has_no_aux_loss_and_moe_has_one():
    tokens = torch.randint(0, 128, (2, 16))
    assert build(SHAPE)(tokens)[1].item() == 0.0
    aux = build(MOE)(tokens)[1].item()
    assert 0.5 < aux < 8  # 1 per layer when perfectly balanced


def test_attention_matches_sdpa_with_causal_mask():
    from_ws = build(SHAPE)
    attn = from_ws.layers[0].attn
    x = torch.randn(2, 16, 32)
    B, T, C = x.shape
    q, k, v = attn.wqkv(x).split(C, dim=-1)
    hd = attn.head_dim

    def heads(t):
        return t.view(B, T, attn.num_heads, hd).transpose(1, 2)

    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    f = torch.outer(torch.arange(T).float(), inv)
    cos, sin = f.cos(), f.sin()

    def rope(t):
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)

    ref = F.scaled_dot_product_attention(rope(heads(q)), rope(heads(k)), heads(v), is_causal=True)
    ref = attn.wo(ref.transpose(1, 2).reshape(B, T, C))
    torch.testing.assert_close(attn(x), ref, rtol=1e-4, atol=1e-5)


def test_moe_aux_loss_is_per_sequence_mean():
    model = build(MOE)
    mlp = model.layers[0].mlp
    x = torch.randn(4, 16, 32)
    _, aux = mlp(x)
    parts = [mlp(x[i:i + 1])[1] for i in range(4)]
    torch.testing.assert_close(aux, torch.stack(parts).mean())


def test_every_expert_gets_a_gradient_even_without_tokens():
    model = build(MOE)
    mlp = model.layers[0].mlp
    with torch.no_grad():
        mlp.router.weight.zero_()
        mlp.router.weight[0] = 10.0  # route everything to experts 0 and (ties) the next
    tokens = torch.randint(0, 128, (2, 16))
    logits, aux = model(tokens)
    (logits.sum() + aux).backward()
    assert all(p.grad is not None for p in model.expert_parameters())
    assert len(model.expert_parameters()) == 2 * 4 * 3


def test_initialization_is_identical_for_every_ep_degree():
    with load_entry(WORKSPACE) as entry:
        torch.manual_seed(3)
        full = entry.build_model(MOE, SOLO)
        torch.manual_seed(3)
        half = entry.build_model(MOE, {"rank": 1, "world_size": 2, "expert_parallel_degree": 2,
                                       "group": None})
    full_experts = list(full.layers[0].mlp.experts)
    local = list(half.layers[0].mlp.experts)
    assert len(local) == 2
    for mine, ref in zip(local, full_experts[2:], strict=True):
        torch.testing.assert_close(mine.w1.weight, ref.w1.weight)
    torch.testing.assert_close(half.tok_emb.weight, full.tok_emb.weight)


def test_workspace_imports_are_isolated():
    import sys

    with load_entry(WORKSPACE) as a, load_entry(WORKSPACE) as b:
        assert a is not b and a.__name__ != b.__name__
    assert not [m for m in sys.modules if m.startswith("_infrarsi_ws_")]


def test_model_stats_counts_on_meta_device():
    stats = model_stats(load_task(ROOT / "configs" / "tasks" / "cpu_dense.yaml").to_dict())
    spec = load_task(ROOT / "configs" / "tasks" / "cpu_dense.yaml")
    s = spec.workload.shape
    per_layer = 4 * s.hidden_size**2 + 3 * s.hidden_size * s.ffn_hidden_size + 2 * s.hidden_size
    expected = s.num_layers * per_layer + 2 * s.vocab_size * s.hidden_size + s.hidden_size
    assert stats["num_params"] == expected
    non_emb = expected - s.vocab_size * s.hidden_size
    attn = 12 * s.num_layers * s.hidden_size * spec.workload.seq_len
    assert stats["flops_per_token"] == 6 * non_emb + attn


@pytest.mark.parametrize("name", ["cpu_dense", "cpu_moe", "gpu_dense", "gpu_moe"])
def test_task_specs_load_and_their_baseline_is_legal(name):
    spec = load_task(ROOT / "configs" / "tasks" / f"{name}.yaml")
    space = build_torch_space(spec)
    space.validate(space.defaults())
    stats = model_stats(spec.to_dict())
    assert stats["num_params"] > 0 and math.isfinite(stats["flops_per_token"])
    if name == "gpu_dense":
        assert 0.8e9 < stats["num_params"] < 1.6e9 and spec.workload.seq_len == 2048
