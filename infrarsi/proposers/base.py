"""The proposer interface: priors on knob effects and candidate patches, from one context.

The context is a plain mapping (the run stage builds it; every key but ``space`` is optional):

=============== ====================================================================
key             what
=============== ====================================================================
space           the SearchSpace being searched (knob names, domains, defaults)
workload        WorkloadSignature (family, shape)
hardware        HardwareFingerprint (device name, memory, interconnect)
spec            TaskSpec (device, scope, llm settings)
workspace       path of the user's workspace (its editable source goes into prompts)
findings        doctor's bottleneck findings (a plain dict: phase times, peak memory...)
trials          measured trials so far (TrialRecord or their ``to_dict()``)
revisions       miscalibrated priors: PriorRevision or its ``to_dict()``, with evidence
bank, run_id    the ExperienceBank and this run (bank patches, LLM audit log)
lineage         the workload's code lineage (default: the task name)
=============== ====================================================================

Patches a proposer returns are candidates: the caller verifies each with
:func:`infrarsi.patches.verify_patch` before it becomes a knob, whatever its origin.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infrarsi.models.priors import KnobPrior
from infrarsi.patches import Patch, Scope

Context = Mapping[str, Any]


class Proposer(abc.ABC):
    """Gives priors (expected effect of each knob setting) and candidate patches."""

    name: str = "proposer"

    @abc.abstractmethod
    def priors(self, context: Context) -> list[KnobPrior]:
        """One KnobPrior per (knob, non-default setting) it has an opinion on."""

    def patches(self, context: Context) -> list[Patch]:
        """Candidate source patches (unverified). Default: none."""
        return []


def device_kind(context: Context) -> str:
    """"cuda" or "cpu" from the spec, else from the hardware fingerprint's device name."""
    spec = context.get("spec")
    if spec is not None:
        return spec.hardware.device
    hw = context.get("hardware")
    name = str(getattr(hw, "device_name", "") or "").lower()
    return "cpu" if name in ("", "cpu") else "cuda"


def family(context: Context) -> str:
    spec = context.get("spec")
    if spec is not None:
        return spec.workload.family
    wl = context.get("workload")
    return str(getattr(wl, "model_family", "dense") or "dense")


def scope_of(context: Context) -> Scope:
    if context.get("contract") is not None:
        return Scope.from_contract(context["contract"])
    if context.get("spec") is not None:
        return Scope.from_spec(context["spec"])
    return Scope()


def workspace_of(context: Context) -> Path | None:
    ws = context.get("workspace")
    if ws is None and context.get("spec") is not None:
        ws = context["spec"].workspace_path()
    return Path(ws) if ws is not None else None


def editable_source(context: Context, max_chars: int = 60_000) -> dict[str, str]:
    """The workspace's editable, non-frozen text files (what a patch may change)."""
    from infrarsi.patches._scope import glob_match

    ws, scope = workspace_of(context), scope_of(context)
    if ws is None:
        return {}
    out, total = {}, 0
    for p in sorted(ws.rglob("*")):
        rel = str(p.relative_to(ws))
        if (not p.is_file() or p.is_symlink() or "__pycache__" in p.parts
                or not glob_match(rel, scope.editable) or glob_match(rel, scope.frozen)):
            continue
        text = p.read_text(errors="replace")
        if total + len(text) > max_chars:
            break
        out[rel] = text
        total += len(text)
    return out
