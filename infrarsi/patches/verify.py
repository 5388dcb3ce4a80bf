"""``verify_patch``: every patch is untrusted code that may be gaming the benchmark.

Order of the checks (cheapest first; the first failure is the stated reason):

1. **scope** — every path relative, inside the workspace, editable, not frozen, no symlink,
   no mode change, rename, copy or binary hunk (:mod:`._diff`, :mod:`._scope`);
2. **apply** — the diff applies to an isolated copy (never the user's tree);
3. **frozen** — the copy's frozen files still hash to the contract's;
4. **static** — no new forbidden construct in a written file (:mod:`._static`);
5. **probe** — outputs, losses and per-parameter gradients equal the baseline's on every call
   of a one-rank trial, plus the tamper sentinels (:mod:`._dynamic`);
6. **training** — the harness's loss trace over every step equals the baseline's, and the
   parameters and optimizer state after the last step match the baseline's (``checksum``: no
   step, the last included, skipped work); the clock agrees with an outside timer (``clock``);
   the harness's namespaces, thread counts, numerics and environment are unchanged at every
   step boundary (``tamper``, ``threads``, ``numerics``); the sandbox refused nothing
   (``sandbox``).

Two processes per verdict (:mod:`._isolated`): the baseline's reference is computed in a clean
process that never imports patched code, cached per contract (workspace content, task, config)
for this verifier process, and the candidate runs sandboxed in another one, under a process
group as real trials are.

A ``PatchVerdict`` carries the reason and the evidence (what each check measured).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.contract.contract import DEFAULT_LOSS_RTOL
from infrarsi.contract.spec import TaskSpec
from infrarsi.patches import _dynamic as D
from infrarsi.patches._diff import DiffError
from infrarsi.patches._isolated import candidate_checks, run_isolated
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
    scope, apply, frozen, static, seed, tamper, sandbox, clock, threads, numerics, work,
    gradient, loss, checksum, crash."""

    patch_id: str
    accepted: bool
    reason: str
    rule: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# contract key -> the clean baseline process's result (its probe reference file lives in
# _REF_DIR, removed when this process exits).
_BASELINE_CACHE: dict[tuple[str, str], dict[str, Any]] = {}
_REF_DIR: list[Path] = []


def _ref_dir() -> Path:
    if not _REF_DIR:
        _REF_DIR.append(Path(tempfile.mkdtemp(prefix="infrarsi-baseline-")))
        atexit.register(shutil.rmtree, _REF_DIR[0], True)
    return _REF_DIR[0]


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
                 timeout_s: float = 600.0, static: bool = True,
                 guards: bool = True) -> PatchVerdict:
    """Apply ``patch`` to an isolated copy of ``workspace`` and judge it (see module doc).

    Give ``contract`` (preferred: its scope, frozen hashes and loss tolerance) or ``spec``.
    ``config`` is the one-rank config of the training check (default: the baseline at
    ``num_workers=1``, fp32, eager). ``keep``: copy the patched workspace there when accepted.
    ``isolated``: run the patched candidate in its own sandboxed child process under a process
    group (default, as ``infrarsi run`` does). False runs it in this process without the
    sandbox or the process group (debugging only: a tampering patch reaches this process until
    detected and undone). The baseline always runs in its own clean process. ``static=False``
    skips the static scan (only to test that the dynamic checks catch what it would);
    ``guards=False`` skips the candidate's thread-count and numerics checks (the guard inside
    forward and the comparison at every step boundary: only to test that they are what rejects).
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
        if findings and static:
            return verdict("static", "forbidden construct(s): " + "; ".join(findings))
        digest = tree_digest(root)
        try:
            ev.update(_dynamic(str(workspace), str(root), spec, config, probe_calls,
                               training, rtol_loss, isolated, timeout_s, guards))
        except D.CheckFailed as e:
            ev.update(e.evidence)  # what passed before it (e.g. the loss trace's agreement)
            return verdict(e.rule, str(e))
        if tree_digest(root) != digest:
            return verdict("tamper", "the patched code wrote into its own workspace")
        if keep is not None:
            copy_workspace(root, Path(keep))
    return verdict("", "")


def _dynamic(base_ws: str, patched_ws: str, spec: TaskSpec, config: dict[str, Any] | None,
             probe_calls: int | None, training: bool, rtol_loss: float,
             isolated: bool, timeout_s: float, guards: bool = True) -> dict[str, Any]:
    vspec = D.verification_spec(spec)
    cfg = dict(config or _default_config(vspec))
    key = (tree_digest(Path(base_ws)), repr((vspec.to_dict(), sorted(cfg.items()), probe_calls)))
    base = _BASELINE_CACHE.get(key)
    if base is None or (training and "loss_trace" not in base) or not Path(base["ref_path"]).is_file():
        rdir = _ref_dir()
        ref_path = rdir / f"ref-{len(list(rdir.iterdir()))}.pt"
        with tempfile.TemporaryDirectory(prefix="infrarsi-base-", dir=rdir) as scratch:
            base = run_isolated("baseline", {
                "base_ws": base_ws, "task": spec.to_dict(), "config": cfg,
                "probe_calls": probe_calls, "training": training, "scratch": scratch,
                "ref_path": str(ref_path)}, timeout_s)
        if not base.get("ok"):
            raise D.CheckFailed(f"the unpatched baseline failed to run: {base.get('reason')}",
                                "crash")
        _BASELINE_CACHE[key] = base
    with tempfile.TemporaryDirectory(prefix="infrarsi-cand-") as scratch:
        req = {"patched_ws": patched_ws, "task": spec.to_dict(), "config": cfg,
               "training": training, "grad_rtol": GRAD_RTOL, "ref_path": base["ref_path"],
               "scratch": scratch, "guards": guards}
        out = run_isolated("candidate", req, timeout_s) if isolated else candidate_checks(
            {**req, "sandbox": False})
    ev = dict(out.get("evidence") or {})
    if not out["ok"]:
        raise D.CheckFailed(out["reason"], out["rule"])
    if training:
        problem, worst = D.compare_traces(base["loss_trace"], out["loss_trace"], rtol_loss)
        ev.update(train_steps=len(base["loss_trace"]), train_max_loss_rel=worst,
                  loss_rtol=rtol_loss, baseline_trace=base["loss_trace"],
                  patched_trace=out["loss_trace"])
        if problem:
            raise D.CheckFailed(problem + _GROUP_NOTE, "loss", ev)
        problem, worst = D.compare_checksums(base["state_checksum"], out["state_checksum"])
        ev["checksum_max_rel"] = worst
        if problem:
            raise D.CheckFailed(problem, "checksum", ev)
    return ev


# Real trials always run under a process group; so does the candidate (see _isolated).
_GROUP_NOTE = " (under a gloo process group, as real trials run)"
