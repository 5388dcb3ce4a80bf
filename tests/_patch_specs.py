"""Tiny task specs on the reference workspace for the patch and proposer tests."""

from __future__ import annotations

from pathlib import Path

from infrarsi.contract.spec import TaskSpec

WORKSPACE = Path(__file__).resolve().parents[1] / "infrarsi" / "workloads" / "reference"


def tiny_spec(family: str = "dense", workspace: Path = WORKSPACE) -> TaskSpec:
    """Small shapes, 5 timed steps (enough calls for the "cheat after warm-up" patches)."""
    shape = dict(vocab_size=256, hidden_size=32, num_layers=2, num_heads=2, ffn_hidden_size=64)
    if family == "moe":
        shape.update(num_experts=4, top_k=2)
    return TaskSpec.from_dict({
        "name": f"tiny_{family}",
        "workload": {"workspace": str(workspace), "family": family, "seq_len": 32,
                     "global_batch_size": 4, "shape": shape},
        "hardware": {"device": "cpu", "max_workers": 2, "memory_capacity_gib": 1.0},
        "timing": {"warmup_steps": 2, "measured_steps": 3},
        "loss_reference": {"steps": 3, "seed": 7},
    })
