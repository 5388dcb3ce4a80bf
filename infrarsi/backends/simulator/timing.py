"""Step time: compute at a shape-dependent efficiency, alpha-beta communication, bubble.

One optimizer step on the slowest pipeline stage (the last: it also runs the LM head):

* compute per micro-batch: GEMMs at ``peak * eff_max * m/(m+m0) * w/(w+w0)`` (m = rows,
  w = sharded width: small per-GPU GEMMs run far from peak), the flash-attention core at a
  fixed efficiency, elementwise kernels bound by HBM bandwidth (fused by torch.compile), and
  a fixed launch overhead per layer; recomputation adds forward work under checkpointing;
* tensor/context/expert parallel communication per micro-batch (reduce-scatter/all-gather
  under sequence parallelism, ring-attention KV passes hidden behind attention, MoE
  all-to-all slowed by the busiest rank's load, capped by the capacity factor);
* the pipeline bubble ``(pp-1)/v`` micro-batch slots plus point-to-point sends;
* data-parallel gradient sync per ZeRO stage, partly hidden behind the last backward
  when ``overlap_communication`` is on (bucketed: each bucket pays a latency, the last one
  is never hidden); ZeRO-3 gathers weights every micro-batch;
* the optimizer step, bound by HBM bandwidth over the local shard.
"""

from __future__ import annotations

import math

from infrarsi.backends.simulator._plan import Plan
from infrarsi.backends.simulator.params import SimParams

__all__ = ["step_phases"]


def _bw(p: Plan, params: SimParams, inner: int, size: int) -> tuple[float, float]:
    """(bytes/s, latency s) of a collective over ``size`` ranks at stride ``inner``."""
    g = p.cluster.gpu
    if not p.spans_nodes(inner, size):
        return g.nvlink_bw * params.intra_bw_eff, g.nvlink_latency_s
    nodes = p.nodes_in_group(inner, size)
    slow = max(nodes, 1) ** params.inter_congestion
    return g.inter_node_bw * params.inter_bw_eff / slow, g.inter_node_latency_s


def _ring(nbytes: float, n: int, bw: float, lat: float, factor: float = 1.0) -> float:
    """all-gather / reduce-scatter (factor 1) or all-reduce (factor 2) of ``nbytes``."""
    if n <= 1:
        return 0.0
    return factor * ((n - 1) / n * nbytes / bw + (n - 1) * lat)


def _gemm_eff(params: SimParams, rows: float, width: float) -> float:
    return (
        params.matmul_eff_max
        * rows / (rows + params.matmul_rows_half)
        * width / (width + params.matmul_width_half)
    )


def _moe_imbalance(p: Plan, params: SimParams) -> float:
    if p.ep <= 1:
        return 1.0
    experts_per_rank = p.model.num_experts / p.ep
    cv = params.router_skew_cv / math.sqrt(experts_per_rank)
    return min(p.capacity_factor, 1.0 + cv * math.sqrt(2.0 * math.log(p.ep)))


