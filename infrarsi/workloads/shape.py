"""Workload size from the locked shape alone, without running the user's code.

The driver never imports the workspace (it may be patched, slow, or hang); these counts key
the workload signature. Exact per-model counts come from the trial itself (the harness counts
the real module in the worker and returns them in the record's ``extra``).
"""

from __future__ import annotations

from infrarsi.contract.spec import TaskSpec


def shape_stats(spec: TaskSpec) -> dict[str, float]:
    """Llama-style parameter count and MFU FLOPs per token (6N + 12 L H T) from the shape."""
    s, wl = spec.workload.shape, spec.workload
    h, f, layers = s.hidden_size, s.ffn_hidden_size, s.num_layers
    attn = 4 * h * h
    mlp = 3 * h * f
    norms = 2 * h
    if wl.family == "moe":
        per_layer = attn + s.num_experts * mlp + h * s.num_experts + norms
        active_layer = attn + s.top_k * mlp + h * s.num_experts + norms
    else:
        per_layer = active_layer = attn + mlp + norms
    emb = s.vocab_size * h
    total = emb + layers * per_layer + h + s.vocab_size * h
    active = layers * active_layer + h + s.vocab_size * h
    return {"num_params": int(total),
            "flops_per_token": float(6 * active + 12 * layers * h * wl.seq_len)}
