"""Napkin physics of a config: per-device memory and pipeline bubble, from its parallel layout.

A log-linear model of knob columns cannot express *sums*: peak memory is model states plus
activations plus logits, and whether ZeRO-3 or a bigger micro-batch matters depends on which
term dominates -- on this config's other knobs and on the workload's size. The estimates here
are the textbook ones (mixed-precision Adam states of Rajbhandari et al. 2020, per ZeRO stage;
activations per layer of Korthikanti et al. 2022 with flash attention and sequence
parallelism; the 1F1B bubble of Narayanan et al. 2021), the kind DeepSpeed's autotuner and
NeMo's auto-configurator compute before they launch anything. They are *features*, not
predictions: the cost models fit how much each one explains, from the trials (measured on the
playbook table: log estimate vs log measured peak, correlation 0.978 over every ok run of 28
workloads; OOM ranking AUC 0.93).

A knob is found by its role, under the names the torch workload, the simulator and the
playbook table use. A config without parallelism knobs is a single-device layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from infrarsi.trial import WorkloadSignature

ROLES: dict[str, tuple[str, ...]] = {
    "dp": ("data_parallel_degree", "dp", "num_workers"),
    "tp": ("tensor_parallel_degree", "tp"),
    "pp": ("pipeline_parallel_degree", "pp"),
    "cp": ("context_parallel_degree", "cp"),
    "ep": ("expert_parallel_degree", "ep"),
    "mbs": ("micro_batch_size", "mbs"),
    "zero": ("zero_stage", "zero", "data_parallel"),  # data_parallel: "ddp" | "fsdp"
    "ac": ("activation_checkpointing",),
    "precision": ("precision",),
    "schedule": ("pipeline_schedule",),
    "vpp": ("num_virtual_pipeline_stages",),
}
_DEFAULTS: dict[str, Any] = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "mbs": 1, "zero": 0,
                             "ac": "none", "precision": "bf16", "schedule": "1f1b", "vpp": 1}

# Bytes per parameter of mixed-precision Adam (ZeRO paper): bf16 weights and gradients, fp32 master
# weights and two moments; an fp8 recipe adds a one-byte weight cache.
_WEIGHT, _GRAD, _OPTIM, _FP8_CACHE = 2.0, 2.0, 12.0, 1.0
# Activation bytes per token per layer, in units of hidden size, stored per tensor-parallel
# rank: no recompute (Korthikanti's 34 sbh without the s^2 term), selective (the attention
# core and MLP intermediates recomputed), full (each layer's input only).
_ACT_PER_TOKEN = {"none": 34.0, "selective": 18.0, "full": 2.0}


def layout(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config's value of every role (its default where the config has no such knob)."""
    out = dict(_DEFAULTS)
    for role, names in ROLES.items():
        for n in names:
            if n in config and config[n] is not None:
                out[role] = config[n]
                break
    for role in ("dp", "tp", "pp", "cp", "ep", "mbs", "vpp"):
        v = out[role]
        out[role] = int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1 else 1
    z = out["zero"]
    if z == "fsdp":  # FSDP2 full shard is ZeRO-3; keeping params after forward is ZeRO-2
        z = 3 if config.get("reshard_after_forward", True) else 2
    out["zero"] = int(z) if isinstance(z, (int, float)) and not isinstance(z, bool) else 0
    if out["ac"] not in _ACT_PER_TOKEN:
        out["ac"] = "full" if out["ac"] is True else "none"
    return out


def _states_bytes(n: float, shard: int, zero: int, fp8: bool) -> float:
    return n * (_WEIGHT / (shard if zero >= 3 else 1) + _GRAD / (shard if zero >= 2 else 1)
                + _OPTIM / (shard if zero >= 1 else 1) + (_FP8_CACHE if fp8 else 0.0))


