"""Turn an LLM answer into priors and patches, refusing every kind of nonsense.

Each refusal is counted under a name (the caller's stats) and logged: malformed JSON, a
schema violation, an unknown knob, a setting outside the knob's domain, an out-of-range effect
or std, a diff that does not parse or names a file that does not exist, a patch id clash.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema

from infrarsi.models.priors import KnobPrior
from infrarsi.patches import DiffError, Patch, Scope, apply_patch, copy_workspace

log = logging.getLogger("infrarsi.proposers.llm")
MAX_EFFECT = 3.0  # |log effect| beyond e^3 = 20x is not a prior, it is noise
STD_RANGE = (0.01, 3.0)


class AnswerError(ValueError):
    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_json(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The answer as a dict; AnswerError(malformed_json | schema_invalid) otherwise."""
    t = text.strip()
    if t.startswith("```"):  # a fenced block despite the schema
        t = t.strip("`")
        t = t[t.find("{"):] if "{" in t else t
    try:
        data = json.loads(t)
    except json.JSONDecodeError as e:
        raise AnswerError(f"the answer is not valid JSON ({e.msg} at {e.pos})", "malformed_json") from None
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as e:
        raise AnswerError(f"the answer breaks the schema: {e.message}", "schema_invalid") from None
    return data


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _match_value(value: Any, domain: tuple[Any, ...]) -> tuple[bool, Any]:
    """The domain value ``value`` names (bools only match bools; "4" matches 4)."""
    for v in domain:
        if isinstance(v, bool) or isinstance(value, bool):
            if isinstance(v, bool) and isinstance(value, bool) and v == value:
                return True, v
            continue
        if v == value:
            return True, v
        if isinstance(v, (int, float)) and isinstance(value, str):
            try:
                if float(value) == v:
                    return True, v
            except ValueError:
                continue
    return False, None


def validate_priors(data: dict[str, Any], space: Any, stats: Counter, source: str) -> list[KnobPrior]:
    names = {k.name: k for k in space.knobs}
    out = []
    for item in data.get("priors", []):
        knob = names.get(item["knob"])
        if knob is None:
            _refuse(stats, "unknown_knob", f"unknown knob {item['knob']!r}")
            continue
        ok, value = _match_value(item["setting"], knob.values)
        if not ok:
            _refuse(stats, "out_of_domain", f"{knob.name}={item['setting']!r} not in {list(knob.values)}")
            continue
        if value == knob.default:
            continue  # an effect relative to itself
        effects = [item.get("log_time_effect"), item.get("log_mem_effect")]
        stds = [item.get("log_time_std"), item.get("log_mem_std")]
        if (any(e is not None and (not _finite(e) or abs(e) > MAX_EFFECT) for e in effects)
                or any(not _finite(s) or not STD_RANGE[0] <= s <= STD_RANGE[1] for s in stds)):
            _refuse(stats, "out_of_range", f"{knob.name}={value!r}: effects {effects}, stds {stds}")
            continue
        out.append(KnobPrior(knob.name, value, effects[0], float(stds[0]), effects[1],
                             float(stds[1]), source=source))
    return out


def validate_patches(data: dict[str, Any], workspace: Path | None, scope: Scope, stats: Counter,
                     origin: str) -> list[Patch]:
    out, ids = [], set()
    with tempfile.TemporaryDirectory(prefix="infrarsi-llm-") as tmp:
        for i, item in enumerate(data.get("patches", [])):
            pid = f"llm-{item['id']}"[:64]
            if pid in ids:
                _refuse(stats, "duplicate_id", f"patch id {pid} given twice")
                continue
            effects = (item["expected_log_time_effect"], item["expected_log_mem_effect"])
            if not all(_finite(e) and abs(e) <= MAX_EFFECT for e in effects):
                _refuse(stats, "out_of_range", f"patch {pid}: expected effects {effects}")
                continue
            try:
                patch = Patch(pid, item["diff"], origin=origin, rationale=item["rationale"][:2000],
                              expected_log_time_effect=float(effects[0]),
                              expected_log_mem_effect=float(effects[1]))
            except ValueError as e:
                _refuse(stats, "schema_invalid", f"patch {pid}: {e}")
                continue
            if workspace is not None:
                try:
                    apply_patch(patch, copy_workspace(workspace, Path(tmp) / f"w{i}"), scope)
                except DiffError as e:
                    kind = "missing_file" if "does not exist" in str(e) else (
                        "out_of_scope" if e.rule == "scope" else "bad_diff")
                    _refuse(stats, kind, f"patch {pid}: {e}")
                    continue
            ids.add(pid)
            out.append(patch)
    return out


def _refuse(stats: Counter, kind: str, message: str) -> None:
    stats[kind] += 1
    log.warning("LLM answer refused (%s): %s", kind, message)
