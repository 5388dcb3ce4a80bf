"""The run stage's patch step: propose, verify, record, before the search starts.

The proposer (the LLM one when the task spec has an ``llm:`` section, falling back to the
expert; else the expert: catalog patches plus the bank's verified patches of this code lineage)
gives candidate patches. Each is verified with :func:`verify_patch` against the run's contract,
unless the bank already holds a verdict for the same inputs (patch diff, workspace content,
scope, frozen hashes, work and timing: the ``verify_key``), which is then reused. Every verdict,
accepted or rejected with its rule and reason, goes to the bank and to ``patches.json`` in the
run directory, one progress line each. A crashing proposer or verifier costs that patch (or all
patches), never the run.

A resumed run reads its verified patches back from ``patches.json``, so the search space is the
one the dead driver searched.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.errors import PackageDataError
from infrarsi.patches import Patch, PatchVerdict, Scope, find_conflicts, tree_digest, verify_patch
from infrarsi.rundir import PATCHES_FILE, write_json


@dataclass
class PatchSetup:
    """What the search gets: verified patches and the pairs that do not apply together."""

    verified: list[Patch] = field(default_factory=list)
    conflicts: list[tuple[str, str, str]] = field(default_factory=list)
    enabled: bool = True


def make_proposer(spec: Any, progress=print):
    """The LLM proposer when the spec configures one (it falls back to the expert by itself),
    else the expert proposer."""
    from infrarsi.proposers import ExpertProposer, LLMProposer

    if getattr(spec, "llm", None) is not None:
        try:
            return LLMProposer.from_spec(spec)
        except Exception as e:  # noqa: BLE001 - a bad llm section costs the LLM, not the run
            progress(f"warning: the LLM proposer could not start ({e}); using the expert proposer")
    return ExpertProposer()


def verify_key(patch: Patch, workspace_digest: str, contract: Any) -> str:
    """Everything a verdict depends on: the same key gives the same verdict."""
    scope = Scope.from_contract(contract)
    task = contract.task
    body = {"patch": patch.digest, "workspace": workspace_digest,
            "editable": list(scope.editable), "frozen": list(scope.frozen),
            "frozen_files": contract.frozen_files,
            **{k: task.get(k) for k in ("workload", "timing", "loss_reference", "hardware")}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def prepare_patches(session: Any, *, enabled: bool = True, resume: bool = False,
                    proposer: Any = None) -> PatchSetup:
    """Propose, verify and record patches for ``session`` (a RunSession); see the module doc."""
    path = session.run_dir / PATCHES_FILE
    if resume and path.is_file():
        return _from_file(path, session.progress)
    if not enabled:
        session.progress("patches: off (--no-patches); searching launch knobs only")
        _write(path, {"enabled": False, "candidates": [], "verified": [], "conflicts": []})
        return PatchSetup(enabled=False)
    progress = session.progress
    spec, contract = session.spec, session.contract
    workspace = spec.workspace_path()
    lineage = _lineage(session)
    from infrarsi.proposers import ProposerContext

    context = ProposerContext(
        space=session.backend.space, workload=session.backend.workload,
        hardware=session.backend.hardware, spec=spec, contract=contract, workspace=workspace,
        bank=session.bank, run_id=session.run_id, lineage=lineage,
        findings=session.findings or {})
    proposer = proposer or make_proposer(spec, progress)
    candidates = _dedupe(_propose(proposer, context, progress))
    name = getattr(proposer, "name", type(proposer).__name__)
    if not candidates:
        progress(f"patches: the {name} proposer has none for this workload")
    else:
        progress(f"patches: {len(candidates)} candidate(s) from the {name} proposer; verifying "
                 "each against the contract")
    ws_digest = tree_digest(workspace)
    known = _bank_verdicts(session, lineage)
    rows, verified, rejected = [], [], []
    for p in candidates:
        verdict = _check(session, p, workspace, ws_digest, known, rows)
        (verified if verdict.accepted else rejected).append((p, verdict))
    for p in _repaired(proposer, context, rejected, progress, {q.digest for q in candidates}):
        if _check(session, p, workspace, ws_digest, known, rows).accepted:
            verified.append((p, None))
    verified = [p for p, _ in verified]
    conflicts = _conflicts(verified, workspace, contract, progress)
    if verified:
        progress(f"patches: {len(verified)} verified, searched as knobs "
                 + ", ".join(p.knob for p in verified)
                 + (f"; {len(conflicts)} conflicting pair(s) kept apart" if conflicts else ""))
    _write(path, {"enabled": True, "proposer": name, "workspace": str(workspace),
                  "workspace_digest": ws_digest, "candidates": rows,
                  "verified": [p.to_dict() for p in verified],
                  "conflicts": [list(c) for c in conflicts]})
    return PatchSetup(verified, conflicts)


# ---- steps --------------------------------------------------------------------------------
def _check(session: Any, p: Patch, workspace: Path, ws_digest: str,
           known: dict[str, tuple[PatchVerdict, str]], rows: list[dict[str, Any]]) -> PatchVerdict:
    """Verify ``p`` (or reuse the bank's verdict on the same inputs); record and report it."""
    key = verify_key(p, ws_digest, session.contract)
    reused = known.get(key)
    if reused is not None:
        verdict, source = reused
    else:
        verdict, source = _verify(p, workspace, session.contract), None
    evidence = {**verdict.evidence, "accepted": verdict.accepted, "rule": verdict.rule,
                "reason": verdict.reason, "patch_digest": p.digest,
                "workspace_digest": ws_digest, "verify_key": key, "reused_from": source,
                "patch": _meta(p)}
    _record(session, p, verdict, evidence)
    rows.append({"id": p.id, "origin": p.origin, "digest": p.digest,
                 "accepted": verdict.accepted, "rule": verdict.rule, "reason": verdict.reason,
                 "files": list(verdict.evidence.get("files") or p.files()),
                 "reused_from": source,
                 "verify_seconds": verdict.evidence.get("verify_seconds"),
                 "rationale": p.rationale})
    session.progress(_line(p, verdict, source))
    return verdict


def _repaired(proposer: Any, context: Any, rejected: list, progress, seen: set[str]) -> list[Patch]:
    """One round of feedback: the proposer's own rejected patches go back with the verifier's
    reasons, and what it returns is verified like any candidate (never fed back again)."""
    mine = [(p, v) for p, v in rejected if p.origin.startswith("llm")]
    if not mine or not hasattr(proposer, "repair"):
        return []
    try:
        fixed = [p for p in proposer.repair(context, mine) if p.digest not in seen]
    except Exception as e:  # noqa: BLE001 - the rejections stand; the run goes on
        progress(f"warning: the {getattr(proposer, 'name', '')} proposer's repair failed ({e})")
        return []
    taken = {p.id for p, _ in rejected}
    fixed = _dedupe([p if p.id not in taken else Patch.from_dict({**p.to_dict(), "id": f"{p.id[:58]}-r1"})
                     for p in fixed])
    progress(f"patches: {len(mine)} rejected LLM patch(es) fed back with the reasons; "
             f"{len(fixed)} corrected candidate(s) returned")
    return fixed


def _propose(proposer: Any, context: Any, progress) -> list[Patch]:
    from infrarsi.proposers import ExpertProposer

    try:
        return list(proposer.patches(context))
    except PackageDataError:  # a broken installation (e.g. catalog diffs missing) is no warning
        raise
    except Exception as e:  # noqa: BLE001 - a proposer's crash must not stop the run
        progress(f"warning: the {getattr(proposer, 'name', 'patch')} proposer failed ({e})")
    if isinstance(proposer, ExpertProposer):
        return []
    try:
        return list(ExpertProposer().patches(context))
    except PackageDataError:
        raise
    except Exception as e:  # noqa: BLE001
        progress(f"warning: the expert proposer failed too ({e}); searching without patches")
        return []


def _dedupe(patches: list[Patch]) -> list[Patch]:
    """One patch per diff; a second diff under a taken id gets a content-suffixed id."""
    seen_digest, seen_id, out = set(), set(), []
    for p in patches:
        if p.digest in seen_digest:
            continue
        seen_digest.add(p.digest)
        if p.id in seen_id:
            p = Patch.from_dict({**p.to_dict(), "id": f"{p.id[:53]}-{p.digest[:10]}"})
        seen_id.add(p.id)
        out.append(p)
    return out


def _verify(patch: Patch, workspace: Path, contract: Any) -> PatchVerdict:
    t0 = time.perf_counter()
    try:
        return verify_patch(patch, workspace=workspace, contract=contract)
    except Exception as e:  # noqa: BLE001 - a verifier crash rejects the patch, not the run
        return PatchVerdict(patch.id, False, f"the verifier crashed: {type(e).__name__}: {e}",
                            "crash", {"files": list(patch.files()),
                                      "verify_seconds": round(time.perf_counter() - t0, 3)})


def _bank_verdicts(session: Any, lineage: str) -> dict[str, tuple[PatchVerdict, str]]:
    """verify_key -> (verdict, run id) of the latest reusable verdict in the bank."""
    out: dict[str, tuple[PatchVerdict, str]] = {}
    try:
        entries = session.bank.patches(lineage)
    except Exception as e:  # noqa: BLE001
        session.progress(f"warning: could not read earlier patch verdicts from the bank ({e}); "
                         "verifying every patch")
        return out
    for e in entries:  # oldest first: a later verdict replaces an earlier one
        ev = e.evidence if isinstance(e.evidence, dict) else {}
        key = ev.get("verify_key")
        if not key or ev.get("rule") == "crash":  # a crash says nothing about the patch
            continue
        evidence = {k: v for k, v in ev.items()
                    if k not in ("accepted", "rule", "reason", "verify_key", "reused_from",
                                 "patch_digest", "workspace_digest", "patch")}
        out[key] = (PatchVerdict(e.patch_id, bool(e.verified), ev.get("reason", ""),
                                 ev.get("rule", ""), evidence), ev.get("reused_from") or e.run_id)
    return out


def _record(session: Any, patch: Patch, verdict: PatchVerdict, evidence: dict[str, Any]) -> None:
    try:
        if any(e.patch_id == patch.id for e in session.bank.patches(run_id=session.run_id)):
            return  # this run already recorded it (a resume that lost patches.json)
        session.bank.record_patch(session.run_id, patch.id, patch.diff,
                                  verdict.evidence.get("files") or patch.files(), evidence,
                                  verdict.accepted, origin=patch.origin)
    except Exception as e:  # noqa: BLE001 - the verdict stands; only its ledger row is lost
        session.progress(f"warning: could not record patch {patch.id} in the bank ({e})")


def _conflicts(verified: list[Patch], workspace: Path, contract: Any, progress) -> list:
    if len(verified) < 2:
        return []
    try:
        return [tuple(c) for c in find_conflicts(verified, workspace, Scope.from_contract(contract))]
    except Exception as e:  # noqa: BLE001 - then a bad combination fails as its own trial
        progress(f"warning: could not check which patches apply together ({e})")
        return []


def _lineage(session: Any) -> str:
    try:
        return session.bank.get_run(session.run_id).lineage
    except Exception:  # noqa: BLE001
        return session.spec.name


def _meta(p: Patch) -> dict[str, Any]:
    return {"origin": p.origin, "rationale": p.rationale, "families": list(p.families),
            "expected_log_time_effect": p.expected_log_time_effect,
            "expected_log_mem_effect": p.expected_log_mem_effect}


def _line(p: Patch, v: PatchVerdict, reused_from: str | None) -> str:
    head = f"patch {p.id} ({p.origin}): "
    secs = v.evidence.get("verify_seconds")
    how = (f" (verdict reused from run {reused_from})" if reused_from
           else f" ({secs:.0f} s)" if isinstance(secs, (int, float)) else "")
    if v.accepted:
        return head + "accepted" + how
    return head + f"REJECTED by the {v.rule or 'verifier'} check: {v.reason}" + how


def _write(path: Path, body: dict[str, Any]) -> None:
    write_json(path, body)


def load_setup(run_dir: Path) -> PatchSetup | None:
    """The verified patches a run searched (its ``patches.json``), or None when it has none."""
    path = Path(run_dir) / PATCHES_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    verified = [Patch.from_dict(d) for d in data.get("verified") or []]
    conflicts = [tuple(c) for c in data.get("conflicts") or []]
    return PatchSetup(verified, conflicts, bool(data.get("enabled", True)))


def _from_file(path: Path, progress) -> PatchSetup:
    setup = load_setup(path.parent)
    progress(f"resume: {len(setup.verified)} verified patch(es) from {path.name}"
             + (f": {', '.join(p.id for p in setup.verified)}" if setup.verified else ""))
    return setup


def promoted_patches(config: dict[str, Any], verified: list[Patch]) -> list[dict[str, Any]]:
    """The patches a promoted config turns on: id, origin, files and diff (what apply writes)."""
    from infrarsi.patches import enabled_patches

    return [{"id": p.id, "origin": p.origin, "files": list(p.files()), "digest": p.digest,
             "diff": p.diff} for p in enabled_patches(config, verified)]
