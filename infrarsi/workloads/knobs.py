"""Launch knobs of a real torch training job, each mapped to a real torch or Ray mechanism.

The mechanism behind each knob lives in ``infrarsi.harness`` (outside the editable scope):

======================== ==============================================================
knob                     mechanism
======================== ==============================================================
num_workers              Ray Train ``ScalingConfig(num_workers=...)``: data-parallel ranks
num_threads              ``torch.set_num_threads`` in each worker (and its Ray CPU request)
micro_batch_size         sequences per forward/backward; gradient accumulation steps
                         = global_batch_size / (micro_batch_size * num_workers)
activation_checkpointing ``checkpoint_wrapper`` (non-reentrant) on every block ("full") or
                         every second block ("selective"), none otherwise
precision                ``torch.autocast(dtype=torch.bfloat16)`` for "bf16"; fp32 master
                         weights and optimizer state either way
compile                  ``torch.compile(model, mode=...)``; "off" runs eagerly
data_parallel            ``DistributedDataParallel`` or FSDP2 ``fully_shard``
bucket_cap_mb            DDP ``bucket_cap_mb`` (DDP with more than one worker)
gradient_as_bucket_view  DDP ``gradient_as_bucket_view`` (DDP with more than one worker)
reshard_after_forward    FSDP2 ``fully_shard(reshard_after_forward=...)``
optimizer_impl           ``torch.optim.AdamW(foreach=...)`` / ``AdamW(fused=True)``
expert_parallel_degree   MoE only: experts sharded over ranks, tokens exchanged with
                         differentiable ``all_to_all_single``
tensor_parallel_degree   DTensor ``parallelize_module`` over the mesh's "tp" dimension: a
                         column/row-wise plan derived from the model's linear layers
                         (``infrarsi.harness.tensor_parallel``)
sequence_parallel        ``SequenceParallel`` norms, activations sharded on the sequence
                         between the tensor-parallel regions
pipeline_parallel_degree ``torch.distributed.pipelining`` stages split by blocks over the
                         mesh's "pp" dimension (``infrarsi.harness.pipeline``)
pipeline_schedule        ``ScheduleGPipe`` / ``Schedule1F1B`` / ``ScheduleInterleaved1F1B``
num_virtual_pipeline_    stages per pipeline rank of the interleaved schedule
stages
======================== ==============================================================

Gradient accumulation is not a knob: it is derived, so the locked global batch (the work per
step) cannot change. Neither is the data-parallel degree: ``num_workers`` ranks form a
``(pp, dp, tp)`` mesh with ``dp = num_workers / (tensor_parallel_degree x
pipeline_parallel_degree)``, and the batch is split over ``dp`` only. Context parallelism is not
offered (``infrarsi.harness.layout`` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infrarsi.contract.spec import TaskSpec
from infrarsi.errors import ConfigError
from infrarsi.space import Knob, Rule, SearchSpace
from infrarsi.workloads._layout_rules import data_parallel_degree
from infrarsi.workloads._layout_rules import layout_space as _layout_space
from infrarsi.workloads._layout_rules import model_parallel_degree as _model_parallel

COMPILE_MODES = ("off", "default", "max-autotune-no-cudagraphs")


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _dp_active(c: Mapping[str, Any]) -> bool:
    # Under a tensor/pipeline layout with one data-parallel replica there is nothing to wrap.
    return _model_parallel(c) == 1 or data_parallel_degree(c) > 1


def _ddp_multi(c: Mapping[str, Any]) -> bool:
    return c.get("data_parallel") == "ddp" and data_parallel_degree(c) > 1


def build_torch_space(spec: TaskSpec) -> SearchSpace:
    """The knob space of a torch workload, sized by the task spec's hardware and work."""
    hw, wl = spec.hardware, spec.workload
    gbs = wl.global_batch_size
    workers = tuple(w for w in _divisors(gbs) if w <= hw.max_workers)
    threads = tuple(t for t in (1, 2, 4, 8) if t <= max(hw.cpus_per_worker * hw.max_workers, 1))
    knobs = [
        Knob("num_workers", workers, workers[-1], "ordinal", "Ray Train workers (DP ranks)"),
        Knob("num_threads", threads, 1, "ordinal", "torch intra-op threads per worker"),
        Knob("micro_batch_size", _divisors(gbs), _divisors(gbs)[0], "ordinal",
             "sequences per forward/backward pass"),
        Knob("activation_checkpointing", ("none", "selective", "full"), "none", "categorical",
             "recompute block activations in backward"),
        Knob("precision", ("fp32", "bf16"), "fp32", "categorical", "autocast compute dtype"),
        Knob("compile", COMPILE_MODES, "off", "categorical", "torch.compile mode"),
        Knob("data_parallel", ("ddp", "fsdp"), "ddp", "categorical", "gradient sync strategy",
             active_if=_dp_active),
        Knob("bucket_cap_mb", (1, 5, 25, 100), 25, "ordinal", "DDP gradient bucket size",
             active_if=_ddp_multi),
        Knob("gradient_as_bucket_view", (False, True), False, "bool",
             "DDP grads alias the comm buckets", active_if=_ddp_multi),
        Knob("reshard_after_forward", (True, False), True, "bool",
             "FSDP2 frees gathered params after forward",
             active_if=lambda c: c.get("data_parallel") == "fsdp" and _dp_active(c)),
        Knob("optimizer_impl", ("for_loop", "foreach", "fused"), "foreach", "categorical",
             "AdamW implementation"),
    ]
    rules = [
        Rule("global batch", lambda c: _global_batch_violation(c, gbs)),
        Rule("cpu budget", lambda c: _cpu_violation(c, hw.max_workers * hw.cpus_per_worker)),
    ]
    # Tensor/pipeline layouts rely on the reference model contract (entry.py: chunked fused
    # projections, a sequential forward); a user's own model (an adapter workload, no shape)
    # runs data-parallel layouts only.
    if hw.max_workers > 1 and wl.shape is not None:
        layout_knobs, layout_rules = _layout_space(spec)
        knobs += layout_knobs
        rules += layout_rules
    if wl.family == "moe":
        eps = tuple(e for e in _divisors(wl.shape.num_experts) if e <= hw.max_workers)
        knobs.append(Knob("expert_parallel_degree", eps, 1, "ordinal",
                          "ranks the experts are sharded over"))
        rules.append(Rule("expert parallel", _ep_violation))
    space = SearchSpace(tuple(knobs), tuple(rules))
    return _restrict(space, spec)


