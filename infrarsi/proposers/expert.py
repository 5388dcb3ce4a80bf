"""The expert proposer: offline, deterministic rules of thumb, and patches that already exist.

Priors: one rule per knob name, for the torch workload's launch names and the simulator's and
the playbook table's names (a knob without a rule gets no prior: the model's weak default).
Effects are on log step time and log peak memory relative to the knob's default, with a
standard deviation that says how sure the rule is; they depend on the device (CPU vs CUDA).
Where doctor measured the fact a rule of thumb guesses at, the measurement decides
(:data:`MEASURED_RULES`): on CPU, bf16 autocast from the measured bf16/fp32 matmul speeds.

Patches: the catalog's honest patches and the bank's verified patches for the same code
lineage, each kept only if it still applies cleanly to the workspace; then the pattern rules
(:mod:`._patterns`: found by reading the AST of any code) for the files those do not cover. The caller verifies every
one again before it becomes a knob (a bank entry is evidence, not a pass).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infrarsi.models.priors import KnobPrior
from infrarsi.patches import DiffError, Patch, apply_patch, copy_workspace, honest_patches
from infrarsi.proposers._patterns import pattern_patches
from infrarsi.proposers.base import (
    Context,
    Proposer,
    device_kind,
    editable_source,
    family,
    lineage_of,
    scope_of,
    workspace_of,
)
from infrarsi.space import is_patch_knob, patch_knob

Effect = tuple[float | None, float, float | None, float]  # time, time std, mem, mem std
Rule = Callable[[Any, Any, str], Effect | None]  # (value, default, device) -> effect


def _ratio(v: Any, d: Any) -> float:
    try:
        return math.log(float(v) / float(d)) if float(v) > 0 and float(d) > 0 else 0.0
    except (TypeError, ValueError):
        return 0.0


def _workers(v, d, dev):  # fewer data-parallel ranks: each does proportionally more work
    r = _ratio(v, d)
    return (-0.85 * r, 0.25, 0.0, 0.2)


def _threads(v, d, dev):
    return (-0.5 * _ratio(v, d), 0.4, 0.0, 0.1) if dev == "cpu" else (-0.05 * _ratio(v, d), 0.2, 0.0, 0.1)


def _micro_batch(v, d, dev):  # fewer accumulation steps, bigger GEMMs; activations grow
    r = _ratio(v, d)
    return (-(0.12 if dev == "cuda" else 0.05) * r, 0.25, 0.45 * r, 0.35)


def _accumulation(v, d, dev):
    # At a fixed global batch the accumulation count follows from data parallelism and the
    # micro-batch (the playbook table derives it); gradients accumulate in place, so peak
    # memory does not depend on it. A tight memory prior keeps a fit on a few trials from
    # explaining an OOM by this collinear column; its time effect is the micro-batch's.
    return (0.0, 0.2, 0.0, 0.05)


def _checkpointing(v, d, dev):
    table = {"none": (0.0, 0.0), "selective": (0.12, -0.2), "full": (0.28, -0.45)}
    if v not in table or d not in table:
        return None
    return (table[v][0] - table[d][0], 0.15, table[v][1] - table[d][1], 0.3)


# Share of forward+backward time in GEMMs, for a small decoder on CPU (the rest is elementwise
# work, softmax, norms and autocast's casts, which bf16 does not speed up).
GEMM_SHARE_CPU = 0.6


# Patches that keep an MoE's expert matmuls to a few shapes (see _precision_measured).
SHAPE_STABLE_PATCHES = (patch_knob("moe_shape_buckets"),)


def _precision_measured(v, d, dev, context):
    """bf16 vs fp32 on a CPU workload from doctor's measured matmul speeds: Amdahl over the
    GEMM share of the step's forward+backward time (doctor's phase fractions, else the step).

    For MoE only when the search space holds a patch that keeps the expert matmuls to a few
    shapes (:data:`SHAPE_STABLE_PATCHES`). Without one every expert matmul has a new row count
    at every step, and oneDNN builds a bf16 kernel per new shape (measured: a bf16 linear
    layer's forward+backward 4.5 ms per call at new row counts, 1.9 ms at a repeated one), so
    cpu_moe ran 1.5x slower in bf16 (387 vs 259 ms a step) while its matmuls are 2.4x faster;
    with the shapes bucketed it ran 1.16x faster (224 ms), and 1.5x at micro-batch 4."""
    findings = context.get("findings") or {}
    mm = findings.get("matmul") or {}
    if dev != "cpu" or {v, d} != {"fp32", "bf16"} \
            or not mm.get("fp32_flops") or not mm.get("bf16_flops"):
        return None
    names = getattr(context.get("space"), "names", ())
    if family(context) != "dense" and not any(n in names for n in SHAPE_STABLE_PATCHES):
        return None
    fr = findings.get("phase_fractions") or {}
    compute = fr.get("forward", 0.0) + fr.get("backward", 0.0) if fr else 1.0
    share = GEMM_SHARE_CPU * min(max(compute, 0.0), 1.0)
    ratio = mm["bf16_flops"] / mm["fp32_flops"]
    t = math.log(1.0 - share + share / ratio)
    sign = 1 if v == "bf16" else -1
    return (sign * t, 0.25, sign * -0.2, 0.3)


def _precision(v, d, dev):
    if {v, d} == {"fp32", "bf16"}:
        sign = 1 if v == "bf16" else -1
        t = -0.45 if dev == "cuda" else 0.1  # CPU bf16 autocast is often slower without AMX
        return (sign * t, 0.3 if dev == "cuda" else 0.5, sign * -0.2, 0.3)
    if {v, d} == {"bf16", "fp8"}:
        sign = 1 if v == "fp8" else -1
        return (sign * -0.2, 0.3, sign * -0.05, 0.2)
    return None


def _compile(v, d, dev):
    gain = {"off": 0.0, "default": -0.18, "max-autotune-no-cudagraphs": -0.22}
    if dev == "cpu":
        gain = {"off": 0.0, "default": -0.1, "max-autotune-no-cudagraphs": -0.1}
    if v not in gain or d not in gain:
        return None
    return (gain[v] - gain[d], 0.35, -0.1 if v != "off" and d == "off" else 0.0, 0.25)


def _data_parallel(v, d, dev):
    if {v, d} != {"ddp", "fsdp"}:
        return None
    sign = 1 if v == "fsdp" else -1
    return (sign * 0.08, 0.2, sign * -0.3, 0.3)


def _small(t, m, ts=0.1, ms=0.1):
    def rule(v, d, dev):
        return (t * (1 if v != d else 0), ts, m * (1 if v != d else 0), ms)
    return rule


def _bucket(v, d, dev):
    return (0.02 * abs(_ratio(v, d)) / math.log(4), 0.08, 0.0, 0.1)


def _optimizer(v, d, dev):
    t = {"for_loop": 0.06, "foreach": 0.0, "fused": -0.03 if dev == "cuda" else 0.0}
    m = {"for_loop": -0.02, "foreach": 0.0, "fused": -0.01}
    if v not in t or d not in t:
        return None
    return (t[v] - t[d], 0.1, m[v] - m[d], 0.1)


def _model_parallel(comm: float, mem: float) -> Rule:
    def rule(v, d, dev):
        r = _ratio(v, d) / math.log(2)  # doublings
        return (comm * r, 0.35, -mem * r, 0.3)
    return rule


def _zero(v, d, dev):
    try:
        dv = float(v) - float(d)
    except (TypeError, ValueError):
        return None
    return (0.03 * dv, 0.15, -0.12 * dv, 0.25)


RULES: dict[str, Rule] = {
    # torch workload launch names
    "num_workers": _workers,
    "num_threads": _threads,
    "micro_batch_size": _micro_batch,
    "mbs": _micro_batch,
    "gradient_accumulation_steps": _accumulation,
    "grad_acc": _accumulation,
    "activation_checkpointing": _checkpointing,
    "precision": _precision,
    "compile": _compile,
    "data_parallel": _data_parallel,
    "bucket_cap_mb": _bucket,
    "bucket_size_mb": _bucket,
    "gradient_as_bucket_view": _small(-0.01, -0.05),
    "reshard_after_forward": lambda v, d, dev: (-0.05, 0.1, 0.1, 0.15) if v is False else (0.05, 0.1, -0.1, 0.15),
    "optimizer_impl": _optimizer,
    "expert_parallel_degree": _model_parallel(0.1, 0.15),
    # simulator / playbook table names
    "data_parallel_degree": _workers,
    "dp": _workers,
    "tensor_parallel_degree": _model_parallel(0.12, 0.5),
    "tp": _model_parallel(0.12, 0.5),
    "sequence_parallel": _small(0.02, -0.1, 0.1, 0.15),  # norms' activations sharded over tp
    "pipeline_parallel_degree": _model_parallel(0.15, 0.45),
    "pp": _model_parallel(0.15, 0.45),
    "context_parallel_degree": _model_parallel(0.1, 0.3),
    "zero_stage": _zero,
    "zero": _zero,
    "overlap_communication": lambda v, d, dev: (0.1, 0.1, 0.0, 0.1) if v is False else (-0.1, 0.1, 0.0, 0.1),
    "pipeline_schedule": _small(-0.05, 0.05, 0.1, 0.15),
    "num_virtual_pipeline_stages": lambda v, d, dev: (-0.03 * _ratio(v, d), 0.1, 0.05 * _ratio(v, d), 0.15),
    "moe_dispatch": _small(-0.03, 0.0, 0.15, 0.1),
}


MeasuredRule = Callable[[Any, Any, str, Context], Effect | None]  # (value, default, device, context)
# Rules that read doctor's measurements (the context's ``findings``); None falls back to RULES.
MEASURED_RULES: dict[str, MeasuredRule] = {"precision": _precision_measured}


class ExpertProposer(Proposer):
    """Deterministic priors from :data:`RULES`; patches from the catalog and the bank."""

    name = "expert"

    def __init__(self, *, catalog: bool = True, patterns: bool = True) -> None:
        self.catalog = catalog
        self.patterns = patterns

    def priors(self, context: Context) -> list[KnobPrior]:
        space, dev = context["space"], device_kind(context)
        out = []
        for knob in space.knobs:
            if is_patch_knob(knob.name):
                out += self._patch_prior(knob, context)
                continue
            rule = RULES.get(knob.name)
            if rule is None:
                continue
            for v in knob.values:
                if v == knob.default:
                    continue
                measured = MEASURED_RULES.get(knob.name)
                eff = measured(v, knob.default, dev, context) if measured else None
                source = f"expert:{knob.name}" + (":measured" if eff is not None else "")
                if eff is None:
                    eff = rule(v, knob.default, dev)
                if eff is None:
                    continue
                t, ts, m, ms = eff
                out.append(KnobPrior(knob.name, v, t, ts, m, ms, source=source))
        return out

    def _patch_prior(self, knob, context: Context) -> list[KnobPrior]:
        by_knob = {p.knob: p for p in context.get("patches", ())}
        p = by_knob.get(knob.name)
        if p is None or p.expected_log_time_effect is None:
            return [KnobPrior(knob.name, True, -0.05, 0.2, 0.0, 0.2, source="expert:patch")]
        return [KnobPrior(knob.name, True, p.expected_log_time_effect, p.expected_log_time_std,
                          p.expected_log_mem_effect, p.expected_log_mem_std,
                          source=f"expert:patch:{p.origin}")]

    def patches(self, context: Context) -> list[Patch]:
        """Catalog and bank patches that apply cleanly to the workspace, then the pattern
        rules' rewrites of the files none of those was written for (unverified)."""
        ws = workspace_of(context)
        if ws is None:
            return []
        fam = family(context)
        catalog = list(honest_patches()) if self.catalog else []  # every family: see below
        candidates = [p for p in catalog if not p.families or fam in p.families]
        candidates += bank_patches(context)
        others = [p for p in catalog if p not in candidates]
        seen, out, covered = set(), [], set()
        scope = scope_of(context)
        with tempfile.TemporaryDirectory(prefix="infrarsi-expert-") as tmp:
            for i, p in enumerate(candidates + others):
                if p.digest in seen:
                    continue
                seen.add(p.digest)
                try:
                    apply_patch(p, copy_workspace(ws, Path(tmp) / f"w{i}"), scope)
                except DiffError:
                    continue  # written for another version of the code
                covered |= set(p.files())
                if i < len(candidates):
                    out.append(p)
        return out + self._pattern_patches(context, covered)

    def _pattern_patches(self, context: Context, covered: set[str]) -> list[Patch]:
        """The AST pattern rules' rewrites (:mod:`._patterns`) of the editable files that no
        applicable catalog or bank patch (of any family) was written for."""
        if not self.patterns:
            return []
        files = {rel: text for rel, text in editable_source(context, 400_000).items()
                 if rel not in covered}
        return pattern_patches(files)


def bank_patches(context: Context) -> list[Patch]:
    """Verified patches the bank holds for this code lineage, as Patch objects."""
    bank = context.get("bank")
    if bank is None:
        return []
    lineage = lineage_of(context)
    out = []
    for e in bank.patches(workload_lineage=lineage, verified=True):
        meta = e.evidence.get("patch", {}) if isinstance(e.evidence, dict) else {}
        try:
            out.append(Patch(e.patch_id, e.diff, origin=f"bank:{e.run_id}",
                             rationale=str(meta.get("rationale", "")),
                             expected_log_time_effect=meta.get("expected_log_time_effect"),
                             expected_log_mem_effect=meta.get("expected_log_mem_effect"),
                             families=tuple(meta.get("families", ()))))
        except Exception:  # noqa: BLE001 - a malformed bank row is skipped, not fatal
            continue
    return out
