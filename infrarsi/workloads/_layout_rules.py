"""Tensor/sequence/pipeline layout knobs of the torch space and the rules that keep them legal.

Same names as the measured tables and the simulator (``tensor_parallel_degree``,
``pipeline_parallel_degree``, ``pipeline_schedule``, ``num_virtual_pipeline_stages``,
``sequence_parallel``), so the physics features read a real trial's layout as they read a
table's. Each rule's message names the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infrarsi.contract.spec import TaskSpec
from infrarsi.space import Knob, Rule

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def model_parallel_degree(c: Mapping[str, Any]) -> int:
    """Ranks one data-parallel replica spans: ``tensor_parallel_degree x pipeline_parallel_degree``."""
    return int(c.get("tensor_parallel_degree", 1)) * int(c.get("pipeline_parallel_degree", 1))


def data_parallel_degree(c: Mapping[str, Any]) -> int:
    """Ranks the global batch is split over: ``num_workers / (tp x pp)`` (at least 1)."""
    return max(int(c.get("num_workers", 1)) // model_parallel_degree(c), 1)


def _pp(c: Mapping[str, Any]) -> int:
    return int(c.get("pipeline_parallel_degree", 1))


def layout_space(spec: TaskSpec) -> tuple[list[Knob], list[Rule]]:
    """The layout knobs sized by the task (degrees up to ``hardware.max_workers``) and rules."""
    hw, wl = spec.hardware, spec.workload
    s = wl.shape
    degrees = tuple(d for d in range(1, hw.max_workers + 1) if hw.max_workers % d == 0)
    pps = tuple(d for d in degrees if d <= s.num_layers)
    vpps = tuple(v for v in (2, 4) if 2 * v <= s.num_layers) or (2,)
    knobs = [
        Knob("tensor_parallel_degree", degrees, 1, "ordinal",
             "ranks each layer's matmuls are split over (DTensor)"),
        Knob("sequence_parallel", (False, True), False, "bool",
             "norms and residuals sharded on the sequence between TP regions",
             active_if=lambda c: c.get("tensor_parallel_degree", 1) > 1),
        Knob("pipeline_parallel_degree", pps, 1, "ordinal", "pipeline stages (ranks)"),
        Knob("pipeline_schedule", SCHEDULES, "1f1b", "categorical", "pipeline schedule",
             active_if=lambda c: _pp(c) > 1),
        Knob("num_virtual_pipeline_stages", vpps, vpps[0], "ordinal",
             "model chunks per pipeline rank (interleaved schedule)",
             active_if=lambda c: _pp(c) > 1 and c.get("pipeline_schedule") == "interleaved_1f1b"),
    ]
    gbs, heads = wl.global_batch_size, s.num_heads
    widths = {"hidden_size": s.hidden_size, "ffn_hidden_size": s.ffn_hidden_size,
              "vocab_size": s.vocab_size}
    rules = [
        Rule("layout", _world_violation),
        Rule("tensor parallel", lambda c: _tp_violation(c, heads, widths, wl.seq_len)),
        Rule("pipeline", lambda c: _pp_violation(c, s.num_layers, gbs)),
    ]
    return knobs, rules


def _world_violation(c: Mapping[str, Any]) -> str | None:
    mp, w = model_parallel_degree(c), int(c["num_workers"])
    if w % mp:
        return (f"tensor_parallel_degree {c['tensor_parallel_degree']} x pipeline_parallel_degree "
                f"{c['pipeline_parallel_degree']} = {mp} does not divide num_workers {w} "
                "(tp x pp x dp must equal the world size); pick degrees whose product divides "
                "num_workers")
    if mp > 1 and w // mp > 1 and c.get("data_parallel") != "fsdp":
        return ("data parallelism across tensor/pipeline replicas is FSDP2 on the mesh's dp "
                "dimension; set data_parallel=fsdp")
    return None


def _tp_violation(c: Mapping[str, Any], heads: int, widths: Mapping[str, int],
                  seq_len: int) -> str | None:
    tp = int(c["tensor_parallel_degree"])
    if tp == 1:
        return None
    if heads % tp:
        return (f"num_heads {heads} is not divisible by tensor_parallel_degree {tp}; pick a "
                "degree that divides the number of attention heads")
    for name, width in widths.items():
        if width % tp:
            return (f"{name} {width} is not divisible by tensor_parallel_degree {tp}; pick a "
                    f"degree that divides {name}")
    if c.get("sequence_parallel") and seq_len % tp:
        return (f"seq_len {seq_len} is not divisible by tensor_parallel_degree {tp}, so sequence "
                "parallelism cannot shard it; set sequence_parallel=false")
    return None


def _pp_violation(c: Mapping[str, Any], num_layers: int, gbs: int) -> str | None:
    pp = _pp(c)
    if pp == 1:
        return None
    interleaved = c.get("pipeline_schedule") == "interleaved_1f1b"
    v = int(c.get("num_virtual_pipeline_stages", 2)) if interleaved else 1
    if pp * v > num_layers:
        return (f"{pp * v} pipeline stages (pipeline_parallel_degree {pp} x "
                f"num_virtual_pipeline_stages {v}) exceed num_layers {num_layers}; lower "
                "pipeline_parallel_degree or num_virtual_pipeline_stages")
    n_micro = gbs // (data_parallel_degree(c) * int(c["micro_batch_size"]) or 1)
    sched = c.get("pipeline_schedule")
    if sched == "1f1b" and n_micro < pp:
        return (f"{n_micro} micro-batch(es) per step is fewer than the {pp} pipeline stages that "
                "1F1B needs; lower micro_batch_size or use pipeline_schedule=gpipe")
    if interleaved:
        rounds = max(1, n_micro // pp)
        if n_micro % rounds:
            return (f"interleaved 1F1B needs the {n_micro} micro-batches to be a multiple of its "
                    f"{rounds} round(s) (micro-batches // pipeline_parallel_degree); change "
                    "micro_batch_size or use pipeline_schedule=1f1b")
    return None
