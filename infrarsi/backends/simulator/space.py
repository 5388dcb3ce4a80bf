"""The simulator's knob space: parallel degrees, batching, sharding, recompute, precision...

Knob names are the real launch names (torchtitan/Megatron vocabulary). Gradient accumulation
is not a knob: it is derived as ``global_batch_size / (data_parallel_degree x
micro_batch_size)`` so the locked work per step cannot change. The MoE capacity factor is
locked by the workload (the contract), not searched.

:class:`SimulatorSpace` is a :class:`~infrarsi.space.SearchSpace` whose ``enumerate`` and
``sample`` first pick a legal parallel layout (dp, tp, pp, cp, ep, micro-batch), then the
other knobs: the full cartesian product is millions of points, the legal set tens of
thousands.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from typing import Any

from infrarsi.backends.simulator._plan import DEFAULTS
from infrarsi.backends.simulator.hardware import Cluster
from infrarsi.backends.simulator.models import ModelShape
from infrarsi.errors import IllegalConfigError
from infrarsi.space import Config, Knob, Rule, SearchSpace, config_key

__all__ = ["SimulatorSpace", "build_space", "CORE_KNOBS"]

CORE_KNOBS = (
    "data_parallel_degree",
    "tensor_parallel_degree",
    "pipeline_parallel_degree",
    "context_parallel_degree",
    "expert_parallel_degree",
    "micro_batch_size",
)


def _pow2_upto(n: int) -> tuple[int, ...]:
    return tuple(2**i for i in range(n.bit_length()) if 2**i <= n)


class SimulatorSpace(SearchSpace):
    """A SearchSpace that enumerates and samples layout-first (same knobs, same rules)."""

    def _core_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.name in _CORE_RULES)

    def legal_layouts(self) -> list[Config]:
        """Every legal assignment of the core knobs (others at their defaults)."""
        core = [k for k in self.knobs if k.name in CORE_KNOBS]
        rules = self._core_rules()
        out = []
        for values in itertools.product(*(k.values for k in core)):
            c = self.normalize(dict(zip((k.name for k in core), values, strict=True)), check=False)
            if not any(r.check(c) for r in rules):
                out.append(c)
        return out

    def enumerate(self, limit: int | None = 200_000) -> list[Config]:
        rest = [k for k in self.knobs if k.name not in CORE_KNOBS]
        seen: dict[str, Config] = {}
        for layout in self.legal_layouts():
            for values in itertools.product(*(k.values for k in rest)):
                c = self.normalize({**layout, **dict(zip((k.name for k in rest), values,
                                                         strict=True))}, check=False)
                key = config_key(c)
                if key not in seen and self.is_legal(c):
                    seen[key] = c
                    if limit is not None and len(seen) > limit:
                        raise IllegalConfigError(
                            f"space has more than {limit} legal configs; use sample() instead"
                        )
        return list(seen.values())

    def sample(self, n: int, rng: random.Random) -> list[Config]:
        layouts = self.legal_layouts()
        rest = [k for k in self.knobs if k.name not in CORE_KNOBS]
        out: dict[str, Config] = {}
        for _ in range(50 * n):
            c = {**rng.choice(layouts), **{k.name: rng.choice(k.values) for k in rest}}
            c = self.normalize(c, check=False)
            if self.is_legal(c):
                out.setdefault(config_key(c), c)
            if len(out) >= n:
                break
        return list(out.values())

    def with_knobs(self, extra, rules=()) -> SimulatorSpace:
        return SimulatorSpace(self.knobs + tuple(extra), self.rules + tuple(rules), self.allowed)


def build_space(
    model: ModelShape,
    cluster: Cluster,
    *,
    seq_len: int,
    global_batch_size: int,
    baseline: Mapping[str, Any] | None = None,
    restrict: Mapping[str, tuple[Any, ...]] | None = None,
) -> SimulatorSpace:
    """Knobs sized for ``model`` on ``cluster``; ``restrict`` narrows a knob's domain,
    ``baseline`` sets the defaults (the user's current config)."""
    n, gpn = cluster.num_devices, cluster.gpus_per_node
    base = {**DEFAULTS, "data_parallel_degree": min(n, global_batch_size), **(baseline or {})}
    knobs = [
        Knob("data_parallel_degree", _pow2_upto(min(n, global_batch_size)), 1, "ordinal",
             "data-parallel replicas (ZeRO shards over dp x cp)"),
        Knob("tensor_parallel_degree", _pow2_upto(gpn), 1, "ordinal",
             "tensor (+sequence) parallel ranks, inside one node"),
        Knob("pipeline_parallel_degree", _pow2_upto(min(n, 8, model.num_layers)), 1, "ordinal",
             "pipeline stages"),
        Knob("pipeline_schedule", ("1f1b", "interleaved_1f1b"), "1f1b", "categorical",
             "pipeline schedule", active_if=lambda c: c["pipeline_parallel_degree"] > 1),
        Knob("num_virtual_pipeline_stages", (2, 4), 2, "ordinal",
             "model chunks per pipeline rank (interleaved schedule)",
             active_if=lambda c: c["pipeline_parallel_degree"] > 1
             and c["pipeline_schedule"] == "interleaved_1f1b"),
        Knob("context_parallel_degree", _pow2_upto(min(n, 4)), 1, "ordinal",
             "ranks the sequence is split over (ring attention)"),
        Knob("micro_batch_size", _pow2_upto(min(16, global_batch_size)), 1, "ordinal",
             "sequences per forward/backward; accumulation = gbs / (dp x micro_batch_size)"),
        Knob("zero_stage", (0, 1, 2, 3), 0, "ordinal",
             "ZeRO: 1 shards optimizer states, 2 also gradients, 3 (FSDP) also weights"),
        Knob("activation_checkpointing", ("none", "selective", "full"), "none", "categorical",
             "recompute activations in backward"),
        Knob("precision", ("bf16", "fp8"), "bf16", "categorical", "GEMM precision"),
        Knob("overlap_communication", (True, False), True, "bool",
             "overlap DP gradient sync / FSDP gathers / TP collectives with compute"),
        Knob("bucket_size_mb", (25, 200), 25, "ordinal", "gradient-reduction bucket size",
             active_if=lambda c: c["data_parallel_degree"] * c["context_parallel_degree"] > 1
             and c["zero_stage"] < 3),
        Knob("compile", ("off", "default"), "off", "categorical", "torch.compile mode"),
    ]
    if model.is_moe:
        eps = tuple(e for e in _pow2_upto(min(n, model.num_experts)) if model.num_experts % e == 0)
        knobs.insert(6, Knob("expert_parallel_degree", eps, 1, "ordinal",
                             "ranks the routed experts are sharded over (inside dp x cp)"))
        knobs.append(Knob("moe_dispatch", ("all_to_all", "allgather", "deepep"), "all_to_all",
                          "categorical", "token dispatch implementation",
                          active_if=lambda c: c["expert_parallel_degree"] > 1))
    knobs = [_restricted(k, base, restrict or {}) for k in knobs]
    rules = _rules(model, cluster, seq_len, global_batch_size)
    space = SimulatorSpace(tuple(knobs), tuple(rules))
    space.validate(space.defaults())
    return space


def _restricted(k: Knob, base: Mapping[str, Any], restrict: Mapping[str, Any]) -> Knob:
    values = tuple(restrict.get(k.name, k.values))
    bad = [v for v in values if v not in k.values]
    if bad:
        raise IllegalConfigError(f"restrict.{k.name}: {bad} not in the domain {list(k.values)}")
    default = base.get(k.name, k.default)
    if default not in values:
        raise IllegalConfigError(
            f"baseline {k.name} = {default!r} is outside the knob's values {list(values)}"
        )
    return Knob(k.name, values, default, k.kind, k.description, k.active_if)


_CORE_RULES = ("device count", "tensor parallel", "global batch", "expert parallel",
               "context parallel")


def _rules(model: ModelShape, cluster: Cluster, seq_len: int, gbs: int) -> list[Rule]:
    n, gpn = cluster.num_devices, cluster.gpus_per_node

    def devices(c):
        dp, tp = c["data_parallel_degree"], c["tensor_parallel_degree"]
        pp, cp = c["pipeline_parallel_degree"], c["context_parallel_degree"]
        if dp * tp * pp * cp != n:
            fix = n // (tp * pp * cp) if n % (tp * pp * cp) == 0 else None
            hint = (f"set data_parallel_degree={fix}" if fix else
                    "pick tensor x pipeline x context parallel degrees that divide it")
            return (f"data_parallel_degree {dp} x tensor_parallel_degree {tp} x "
                    f"pipeline_parallel_degree {pp} x context_parallel_degree {cp} = "
                    f"{dp * tp * pp * cp}, but the cluster has {n} devices; {hint}")
        return None

    def tensor(c):
        tp = c["tensor_parallel_degree"]
        if tp > gpn:
            return (f"tensor_parallel_degree {tp} exceeds the {gpn} GPUs of one node; keep "
                    "tensor parallelism inside a node and use pipeline_parallel_degree across")
        if model.num_heads % tp or model.num_kv_heads % tp:
            return (f"tensor_parallel_degree {tp} must divide num_heads {model.num_heads} and "
                    f"num_kv_heads {model.num_kv_heads}")
        return None

    def batch(c):
        per = c["data_parallel_degree"] * c["micro_batch_size"]
        if gbs % per:
            return (f"data_parallel_degree x micro_batch_size = {per} does not divide the locked "
                    f"global batch {gbs}; pick micro_batch_size dividing {gbs} / data_parallel_degree")
        return None

    def pipeline(c):
        pp = c["pipeline_parallel_degree"]
        if pp > model.num_layers:
            return f"pipeline_parallel_degree {pp} exceeds num_layers {model.num_layers}"
        if pp > 1 and c["pipeline_schedule"] == "interleaved_1f1b":
            v = c["num_virtual_pipeline_stages"]
            if model.num_layers % (pp * v):
                return (f"interleaved schedule needs num_layers {model.num_layers} divisible by "
                        f"pipeline_parallel_degree x num_virtual_pipeline_stages = {pp * v}")
            acc = gbs // (c["data_parallel_degree"] * c["micro_batch_size"])
            if acc % pp:
                return (f"interleaved schedule needs the accumulation steps ({acc}) to be a "
                        f"multiple of pipeline_parallel_degree {pp}; lower micro_batch_size "
                        "or use pipeline_schedule=1f1b")
        if pp > 1 and c["zero_stage"] == 2:
            return ("zero_stage 2 re-reduces sharded gradients every micro-batch and is not "
                    "supported with pipeline parallelism; use zero_stage 1 or 3")
        return None

    def context(c):
        cp = c["context_parallel_degree"]
        if seq_len % (2 * cp):
            return f"context_parallel_degree {cp}: seq_len {seq_len} must divide by 2 x cp"
        return None

    def expert(c):
        ep = c.get("expert_parallel_degree", 1)
        dpcp = c["data_parallel_degree"] * c["context_parallel_degree"]
        if ep > 1 and (model.num_experts % ep or dpcp % ep):
            return (f"expert_parallel_degree {ep} must divide num_experts {model.num_experts} and "
                    f"data_parallel_degree x context_parallel_degree = {dpcp}")
        return None

    def fp8(c):
        if c["precision"] == "fp8" and not cluster.gpu.supports_fp8:
            return f"{cluster.gpu.name} has no fp8 tensor cores; use precision=bf16"
        return None

    return [
        Rule("device count", devices),
        Rule("tensor parallel", tensor),
        Rule("global batch", batch),
        Rule("pipeline", pipeline),
        Rule("context parallel", context),
        Rule("expert parallel", expert),
        Rule("fp8 hardware", fp8),
    ]
