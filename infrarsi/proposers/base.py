"""The proposer interface: priors on knob effects and candidate patches, from one context.

The context is a :class:`ProposerContext` (the run stage builds it; every field but ``space``
is optional). It is also a read-only mapping of its set fields, so ``context.get("findings")``
reads the same as ``context.findings``, and a plain dict with the same keys is accepted where a
context is (tests, notebooks); :meth:`ProposerContext.of` checks such a dict's keys.

Patches a proposer returns are candidates: the caller verifies each with
:func:`infrarsi.patches.verify_patch` before it becomes a knob, whatever its origin.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from infrarsi.errors import ConfigError
from infrarsi.models.priors import KnobPrior
from infrarsi.patches import Patch, Scope


@dataclass(frozen=True, eq=False)
class ProposerContext(Mapping):
    """What a proposer is told about the run (the one argument of ``priors`` and ``patches``)."""

    space: Any  #: the SearchSpace being searched (knob names, domains, defaults)
    workload: Any = None  #: WorkloadSignature (family, shape)
    hardware: Any = None  #: HardwareFingerprint (device name, memory, interconnect)
    spec: Any = None  #: TaskSpec (device, scope, llm settings)
    contract: Any = None  #: the locked Contract (its scope bounds what a patch may touch)
    workspace: Path | None = None  #: the user's workspace (its editable source goes into prompts)
    findings: Mapping[str, Any] = field(default_factory=dict)  #: doctor's digest (phases, memory...)
    trials: Sequence[Any] = ()  #: measured trials so far (TrialRecord or their ``to_dict()``)
    revisions: Sequence[Any] = ()  #: miscalibrated priors (PriorRevision or ``to_dict()``)
    patches: Sequence[Any] = ()  #: the run's verified patches (their knobs are in ``space``)
    bank: Any = None  #: the ExperienceBank (bank patches, the LLM audit log)
    run_id: str | None = None  #: this run's id in the bank
    lineage: str | None = None  #: the workload's code lineage (default: the task name)

    @classmethod
    def of(cls, context: Mapping[str, Any]) -> ProposerContext:
        """``context`` as a ProposerContext; a plain mapping's unknown keys are an error."""
        if isinstance(context, ProposerContext):
            return context
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(context) - known)
        if unknown or "space" not in context:
            raise ConfigError(
                f"proposer context: unknown key(s) {unknown} or no 'space'; the keys are "
                f"{sorted(known)}")
        return cls(**dict(context))

    # read-only mapping of the fields that are set (None and empty fields are absent)
    def _set(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) not in (None, (), {})]

    def __getitem__(self, key: str) -> Any:
        if key not in self._set():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._set())

    def __len__(self) -> int:
        return len(self._set())


Context = Mapping[str, Any]  # a ProposerContext, or a plain mapping with its keys


class Proposer(abc.ABC):
    """Gives priors (expected effect of each knob setting) and candidate patches."""

    name: str = "proposer"

    @abc.abstractmethod
    def priors(self, context: Context) -> list[KnobPrior]:
        """One KnobPrior per (knob, non-default setting) it has an opinion on."""

    def patches(self, context: Context) -> list[Patch]:
        """Candidate source patches (unverified). Default: none."""
        return []

    def revise(self, context: Context, current: list[KnobPrior]) -> list[tuple[KnobPrior, str]]:
        """Revised priors with a reason each, given ``context["revisions"]`` (the current
        priors judged by the live trials). Default: none (rules do not change their minds)."""
        return []


def lineage_of(context: Context) -> str | None:
    """The code lineage the bank files patches under: the context's ``lineage``, else the task
    name (None without either)."""
    lineage = context.get("lineage")
    if lineage is None and context.get("spec") is not None:
        lineage = context["spec"].name
    return lineage


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