def _compute_per_mb(p: Plan, params: SimParams) -> tuple[float, float]:
    """(seconds of one micro-batch fwd+bwd on the last stage, attention-core seconds)."""
    m, g = p.model, p.cluster.gpu
    t, h = p.tokens_mb, m.hidden_size
    passes = {"none": 3.0, "selective": 3.0, "full": 4.0}[p.ac]
    peak = g.bf16_flops
    lin_peak = g.fp8_flops * params.fp8_gemm_gain if p.fp8 else peak
    layers, moe_layers = p.layers_per_stage, p.moe_layers_per_stage
    dense_layers = layers - moe_layers
    w_att = h / p.tp
    att_lin = 2 * t * m.attn_params / p.tp / (lin_peak * _gemm_eff(params, t, w_att))
    mlp = 2 * t * m.dense_mlp_params / p.tp / (lin_peak * _gemm_eff(params, t, m.ffn_hidden_size / p.tp))
    secs = passes * (layers * att_lin + dense_layers * mlp)
    if moe_layers:
        routed_rows = t * m.top_k * p.ep / m.num_experts  # tokens per local expert
        fe = m.expert_ffn_hidden_size / p.tp
        routed = 2 * t * m.top_k * m.expert_params / p.tp / (
            lin_peak * params.grouped_gemm_eff * _gemm_eff(params, routed_rows, fe))
        # router, top-k, token permutation and un-permutation (HBM bound)
        routed += 6 * t * m.top_k * m.hidden_size * 2 / p.tp / p.cluster.gpu.hbm_bw
        shared = 2 * t * m.shared_mlp_params / p.tp / (lin_peak * _gemm_eff(params, t, fe))
        secs += passes * moe_layers * (routed * _moe_imbalance(p, params) + shared)
    # attention core (causal): 2 * s * h flops per token forward, whole sequence as keys
    core_passes = {"none": 3.0, "selective": 4.0, "full": 4.0}[p.ac]
    attn = core_passes * layers * 2 * t * p.seq_len * h / p.tp / (peak * params.attention_eff)
    # elementwise kernels (norms, rope, SwiGLU, residuals, casts) bound by HBM bandwidth
    ffn_w = m.ffn_hidden_size if not m.is_moe else m.top_k * m.expert_ffn_hidden_size
    elem = params.elementwise_passes * layers * t * (h + ffn_w) * 2 / p.tp / g.hbm_bw
    if p.fp8:
        elem *= 1.3  # amax / cast kernels
    overhead = params.layer_overhead_s * layers + params.microbatch_overhead_s
    if p.compile:
        elem *= params.compile_elementwise_factor
        overhead *= params.compile_overhead_factor
    # LM head + loss on the last stage
    head = 6 * t * m.vocab_size * h / p.tp / (peak * _gemm_eff(params, t, m.vocab_size / p.tp))
    head += 6 * t * m.vocab_size / p.tp * 4 / g.hbm_bw
    return secs + attn + elem + overhead + head, attn


def _tp_cp_moe_comm(p: Plan, params: SimParams, attn_s: float) -> float:
    """Exposed per micro-batch communication of tensor, context and expert parallelism."""
    m = p.model
    layers = p.layers_per_stage
    act = p.tokens_mb * m.hidden_size * 2.0
    out = 0.0
    if p.tp > 1:
        bw, lat = _bw(p, params, 1, p.tp)
        per_op = _ring(act, p.tp, bw, lat)
        ops = 8 + (4 if p.ac == "full" else 0)
        tp_s = layers * ops * per_op
        out += tp_s * (1 - params.tp_overlap_frac if p.overlap else 1.0)
    if p.cp > 1:
        bw, lat = _bw(p, params, p.tp, p.cp)
        kv = p.tokens_mb * 2 * m.kv_dim * 2.0 / p.tp
        cp_s = layers * 3 * (p.cp - 1) * (kv / bw + lat)
        out += max(cp_s - (attn_s if p.overlap else 0.0), 0.0) + layers * (p.cp - 1) * lat
    if m.is_moe and p.ep > 1:
        out += _all_to_all(p, params) * p.moe_layers_per_stage
    return out


def _all_to_all(p: Plan, params: SimParams) -> float:
    """Dispatch + combine of one MoE layer, forward and backward (and recompute)."""
    m = p.model
    bw, lat = _bw(p, params, p.tp, p.ep)
    tokens = p.tokens_mb * m.hidden_size * 2.0 / p.tp
    calls = 4 + (2 if p.ac == "full" else 0)
    imb = _moe_imbalance(p, params)
    frac = (p.ep - 1) / p.ep
    if p.dispatch == "allgather":  # gather every token to every rank, reduce-scatter back
        one = _ring(tokens, p.ep, bw, lat) * (1.0 if p.ep <= 2 else 1.15)
        one += tokens * m.top_k / p.cluster.gpu.hbm_bw * 2
    elif p.dispatch == "deepep":  # fused permute + NVLink/RDMA kernels
        one = tokens * m.top_k * frac * imb / (bw * 1.35) + 2 * lat
    else:  # NCCL all_to_all_single plus explicit permutation kernels
        one = tokens * m.top_k * frac * imb / bw + (p.ep - 1) * lat
        one += tokens * m.top_k * 4 / p.cluster.gpu.hbm_bw
    return calls * one


