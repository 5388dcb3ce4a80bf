"""``verify_patch``: every patch is untrusted code that may be gaming the benchmark.

Order of the checks (cheapest first; the first failure is the stated reason):

1. **scope** — every path relative, inside the workspace, editable, not frozen, no symlink,
   no mode change, rename, copy or binary hunk (:mod:`._diff`, :mod:`._scope`);
2. **apply** — the diff applies to an isolated copy (never the user's tree);
3. **frozen** — the copy's frozen files still hash to the contract's;
4. **static** — no new forbidden construct in a written file (:mod:`._static`);
5. **probe** — outputs, losses and per-parameter gradients equal the baseline's on every call
   of a one-rank trial, plus the tamper sentinels (:mod:`._dynamic`);
6. **training** — the harness's loss trace over every timed step equals the baseline's.

A ``PatchVerdict`` carries the reason and the evidence (what each check measured).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.contract.contract import DEFAULT_LOSS_RTOL
from infrarsi.contract.spec import TaskSpec
from infrarsi.patches import _dynamic as D
from infrarsi.patches._diff import DiffError
from infrarsi.patches._isolated import run_checks, run_isolated
from infrarsi.patches._patch import Patch
from infrarsi.patches._static import new_findings
from infrarsi.patches._workspace import (
    Scope,
    apply_patch,
    check_frozen,
    copy_workspace,
    tree_digest,
)

# Tolerances of the verifier (relative, fp32, same config and world size on both sides, so only
# summation order may differ: honest patches measure ~1e-7). A silent bf16 cast of the attention
# scores measures ~1e-4 on the gradients of a tiny model; a stale weight cache ~1e-4 on the loss
# after one optimizer step. The contract's own loss tolerance (for trials across configs) is
# looser; the verifier uses the smaller of the two.
GRAD_RTOL = 1e-5
LOSS_RTOL = 1e-5


@dataclass(frozen=True)
class PatchVerdict:
    """The outcome of :func:`verify_patch`. ``rule`` names the failed check ("" when accepted):
    scope, apply, frozen, static, seed, tamper, work, gradient, loss, crash."""

    patch_id: str
    accepted: bool
    reason: str
    rule: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_BASELINE_CACHE: dict[tuple[str, str], list[float]] = {}


def _default_config(spec: TaskSpec) -> dict[str, Any]:
    from infrarsi.workloads import build_torch_space

    space = build_torch_space(spec)
    base = space.normalize(space.defaults(), check=False)
    base.update(num_workers=1, num_threads=1, precision="fp32", compile="off",
                activation_checkpointing="none", micro_batch_size=1)
    if "expert_parallel_degree" in base:
        base["expert_parallel_degree"] = 1
    return space.normalize(base)


def verify_patch(patch: Patch, *, workspace: str | Path, spec: TaskSpec | None = None,
                 contract: Any = None, scope: Scope | None = None,
                 config: dict[str, Any] | None = None, probe_calls: int | None = None,
                 training: bool = True, keep: Path | None = None, isolated: bool = True,
                 timeout_s: float = 600.0) -> PatchVerdict:
    """Apply ``patch`` to an isolated copy of ``workspace`` and judge it (see module doc).

    Give ``contract`` (preferred: its scope, frozen hashes and loss tolerance) or ``spec``.
    ``config`` is the one-rank config of the training check (default: the baseline at
    ``num_workers=1``, fp32, eager). ``keep``: copy the patched workspace there when accepted.
    ``isolated``: run the patched code in a child process (default; in-process is faster but
    lets a tampering patch reach this process until it is detected and undone).
    """
    if spec is None:
        if contract is None:
            raise ValueError("verify_patch needs spec= or contract=")
        spec = contract.spec()
    scope = scope or (Scope.from_contract(contract) if contract is not None else Scope.from_spec(spec))
    rtol_loss = min(LOSS_RTOL, contract.loss_rtol("fp32") if contract is not None
                    else DEFAULT_LOSS_RTOL["fp32"])
    workspace = Path(workspace).resolve()
    ev: dict[str, Any] = {"patch_id": patch.id, "origin": patch.origin, "files": list(patch.files())}
    t0 = time.perf_counter()

    def verdict(rule: str, reason: str) -> PatchVerdict:
        ev["verify_seconds"] = round(time.perf_counter() - t0, 3)
        return PatchVerdict(patch.id, not rule, reason or "accepted", rule, ev)

    with tempfile.TemporaryDirectory(prefix="infrarsi-verify-") as tmp:
        root = copy_workspace(workspace, Path(tmp) / "ws")
        try:
            written = apply_patch(patch, root, scope)
        except DiffError as e:
            return verdict(e.rule, str(e))
        ev["files"] = written
        problem = check_frozen(root, scope, workspace)
        if problem:
            return verdict("frozen", problem)
        findings = []
        for rel in written:
            before = (workspace / rel).read_text() if (workspace / rel).is_file() else None
            after = (root / rel).read_text() if (root / rel).is_file() else None
            if after is not None and rel.endswith(".py"):
                findings += [f"{rel}: {f}" for f in new_findings(before, after, rel)]
        ev["static_findings"] = findings
        if findings:
            return verdict("static", "forbidden construct(s): " + "; ".join(findings))
        digest = tree_digest(root)
        try:
            ev.update(_dynamic(str(workspace), str(root), spec, config, probe_calls,
                               training, rtol_loss, isolated, timeout_s))
        except D.CheckFailed as e:
            return verdict(e.rule, str(e))
        if tree_digest(root) != digest:
            return verdict("tamper", "the patched code wrote into its own workspace")
        if keep is not None:
            copy_workspace(root, Path(keep))
    return verdict("", "")


def _dynamic(base_ws: str, patched_ws: str, spec: TaskSpec, config: dict[str, Any] | None,
             probe_calls: int | None, training: bool, rtol_loss: float,
             isolated: bool, timeout_s: float) -> dict[str, Any]:
    vspec = D.verification_spec(spec)
    cfg = dict(config or _default_config(vspec))
    key = (tree_digest(Path(base_ws)), repr((vspec.to_dict(), sorted(cfg.items()))))
    req = {"base_ws": base_ws, "patched_ws": patched_ws, "task": spec.to_dict(), "config": cfg,
           "probe_calls": probe_calls, "training": training, "loss_rtol": rtol_loss,
           "grad_rtol": GRAD_RTOL, "baseline_trace": _BASELINE_CACHE.get(key)}
    out = run_isolated(req, timeout_s) if isolated else run_checks(req)
    if out.get("baseline_trace") and training:
        _BASELINE_CACHE[key] = out["baseline_trace"]
        out["evidence"]["baseline_trace"] = out["baseline_trace"]
    if not out["ok"]:
        raise D.CheckFailed(out["reason"], out["rule"])
    return out["evidence"]