def _global_batch_violation(c: Mapping[str, Any], gbs: int) -> str | None:
    dp = data_parallel_degree(c)
    per_step = c["micro_batch_size"] * dp
    if gbs % per_step:
        return (
            f"micro_batch_size {c['micro_batch_size']} x {dp} data-parallel rank(s) = "
            f"{per_step} does not divide the locked global batch {gbs}; pick a micro-batch "
            "that divides global_batch_size / (num_workers / (tensor_parallel_degree x "
            "pipeline_parallel_degree))"
        )
    return None


def _cpu_violation(c: Mapping[str, Any], budget: int) -> str | None:
    need = c["num_workers"] * c["num_threads"]
    if need > budget:
        return (
            f"num_workers x num_threads = {need} exceeds the {budget} CPUs the task grants "
            "(hardware.max_workers x hardware.cpus_per_worker)"
        )
    return None


def _ep_violation(c: Mapping[str, Any]) -> str | None:
    ep = c["expert_parallel_degree"]
    if ep > 1 and ep != c["num_workers"]:
        return f"expert_parallel_degree {ep} must be 1 or equal num_workers ({c['num_workers']})"
    if ep > 1 and c["data_parallel"] != "ddp":
        return "expert parallelism is implemented with DDP only; set data_parallel=ddp"
    if ep > 1 and _model_parallel(c) > 1:
        return ("expert parallelism does not compose with tensor or pipeline parallelism here; "
                "set expert_parallel_degree=1 or tensor_parallel_degree=pipeline_parallel_degree=1")
    return None


def _restrict(space: SearchSpace, spec: TaskSpec) -> SearchSpace:
    """Apply the spec's ``search.restrict`` / ``exclude_knobs`` and its locked baseline."""
    knobs = []
    names = set(space.names)
    for key in list(spec.search.restrict) + list(spec.search.exclude_knobs) + list(spec.search.baseline):
        if key not in names:
            raise ConfigError(
                f"search: unknown knob {key!r} in the task spec; known knobs: {', '.join(space.names)}"
            )
    for k in space.knobs:
        values, default = k.values, spec.search.baseline.get(k.name, k.default)
        if k.name in spec.search.restrict:
            wanted = tuple(spec.search.restrict[k.name])
            bad = [v for v in wanted if v not in k.values]
            if bad:
                raise ConfigError(f"search.restrict.{k.name}: {bad} not in the domain {list(k.values)}")
            values = wanted
        if k.name in spec.search.exclude_knobs:
            values = (default,)
        if default not in values:
            raise ConfigError(
                f"search.baseline.{k.name} = {default!r} is outside the allowed values {list(values)}"
            )
        knobs.append(Knob(k.name, values, default, k.kind, k.description, k.active_if))
    out = SearchSpace(tuple(knobs), space.rules)
    out.validate(out.defaults())
    return out


def derived(config: Mapping[str, Any], global_batch_size: int) -> dict[str, int]:
    """Quantities the harness derives from knobs so the work per step stays locked (per
    data-parallel rank: tensor and pipeline ranks of one replica share its rows)."""
    per_rank = global_batch_size // data_parallel_degree(config)
    return {
        "per_rank_batch": per_rank,
        "gradient_accumulation_steps": per_rank // config["micro_batch_size"],
    }
