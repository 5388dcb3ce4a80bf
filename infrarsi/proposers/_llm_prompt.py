"""Prompts and JSON schemas of the LLM proposer.

The prompts carry what a performance engineer would look at: the doctor's bottleneck findings,
the knob space, the trials measured so far, the priors the data contradicted (with the
evidence, so the model revises them) and, for patches, the editable source. Each section is
capped so a prompt fits a modest context window.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from infrarsi.proposers.base import (
    Context,
    device_kind,
    editable_source,
    family,
    lineage_of,
)

SYSTEM = (
    "You are a performance engineer for PyTorch LLM training. You propose changes that make a "
    "training step faster WITHOUT changing what it computes: same tokens, same shapes, same "
    "number of optimizer steps, same numerics (fp32 stays fp32 unless the precision knob says "
    "otherwise), same random seed. The harness owns the clock, the data and the loss; every "
    "patch is verified against the baseline (gradients per parameter, loss trace, static scan "
    "for clocks, threads, environment, file writes, reseeding, monkeypatching) and rejected if "
    "it games the benchmark. Answer with JSON only, matching the given schema."
)

_NUM_OR_NULL = {"type": ["number", "null"]}

PRIORS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "priors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "knob": {"type": "string"},
                    "setting": {"type": ["string", "number", "boolean"]},
                    "log_time_effect": _NUM_OR_NULL,
                    "log_time_std": {"type": "number"},
                    "log_mem_effect": _NUM_OR_NULL,
                    "log_mem_std": {"type": "number"},
                    "rationale": {"type": "string"},
                },
                "required": ["knob", "setting", "log_time_effect", "log_time_std",
                             "log_mem_effect", "log_mem_std"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["priors"],
    "additionalProperties": False,
}

def _revision_schema() -> dict[str, Any]:
    """PRIORS_SCHEMA whose items must also say why the prior changed (``reason``)."""
    item = json.loads(json.dumps(PRIORS_SCHEMA["properties"]["priors"]["items"]))
    item["properties"]["reason"] = {"type": "string"}
    item["required"] = [*item["required"], "reason"]
    return {"type": "object", "properties": {"priors": {"type": "array", "items": item}},
            "required": ["priors"], "additionalProperties": False}


REVISION_SCHEMA: dict[str, Any] = _revision_schema()

PATCHES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "patches": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,48}$"},
                    "diff": {"type": "string"},
                    "rationale": {"type": "string"},
                    "expected_log_time_effect": {"type": "number"},
                    "expected_log_mem_effect": {"type": "number"},
                },
                "required": ["id", "diff", "rationale", "expected_log_time_effect",
                             "expected_log_mem_effect"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["patches"],
    "additionalProperties": False,
}


def _json(x: Any, limit: int) -> str:
    text = json.dumps(x, default=str, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + " ...(truncated)"


def knob_table(space: Any) -> list[dict[str, Any]]:
    return [{"knob": k.name, "values": list(k.values), "default": k.default, "kind": k.kind,
             "about": k.description} for k in space.knobs]


def _trial_rows(trials: Iterable[Any], defaults: Mapping[str, Any], limit: int = 40) -> list[dict]:
    rows = []
    for t in list(trials)[-limit:]:
        d = t.to_dict() if hasattr(t, "to_dict") else dict(t)
        cfg = d.get("config") or {}
        times = d.get("step_times_s") or []
        rows.append({
            "changed": {k: v for k, v in cfg.items() if defaults.get(k) != v},
            "status": d.get("status"),
            "median_step_s": sorted(times)[len(times) // 2] if times else None,
            "peak_memory_bytes": max(d.get("peak_memory_bytes") or [0]) or None,
            "error": (d.get("error_message") or "")[:120] or None,
        })
    return rows


def _revisions(context: Context) -> list[dict[str, Any]]:
    out = []
    for r in context.get("revisions") or ():
        d = r.to_dict() if hasattr(r, "to_dict") else dict(r)
        if d.get("flagged", True):
            out.append(d)
    return out


def _header(context: Context) -> list[str]:
    space = context["space"]
    wl, hw = context.get("workload"), context.get("hardware")
    parts = [
        f"Workload: family={family(context)}; signature={_json(getattr(wl, '__dict__', wl), 1500)}",
        f"Hardware: device={device_kind(context)}; {_json(getattr(hw, '__dict__', hw), 800)}",
        "Doctor's bottleneck findings (per-phase times, memory, noise):\n"
        + _json(context.get("findings") or {}, 4000),
        "Trials so far (knobs changed from the default, outcome):\n"
        + _json(_trial_rows(context.get("trials") or (), space.defaults()), 6000),
    ]
    revs = _revisions(context)
    if revs:
        parts.append("These earlier priors were MISCALIBRATED (the posterior fell outside the "
                     "prior's interval); revise them using the evidence:\n" + _json(revs, 4000))
    return parts


def priors_messages(context: Context) -> list[dict[str, str]]:
    space = context["space"]
    body = "\n\n".join(_header(context) + [
        "Knob space (effects are relative to each knob's default):\n" + _json(knob_table(space), 6000),
        "For each knob setting you have an opinion on, give log_time_effect (natural log of "
        "step-time ratio vs the default; -0.1 is ~10% faster) and log_mem_effect (same for peak "
        "memory per device), each with a std (0.05-2). Use only knob names and values listed "
        "above; use null for no opinion. |effect| <= 3.",
    ])
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body}]


def contract_rules(context: Context, max_examples: int = 40) -> str:
    """What a patch may not do: the scope, the frozen files, and rejected examples with why."""
    from infrarsi.patches import load_catalog
    from infrarsi.proposers.base import scope_of

    scope = scope_of(context)
    contract = context.get("contract")
    frozen = sorted(getattr(contract, "frozen_files", None) or {}) or list(scope.frozen)
    lines = [f"Editable paths (globs): {list(scope.editable) or ['everything not frozen']}",
             f"Frozen files (any change is rejected): {frozen}",
             "Rejected patches, as examples of what counts as gaming (check that caught it: why):"]
    try:
        examples = load_catalog("gaming")[:max_examples]
    except Exception:  # noqa: BLE001 - the rules above still stand without examples
        examples = []
    lines += [f"- {e.expect_rule or 'verifier'}: {e.patch.rationale.strip()}" for e in examples]
    return "\n".join(lines)


def earlier_verdicts(context: Context, limit: int = 20) -> list[dict[str, Any]]:
    """The bank's verdicts on earlier LLM patches for this code lineage (newest last)."""
    bank = context.get("bank")
    if bank is None:
        return []
    lineage = lineage_of(context)
    try:
        entries = bank.patches(lineage)
    except Exception:  # noqa: BLE001 - the prompt goes without them
        return []
    out = []
    for e in entries:
        ev = e.evidence if isinstance(e.evidence, dict) else {}
        if not str(getattr(e, "origin", "") or ev.get("patch", {}).get("origin", "")).startswith("llm"):
            continue
        out.append({"id": e.patch_id, "accepted": bool(e.verified), "rule": ev.get("rule", ""),
                    "reason": str(ev.get("reason", ""))[:300], "files": list(e.files or [])})
    return out[-limit:]


