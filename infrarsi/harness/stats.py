"""Parameter counts and FLOPs per token of a workload (for its signature and MFU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from infrarsi.contract.spec import TaskSpec
from infrarsi.harness._workspace import load_entry


def shape_dict(spec: TaskSpec) -> dict[str, Any]:
    """The ``shape`` argument of ``build_model``: ModelShape fields plus seq_len and family."""
    from dataclasses import asdict

    wl = spec.workload
    return {**asdict(wl.shape), "seq_len": wl.seq_len, "family": wl.family}


def count_stats(model: nn.Module, shape: dict[str, Any], expert_parallel_degree: int = 1
                ) -> dict[str, float]:
    """``num_params`` (all parameters of the full model) and ``flops_per_token``.

    FLOPs per token follow the usual MFU convention (PaLM appendix B): ``6 * N + 12 * L * H * T``
    with N the parameters a token passes through in matmuls (the embedding lookup excluded; for
    MoE only ``top_k / num_experts`` of the experts) and the attention term for L layers, hidden
    size H and sequence length T.
    """
    total = sum(p.numel() for p in model.parameters())
    expert_fn = getattr(model, "expert_parameters", None)
    experts_local = sum(p.numel() for p in expert_fn()) if callable(expert_fn) else 0
    experts = experts_local * max(int(expert_parallel_degree), 1)
    total += experts - experts_local
    emb = shape["vocab_size"] * shape["hidden_size"]
    active = total - emb
    if experts and shape.get("num_experts"):
        active -= experts * (1 - shape["top_k"] / shape["num_experts"])
    attn = 12 * shape["num_layers"] * shape["hidden_size"] * shape["seq_len"]
    return {"num_params": int(total), "flops_per_token": float(6 * active + attn)}


def model_stats(task: dict[str, Any], workspace: str | Path | None = None) -> dict[str, float]:
    """Build the workload on the meta device (no memory) and count it."""
    spec = TaskSpec.from_dict(task) if isinstance(task, dict) else task
    ws = workspace if workspace is not None else spec.workspace_path()
    shape = shape_dict(spec)
    parallel = {"rank": 0, "world_size": 1, "expert_parallel_degree": 1, "group": None}
    with load_entry(ws, spec.workload.entry) as entry, torch.device("meta"):
        model = entry.build_model(shape, parallel)
    return count_stats(model, shape)


def adapter_stats(task: TaskSpec | dict[str, Any], workspace: str | Path | None = None, *,
                  micro_batch_size: int = 1) -> dict[str, Any]:
    """Check an adapter workload's entry contract and read its shape (in this process, on the
    meta device): ``num_params``, ``num_layers``, ``hidden_size``, ``num_heads``,
    ``vocab_size``, ``seq_len``, ``tokens_per_step``, ``flops_per_token``, ``blocks``."""
    from infrarsi.harness.workload import probe

    spec = TaskSpec.from_dict(task) if isinstance(task, dict) else task
    ws = workspace if workspace is not None else spec.workspace_path()
    with load_entry(ws, spec.workload.entry) as entry:
        return probe(entry, global_batch_size=spec.workload.global_batch_size,
                     micro_batch_size=micro_batch_size, seed=spec.loss_reference.seed)