def _dp_comm(p: Plan, params: SimParams, bwd_window: float) -> tuple[float, float]:
    """(exposed seconds per step, exposed seconds per micro-batch) of ZeRO/DP traffic."""
    m = p.model
    layers = p.layers_per_stage
    dense = (layers * m.attn_params + (layers - p.moe_layers_per_stage) * m.dense_mlp_params
             + m.vocab_size * m.hidden_size + p.moe_layers_per_stage * m.shared_mlp_params) / p.tp
    experts = p.moe_layers_per_stage * m.num_experts * m.expert_params / p.ep / p.tp
    groups = [(dense, p.shard_degree, p.tp), (experts, p.expert_shard_degree, p.tp * p.ep)]
    per_step, per_mb = 0.0, 0.0
    for n, d, inner in groups:
        if n <= 0 or d <= 1:
            continue
        bw, lat = _bw(p, params, inner, d)
        if p.zero >= 3:
            mb = _ring(2 * n, d, bw, lat) * (3 if p.ac == "full" else 2)
            mb += _ring(params.grad_reduce_bytes * n, d, bw, lat)
            per_mb += mb
            continue
        nbytes = params.grad_reduce_bytes * n
        buckets = max(1, math.ceil(nbytes / p.bucket_bytes))
        sync = _ring(nbytes, d, bw, 0.0, factor=2.0) + buckets * 2 * math.log2(d) * lat
        if p.zero >= 1:  # reduce-scatter grads, all-gather updated bf16 weights
            sync = _ring(nbytes, d, bw, 0.0) + _ring(2 * n, d, bw, 0.0) + buckets * 2 * math.log2(d) * lat
        last_bucket = sync * min(1.0, p.bucket_bytes / nbytes)
        hidden = params.dp_overlap_frac * bwd_window if p.overlap else 0.0
        per_step += max(sync - hidden, last_bucket if p.overlap else sync)
    return per_step, per_mb


def step_phases(p: Plan, params: SimParams) -> dict[str, float]:
    """Seconds per optimizer step split into phases; ``total`` is the step time."""
    compute_mb, attn = _compute_per_mb(p, params)
    comm_mb = _tp_cp_moe_comm(p, params, attn)
    dp_step, dp_mb = _dp_comm(p, params, bwd_window=compute_mb * 2 / 3)
    if p.zero >= 3 and p.overlap:  # FSDP prefetch hides gathers behind the micro-batch
        dp_mb = max(dp_mb - params.dp_overlap_frac * compute_mb, 0.1 * dp_mb)
    slot = compute_mb + comm_mb + dp_mb
    pp_comm = 0.0
    if p.pp > 1:
        bw, lat = _bw(p, params, p.tp * p.cp * p.dp, p.pp)
        send = p.tokens_mb * p.model.hidden_size * 2.0 / p.tp / bw + lat + params.p2p_overhead_s
        pp_comm = 2 * p.v * send * (p.grad_acc + p.pp - 1)
    bubble = (p.pp - 1) / p.v * slot
    local_params = p.model.num_params / (p.tp * p.pp)
    shard = p.shard_degree if p.zero >= 1 else 1
    optimizer = local_params / shard * 16 * 2 / p.cluster.gpu.hbm_bw + 2e-3
    phases = {
        "compute": p.grad_acc * compute_mb,
        "communication": p.grad_acc * (comm_mb + dp_mb) + dp_step + pp_comm,
        "bubble": bubble,
        "optimizer": optimizer,
    }
    phases["total"] = sum(phases.values())
    return phases