def profile_text(context: Context) -> str:
    """Where the step's time goes, from doctor's findings (phase fractions), for the patches."""
    fr = (context.get("findings") or {}).get("phase_fractions") or {}
    if not fr:
        return "Where time goes: no doctor profile (run `infrarsi doctor` for one)."
    parts = ", ".join(f"{k} {v:.0%}" for k, v in sorted(fr.items(), key=lambda kv: -kv[1])
                      if isinstance(v, (int, float)))
    return f"Where the step's time goes (doctor's phase profile): {parts}"


def patches_messages(context: Context, max_source_chars: int = 40_000) -> list[dict[str, str]]:
    src = editable_source(context, max_source_chars)
    files = "\n\n".join(f"=== {rel} ===\n{text}" for rel, text in src.items())
    verdicts = earlier_verdicts(context)
    body = "\n\n".join(_header(context) + [
        profile_text(context),
        "The contract's rules (every patch is verified against them):\n" + contract_rules(context),
        *(["Verdicts on your earlier patches for this code (learn from the rejections):\n"
           + _json(verdicts, 4000)] if verdicts else []),
        f"Editable source files (paths relative to the workspace root):\n{files}",
        "Propose up to 3 source patches that make the training step faster without changing "
        "what it computes. Each patch is a unified diff against the files above exactly as "
        "shown (--- a/<path> / +++ b/<path>, @@ hunks with 3 lines of context). Only edit the "
        "files above; do not touch the harness, timing, data, seeds, precision or threads.",
    ])
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body}]


def repair_messages(context: Context, rejected: Iterable[tuple[Any, Any]]) -> list[dict[str, str]]:
    """The patch prompt again, plus the verifier's reason for each rejected patch (once)."""
    messages = patches_messages(context)
    items = [{"id": p.id, "rule": v.rule, "reason": str(v.reason)[:600], "diff": p.diff[:3000]}
             for p, v in rejected]
    messages.append({"role": "user", "content": (
        "The verifier REJECTED these patches of yours (rule: the check that failed; reason: "
        "what it measured):\n" + _json(items, 12000) + "\n\nReturn corrected patches that "
        "pass every check (same JSON schema), or an empty list if a patch cannot be made "
        "honest. Do not resend a rejected diff unchanged.")})
    return messages


def _prior_rows(priors: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"knob": p.knob, "setting": p.setting, "log_time_effect": p.log_time_effect,
             "log_time_std": p.log_time_std, "log_mem_effect": p.log_mem_effect,
             "log_mem_std": p.log_mem_std, "source": p.source} for p in priors]


def revision_messages(context: Context, current: Iterable[Any]) -> list[dict[str, str]]:
    """Show the model its priors next to what the live trials measured; ask for revisions."""
    judged = [r.to_dict() if hasattr(r, "to_dict") else dict(r)
              for r in context.get("revisions") or ()]
    space = context["space"]
    body = "\n\n".join([
        f"Workload: family={family(context)}; device={device_kind(context)}",
        "Knob space (effects are relative to each knob's default):\n"
        + _json(knob_table(space), 4000),
        "The priors the search uses now (natural-log effects vs the default):\n"
        + _json(_prior_rows(current), 6000),
        "What the live trials measured, per prior (prior_mean/std: the prior; posterior_mean/"
        "std: the effect fitted on the trials; evidence_n: trials run at that setting; flagged: "
        "the measurement lies outside the prior's 95% interval):\n" + _json(judged, 6000),
        "Trials so far (knobs changed from the default, outcome):\n"
        + _json(_trial_rows(context.get("trials") or (), space.defaults()), 4000),
        "Revise the priors the measurements contradict (and any others the evidence teaches "
        "you about). Return ONLY the knob settings whose prior you change, each with the full "
        "revised effects and stds and a one-sentence reason citing the evidence. Use only knob "
        "names and values listed above; |effect| <= 3; std 0.05-2.",
    ])
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body}]