def memory_estimate_bytes(config: Mapping[str, Any], workload: WorkloadSignature) -> float:
    """Peak bytes on the busiest device: model states + activations in flight + logits."""
    c = layout(config)
    tp, pp, cp, dp, ep = c["tp"], c["pp"], c["cp"], c["dp"], c["ep"]
    h, layers = max(workload.hidden_size, 1), max(workload.num_layers, 1)
    vocab = max(workload.vocab_size, 1)
    total = float(max(workload.num_params, 1))
    dense = total
    if workload.num_experts and workload.model_family == "moe":
        # attention + embeddings are dense; the rest are experts, sharded over ep as well
        dense = min(total, layers * 4.0 * h * h + 2.0 * vocab * h)
    experts = total - dense
    fp8 = c["precision"] == "fp8"
    states = _states_bytes(dense / (tp * pp), dp * cp, c["zero"], fp8)
    states += _states_bytes(experts / (tp * pp * ep), max(dp * cp // ep, 1), c["zero"], fp8)
    tokens = c["mbs"] * max(workload.seq_len, 1) / cp
    n_micro = max(1, workload.global_batch_size // max(dp * c["mbs"], 1))
    in_flight = min(pp, n_micro)  # 1F1B: the first stage holds up to pp micro-batches
    per_layer = tokens * _ACT_PER_TOKEN[c["ac"]] * h / tp
    acts = per_layer * layers / pp * in_flight
    if c["ac"] == "full":  # one layer recomputed at a time holds its full activations
        acts += tokens * _ACT_PER_TOKEN["none"] * h / tp
    logits = tokens * vocab * 4.0 / tp
    return states + acts + logits


def pipeline_bubble(config: Mapping[str, Any], workload: WorkloadSignature) -> float:
    """Idle fraction a pipeline adds to a step: ``(pp - 1) / (v * micro-batches)``."""
    c = layout(config)
    if c["pp"] <= 1:
        return 0.0
    n_micro = max(1, workload.global_batch_size // max(c["dp"] * c["mbs"], 1))
    v = c["vpp"] if str(c["schedule"]).startswith("interleaved") else 1
    return (c["pp"] - 1) / (max(v, 1) * n_micro)


def physics_vector(config: Mapping[str, Any], workload: WorkloadSignature | None) -> list[float]:
    """``[log2 memory estimate in GiB, log(1 + pipeline bubble)]``, NaN without a workload."""
    if workload is None:
        return [math.nan, math.nan]
    mem = memory_estimate_bytes(config, workload)
    return [math.log2(max(mem, 1.0) / 2**30), math.log1p(pipeline_bubble(config, workload))]


PHYSICS_FEATURES = ("phys_log2_mem_gib", "phys_log_bubble")

# What the physics says about each column's coefficient, (mean, std), per model target: peak
# memory proportional to the estimate (log_e peak per log2 estimate = ln 2), step time
# stretched by (1 + bubble). Wide enough for trials to correct the napkin's constants.
# Each estimate is kept out of the other target (mean 0, std 0.1): a memory estimate is no cause
# of step time (its causes, micro-batch and sharding, have their own columns), and a few trials
# would otherwise blame whichever correlate came first (measured, simulator, 4 seeds: cold geo
# 0.807 -> 0.835 with the memory estimate kept out of the time model).
PHYSICS_PRIORS: dict[tuple[str, str], tuple[float, float]] = {
    ("memory", "phys_log2_mem_gib"): (math.log(2.0), 0.15),
    ("time", "phys_log_bubble"): (1.0, 0.3),
    ("time", "phys_log2_mem_gib"): (0.0, 0.1),
    ("memory", "phys_log_bubble"): (0.0, 0.1),
}
# With the memory estimate a column, what the workload and hardware columns may still add to log
# peak memory across the whole span of each (CONTEXT_SPANS): the napkin carries model size and
# device count, so little is left (the napkin's misfit across the playbook's 28 workloads).
# Without it, an unseen workload's 80 layers against experience's 32 put 48 prior-std units of
# doubt on every prediction, and P(OOM) sat at 0.5 for a config predicted at 15x the device.
CONTEXT_MEMORY_STD = 0.1
# Knobs whose first-order memory effect the estimate already carries: with the estimate in the
# model, their own memory column fits only what the napkin misses (prior mean 0, same std).
MEMORY_ESTIMATED_KNOBS = frozenset(
    n for role in ("dp", "tp", "pp", "cp", "ep", "mbs", "zero", "ac") for n in ROLES[role])
