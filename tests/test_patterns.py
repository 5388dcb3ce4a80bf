"""The expert's pattern rules on a plain PyTorch model that is not the reference
(tests/workspaces/plain_lm): each of the four rewrites is found by reading the AST and is
accepted by the contract's verifier (gradients, loss trace, static scan)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _patch_specs import tiny_spec

from infrarsi.patches import verify_patch
from infrarsi.proposers import ExpertProposer, ProposerContext
from infrarsi.proposers._patterns import pattern_patches

PLAIN = Path(__file__).resolve().parent / "workspaces" / "plain_lm"
RULES = ("sdpa", "cached_tables", "batched_dispatch", "host_sync")


def _patches() -> dict[str, object]:
    spec = tiny_spec("dense", PLAIN)
    found = ExpertProposer().patches(ProposerContext(space=None, spec=spec))
    return {p.id.split("-")[1]: p for p in found}


def test_the_four_rewrites_are_proposed_for_a_model_that_is_not_the_reference():
    found = _patches()
    assert sorted(found) == sorted(RULES)
    assert all(p.origin == "expert:pattern" and p.files() == ("net.py",) or
               list(p.files()) == ["net.py"] for p in found.values())
    assert "scaled_dot_product_attention(q, k, v, attn_mask=allowed" in found["sdpa"].diff
    assert "lru_cache" in found["cached_tables"].diff
    assert "torch.argsort(choice, stable=True)" in found["batched_dispatch"].diff
    assert "+        self.busiest = load.max().detach()" in found["host_sync"].diff


def test_rules_leave_code_alone_when_the_pattern_does_not_hold():
    src = '''import torch
import torch.nn.functional as F
from torch import nn


class A(nn.Module):
    def forward(self, q, k, v, x):
        s = (q @ k.transpose(-2, -1)) * 0.1
        p = F.softmax(s, dim=-1)
        self.kept = p          # the probabilities are used: no fused kernel can give them
        y = p @ v
        t = torch.arange(x.shape[1]) * x.sum()   # depends on values: no cache
        self.count = x.sum().item()             # read below: stays
        return y + t + self.count
'''
    assert pattern_patches({"m.py": src}) == []


@pytest.mark.parametrize("rule", RULES)
def test_each_rewrite_is_accepted_by_the_contracts_verifier(rule):
    patch = _patches()[rule]
    verdict = verify_patch(patch, workspace=PLAIN, spec=tiny_spec("dense", PLAIN))
    assert verdict.accepted, (verdict.rule, verdict.reason)
