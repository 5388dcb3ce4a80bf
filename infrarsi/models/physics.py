"""Napkin physics of a config: per-device memory, pipeline bubble and communication, from its
parallel layout.

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

from infrarsi.trial import HardwareFingerprint, WorkloadSignature

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
# rank: no recompute (Korthikanti's 34 sbh without the s^2 term: 15 for attention and layer
# norms, 19 for a 4h MLP), selective (half of those: the mean of none and full, which is what
# checkpointing every second block stores, and near what recomputing the attention core and one
# MLP intermediate saves), full (each layer's input only).
_ACT_PER_TOKEN = {"none": 34.0, "selective": 18.0, "full": 2.0}
_ATTN_PER_TOKEN, _DENSE_MLP_PER_TOKEN = 15.0, 19.0


# The values the estimates below tell apart, per role; any other value of such a knob is read
# as the role's default (e.g. an activation-checkpointing column holding "every_layer" or 1
# reads as no recompute), which a table spec fixes with a value alias (``values:``).
_VOCABULARY: dict[str, tuple[Any, ...]] = {
    "ac": ("none", "selective", "full", True, False),
    "zero": (0, 1, 2, 3, "ddp", "fsdp"),
    "precision": ("bf16", "fp16", "fp32", "fp8"),
}


def unread_values(knob: str, values: Any) -> list[Any]:
    """The values of ``knob`` that the physics does not understand (read as the role's default);
    empty for a knob it has no vocabulary for. Strict on type: 1 is not True here."""
    role = next((r for r, names in ROLES.items() if knob in names), None)
    vocab = _VOCABULARY.get(role or "")
    if vocab is None:
        return []
    return [v for v in values if not any(v == u and type(v) is type(u) for u in vocab)]


def layout(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config's value of every role (its default where the config has no such knob)."""
    out = dict(_DEFAULTS)
    found: dict[str, str] = {}
    for role, names in ROLES.items():
        for n in names:
            if n in config and config[n] is not None:
                out[role] = config[n]
                found[role] = n
                break
    for role in ("dp", "tp", "pp", "cp", "ep", "mbs", "vpp"):
        v = out[role]
        out[role] = int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1 else 1
    if found.get("dp") == "num_workers":  # a real job's world size: tp x pp x cp x dp ranks
        out["dp"] = max(out["dp"] // (out["tp"] * out["pp"] * out["cp"]), 1)
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
    act = _act_per_token(workload, experts)
    fp8 = c["precision"] == "fp8"
    states = _states_bytes(dense / (tp * pp), dp * cp, c["zero"], fp8)
    states += _states_bytes(experts / (tp * pp * ep), max(dp * cp // ep, 1), c["zero"], fp8)
    tokens = c["mbs"] * max(workload.seq_len, 1) / cp
    n_micro = max(1, workload.global_batch_size // max(dp * c["mbs"], 1))
    in_flight = min(pp, n_micro)  # 1F1B: the first stage holds up to pp micro-batches
    per_layer = tokens * act[c["ac"]] * h / tp
    acts = per_layer * layers / pp * in_flight
    if c["ac"] == "full":  # one layer recomputed at a time holds its full activations
        acts += tokens * act["none"] * h / tp
    logits = tokens * vocab * 4.0 / tp
    return states + acts + logits


def _act_per_token(workload: WorkloadSignature, expert_params: float) -> dict[str, float]:
    """Activation bytes per token per layer (units of hidden size) for each recompute mode.

    A dense model's are the table's ``_ACT_PER_TOKEN``. In a mixture of experts every token's MLP
    activations are stored once per expert it is routed to: ``top_k`` copies of a SwiGLU expert's
    input and three intermediates (2 + 6 f/h bytes per token, Korthikanti's accounting), with the
    expert width ``f`` read off the parameter count (an expert holds 3 h f weights). Measured on
    the simulator's Mixtral-like workload, the dense table's 34 put a selective-recompute config
    that needs 1.4-1.9x the device's memory at 0.45x, and the memory model (whose prior slopes are
    the physics') never learned from its OOMs that selective recompute does not fit there.
    """
    h, layers = max(workload.hidden_size, 1), max(workload.num_layers, 1)
    if not (workload.model_family == "moe" and workload.num_experts and workload.top_k
            and expert_params > 0):
        return _ACT_PER_TOKEN
    ffn = expert_params / (layers * workload.num_experts * 3.0 * h)
    none = _ATTN_PER_TOKEN + workload.top_k * (2.0 + 6.0 * ffn / h)
    full = _ACT_PER_TOKEN["full"]
    return {"none": none, "selective": (none + full) / 2.0, "full": full}


def pipeline_bubble(config: Mapping[str, Any], workload: WorkloadSignature) -> float:
    """Idle fraction a pipeline adds to a step: ``(pp - 1) / (v * micro-batches)``."""
    c = layout(config)
    if c["pp"] <= 1:
        return 0.0
    n_micro = max(1, workload.global_batch_size // max(c["dp"] * c["mbs"], 1))
    v = c["vpp"] if str(c["schedule"]).startswith("interleaved") else 1
    return (c["pp"] - 1) / (max(v, 1) * n_micro)


# Nominal bytes/s per device of each link class (per direction, what a ring collective sees
# after protocol overheads: about half the datasheet figure). Only the ratios between link
# classes and against compute matter much -- the time model fits the column's coefficient.
_LINK_BW = {"nvlink": 200e9, "nvswitch": 200e9, "xgmi": 150e9, "infiniband": 25e9, "roce": 25e9,
            "efa": 20e9, "ethernet": 3e9, "loopback": 5e9, "none": 5e9}
# Compute at a nominal 40% of the device's peak (a well-tuned dense step); a device whose peak is
# unknown is taken as 1 TFLOP/s.
_NOMINAL_MFU, _UNKNOWN_PEAK = 0.4, 1e12


def _links(hardware: HardwareFingerprint) -> tuple[float, float]:
    """(intra-node, inter-node) bytes/s per device from ``interconnect`` ("nvlink+infiniband",
    "nvlink", "ethernet", ...): the first known name is the node's, the last the cluster's."""
    names = [n.strip().lower() for n in str(hardware.interconnect).replace(",", "+").split("+")]
    known = [_LINK_BW[n] for n in names if n in _LINK_BW] or [_LINK_BW["none"]]
    return known[0], known[-1] if hardware.num_nodes > 1 else known[0]


def communication_ratio(config: Mapping[str, Any], workload: WorkloadSignature,
                        hardware: HardwareFingerprint) -> float:
    """Seconds of communication per step over seconds of compute, both textbook estimates.

    Ranks are placed tensor-parallel innermost, then context, data, pipeline outermost
    (Megatron's order), so a group of ``size`` ranks at stride ``inner`` leaves the node when
    ``inner * size`` exceeds the node's devices; it then moves at the inter-node rate. Bytes
    per step: tensor parallel, 4 ring all-reduces of a micro-batch's activations per layer
    (6 under full recompute); context parallel, the K/V ring (3 passes); expert parallel, 4
    all-to-alls of the routed tokens per MoE layer (6 under full recompute); data parallel,
    a gradient all-reduce per step (ZeRO 0-2) or weight all-gathers and gradient
    reduce-scatters every micro-batch (ZeRO-3); pipeline, an activation and a gradient per
    micro-batch. Nothing is assumed hidden: what overlap hides, its own knob column fits.
    Compute: ``6 * active params * tokens`` (8 under full recompute) per device at a
    nominal 40% of peak.
    """
    c = layout(config)
    tp, pp, cp, dp, ep, mbs = c["tp"], c["pp"], c["cp"], c["dp"], c["ep"], c["mbs"]
    h, layers = max(workload.hidden_size, 1), max(workload.num_layers, 1)
    vocab = max(workload.vocab_size, 1)
    total = float(max(workload.num_params, 1))
    dense = total
    moe = bool(workload.num_experts and workload.model_family == "moe")
    if moe:
        dense = min(total, layers * 4.0 * h * h + 2.0 * vocab * h)
    experts = total - dense
    active = dense + (experts * workload.top_k / workload.num_experts if moe else 0.0)
    per_node = max(hardware.devices_per_node, 1)
    intra, inter = _links(hardware)

    def bw(inner: int, size: int) -> float:
        return inter if inner * size > per_node else intra

    full = c["ac"] == "full"
    tokens_mb = mbs * max(workload.seq_len, 1) / cp
    n_micro = max(1, workload.global_batch_size // max(dp * mbs, 1))
    stage_layers = layers / pp
    act = tokens_mb * h * 2.0  # one micro-batch's bf16 activations, whole width
    secs = 0.0
    if tp > 1:
        per_op = 2.0 * (tp - 1) / tp * act
        secs += n_micro * stage_layers * (6 if full else 4) * per_op / bw(1, tp)
    if cp > 1:
        secs += n_micro * stage_layers * 3 * (cp - 1) * 2 * act / tp / bw(tp, cp)
    if moe and ep > 1:
        routed = act * workload.top_k * (ep - 1) / ep / tp
        secs += n_micro * stage_layers * (6 if full else 4) * routed / bw(tp, ep)
    d = dp * cp
    # (params per device, sync group size, its stride): experts sync over dp * cp / ep
    for n, group, inner in ((dense / (tp * pp), d, tp),
                            (experts / (tp * pp * ep), max(d // ep, 1), tp * ep)):
        if n <= 0 or group <= 1:
            continue
        frac = (group - 1) / group
        link = bw(inner, group)
        if c["zero"] >= 3:
            secs += n_micro * ((3 if full else 2) + 1) * frac * 2.0 * n / link
        else:
            secs += 2.0 * frac * 2.0 * n / link
    if pp > 1:
        secs += n_micro * 2 * act / tp / bw(tp * cp * dp, pp)
    world = tp * pp * cp * dp
    # a signature without a batch or a sequence still gets a finite ratio (never a division by 0)
    flops = max((8.0 if full else 6.0) * active * workload.tokens_per_step / world, 1.0)
    peak = hardware.peak_flops if hardware.peak_flops > 0 else _UNKNOWN_PEAK
    return secs / (flops / (peak * _NOMINAL_MFU))


# What one layer's forward and backward of one micro-batch cost a device beyond its FLOPs at the
# nominal rate: kernel launches, small-GEMM tails, norms and element-wise kernels that do not
# shrink with the shard. Why a fixed time: it is what makes many small micro-batches (or a
# tensor-parallel shard of a small layer) slow, and what stops a larger micro-batch from paying
# off once its GEMMs are large -- the saturation a log-linear micro-batch slope extrapolates
# past. scripts/fit_napkin_overhead.py (Ultra-Scale H100 ok runs, vTrain A100 scored with the
# H100 coefficients): 0 s leaves a residual slope of -0.30 (H100) / -0.21 (A100) log units per
# doubled micro-batch; 1 ms leaves -0.045 / +0.019 and the A100 residual std is lowest there
# (0.238 against 0.371 at 0 s).
LAYER_OVERHEAD_S = 1e-3


def device_seconds_per_token(config: Mapping[str, Any], workload: WorkloadSignature,
                             hardware: HardwareFingerprint | None) -> float:
    """Napkin device-seconds of compute per trained token (the inverse of tokens/s per device).

    ``(6 or 8 under full recompute) * active params / (peak * 40%)`` plus
    :data:`LAYER_OVERHEAD_S` per layer per micro-batch, spread over the micro-batch's tokens
    per tensor/context-parallel rank. Data and pipeline parallelism cancel (each device does
    its share of the tokens); what pipelines and communication add is in the bubble and
    communication features. Per token and per device, so the step time of a run on another
    GPU, with another model size or device count, is a ratio to this that carries over.
    """
    c = layout(config)
    layers, h = max(workload.num_layers, 1), max(workload.hidden_size, 1)
    vocab = max(workload.vocab_size, 1)
    total = float(max(workload.num_params, 1))
    active = total
    if workload.num_experts and workload.model_family == "moe":
        dense = min(total, layers * 4.0 * h * h + 2.0 * vocab * h)
        active = dense + (total - dense) * workload.top_k / workload.num_experts
    peak = hardware.peak_flops if hardware is not None and hardware.peak_flops > 0 else _UNKNOWN_PEAK
    flops = (8.0 if c["ac"] == "full" else 6.0) * active
    tokens_mb = c["mbs"] * max(workload.seq_len, 1)
    overhead = layers * LAYER_OVERHEAD_S * c["tp"] * c["cp"] / tokens_mb
    return flops / (peak * _NOMINAL_MFU) + overhead


def physics_vector(config: Mapping[str, Any], workload: WorkloadSignature | None,
                   hardware: HardwareFingerprint | None = None) -> list[float]:
    """``[log2 memory estimate in GiB, log(1 + pipeline bubble), log(1 + communication
    ratio), log device-seconds per token]``; NaN without a workload (the second to last
    without a hardware fingerprint; the last reads an unknown peak as 1 TFLOP/s)."""
    if workload is None:
        return [math.nan, math.nan, math.nan, math.nan]
    mem = memory_estimate_bytes(config, workload)
    comm = (math.log1p(communication_ratio(config, workload, hardware))
            if hardware is not None else math.nan)
    return [math.log2(max(mem, 1.0) / 2**30), math.log1p(pipeline_bubble(config, workload)), comm,
            math.log(device_seconds_per_token(config, workload, hardware))]


PHYSICS_FEATURES = ("phys_log2_mem_gib", "phys_log_bubble", "phys_log_comm",
                    "phys_log_s_per_token")

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
    # communication: half of its napkin seconds show (overlap, and the napkin's bandwidths are
    # nominal); the Ultra-Scale table's measured runs fit 0.25 +- 0.06 over 25 workloads, and
    # a mean of 1.0 instead cost its +exp searches 0.956 -> 0.944 of the best (budget 15, 10
    # seeds) for a cold simulator gain of 0.867 -> 0.893
    ("time", "phys_log_comm"): (0.5, 0.4),
    ("memory", "phys_log_comm"): (0.0, 0.1),
    # time is learned relative to the napkin's compute time (coefficient 1: an offset the data
    # may bend a little), so what experience on one GPU and model size says about the knobs
    # is said as a ratio to what that hardware and model should take, which carries over
    ("time", "phys_log_s_per_token"): (1.0, 0.1),
    ("memory", "phys_log_s_per_token"): (0.0, 0.1),
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
# Knobs whose first-order time effect the compute estimate carries (micro-batch overhead,
# recompute's extra forward): with the estimate in the time model, the built-in expert rules'
# time effects of these centre on 0 (same std), as MEMORY_ESTIMATED_KNOBS do for memory.
TIME_ESTIMATED_KNOBS = frozenset(n for role in ("mbs", "ac") for n in ROLES[role])
