"""The apply stage: the promoted result as a reviewable branch of the user's repository.

What lands on the branch: the verified patches (applied to the workspace inside the repo), the
promoted knobs in the user's own settings file when the task YAML maps them (``launch``: see
:mod:`infrarsi.apply._settings`), and a launch config (``infrarsi/promoted/<task>.yaml``: the full promoted config, the changed knobs,
the patches, the evidence and the equivalent ``infrarsi trial`` command line), in one commit
whose message carries the headline evidence.

Safety: the user's current branch, index and working tree are never touched. The branch is
created and committed inside a temporary ``git worktree`` that is removed afterwards. Apply
refuses, before writing anything, when the working tree is dirty (the files are named), when a
frozen file changed since ``infrarsi init`` (named), when the run promoted nothing (why), when a
promoted patch is unverified, out of scope, or no longer applies to the committed source.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infrarsi.apply._git import (
    ApplyRefusedError,
    branch_exists,
    dirty_files,
    git,
    identity_env,
    repo_root,
)
from infrarsi.errors import FrozenFileChangedError
from infrarsi.report._audit import trial_command
from infrarsi.report._data import ReportData, load_report_data
from infrarsi.rundir import resolve_run_dir
from infrarsi.space import is_patch_knob, launch_knobs

CONFIG_DIR = "infrarsi/promoted"


@dataclass(frozen=True)
class ApplyResult:
    """The branch apply created: ``repo``, ``branch``, its ``commit`` and the ``base`` it grew
    from, the ``files`` it changed, the launch ``config_path``, the commit ``message`` and the
    equivalent ``command`` line."""

    repo: Path
    branch: str
    commit: str
    base: str
    files: list[str] = field(default_factory=list)
    config_path: str = ""
    message: str = ""
    command: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "repo": str(self.repo), "files": list(self.files)}


def apply_run(run_dir: str | Path | None = None, *, repo: str | Path | None = None, branch: str | None = None,
              bank_url: str | None = None, config_path: str | None = None) -> ApplyResult:
    """Commit the promoted result of ``run_dir`` (default: the last ``infrarsi init``) on a new
    branch of ``repo``; see the module doc. Raises :class:`ApplyRefusedError` saying why not."""
    data = load_report_data(Path(run_dir) if run_dir else resolve_run_dir(None), bank_url=bank_url)
    if not data.promoted:
        why = data.partial or data.not_promoted
        raise ApplyRefusedError(f"run {data.run_id} has no promotion, so there is nothing to apply: "
                                f"{why}. See `infrarsi report --run-dir {data.run_dir}`")
    ws = data.spec.workspace_path().resolve()
    root = Path(repo).resolve() if repo else repo_root(ws)
    root = repo_root(root)
    try:
        ws_rel = ws.relative_to(root).as_posix()
    except ValueError:
        raise ApplyRefusedError(f"the workspace {ws} is not inside the repository {root}; pass "
                                "--repo PATH to the repository that holds it") from None
    _refuse_dirty(root, data)
    try:
        data.contract.verify_frozen()
    except FrozenFileChangedError as e:
        raise ApplyRefusedError(f"refusing to apply: {e}") from None
    edits = _patch_edits(data, root, ws_rel)
    name = branch or f"infrarsi/{data.run_id}"
    if branch_exists(root, name):
        raise ApplyRefusedError(f"branch {name!r} already exists in {root}; pass --branch NAME "
                                "(or delete it: git branch -D " + name + ")")
    cfg_rel = config_path or f"{CONFIG_DIR}/{data.task_name}.yaml"
    # On the branch the patches are part of the code: the launch command sets knobs only.
    command = trial_command(data, data.winner_config, relative_to=root, run_dir=False,
                            patches=False)
    edits[cfg_rel] = _launch_yaml(data, command)
    launch = data.contract.task.get("launch")
    if launch:  # the promoted knobs, where the user's job reads them
        from infrarsi.apply._settings import settings_text

        rel = _join(ws_rel, launch["file"])
        edits[rel] = settings_text(edits.get(rel) or _committed(root, rel), launch["file"],
                                   launch.get("keys") or {}, launch_knobs(data.winner_config or {}))
    message = commit_message(data, sorted(edits), command)
    base = git(root, "rev-parse", "HEAD").strip()
    commit = _commit_on_branch(root, name, edits, message)
    return ApplyResult(root, name, commit, base, sorted(edits), cfg_rel, message, command)


def _refuse_dirty(root: Path, data: ReportData) -> None:
    skip = [data.run_dir.resolve()]
    dirty = dirty_files(root, skip)
    if dirty:
        shown = "; ".join(dirty[:20]) + (f"; and {len(dirty) - 20} more" if len(dirty) > 20 else "")
        raise ApplyRefusedError(
            f"the working tree of {root} has uncommitted changes: {shown}. Commit or stash them "
            "(git stash -u) first: apply branches from the committed HEAD, and the result must be "
            "the verified change and nothing else")


def _patch_edits(data: ReportData, root: Path, ws_rel: str) -> dict[str, str | None]:
    """repo-relative path -> new text (None: delete) for every promoted patch, checked."""
    from infrarsi.patches._diff import DiffError, apply_hunks, parse_diff
    from infrarsi.patches._scope import check_path

    wanted = data.patch_ids()
    have = {e.patch_id: e for e in data.patches}
    missing = [p for p in wanted if p not in have]
    if missing:
        raise ApplyRefusedError(f"the promoted config uses patch(es) {', '.join(missing)} that the "
                                f"bank ({data.bank_url}) does not hold; pass the bank that ran it "
                                "with --bank-url")
    unverified = [p for p in wanted if not have[p].verified]
    if unverified:
        raise ApplyRefusedError(f"patch(es) {', '.join(unverified)} were never verified; apply "
                                "writes verified changes only")
    ws = root / ws_rel if ws_rel != "." else root
    frozen = tuple((data.contract.task.get("scope") or {}).get("frozen") or ())
    edits: dict[str, str | None] = {}
    for pid in wanted:
        try:
            for fd in parse_diff(have[pid].diff):
                for raw in fd.paths:
                    check_path(ws, raw, data.contract.editable, frozen)
                rel = fd.path if fd.old_path is None else fd.old_path
                key = _join(ws_rel, rel)
                current = edits[key] if key in edits else _committed(root, key)
                new = apply_hunks(current, fd)
                if fd.new_path is not None and fd.old_path not in (None, fd.new_path):
                    edits[key] = None  # a rename: old path deleted, new path written
                    key = _join(ws_rel, fd.new_path)
                edits[key] = new
        except DiffError as e:
            raise ApplyRefusedError(f"patch {pid} does not apply to the committed source: {e}. "
                                    "The file changed since the run verified it; re-run the "
                                    "search on the current code") from None
    return edits


def _join(ws_rel: str, rel: str) -> str:
    return rel if ws_rel in ("", ".") else f"{ws_rel}/{rel}"


def _committed(root: Path, rel: str) -> str | None:
    out = git(root, "ls-files", "--", rel).strip()
    return (root / rel).read_text() if out else None


def _launch_yaml(data: ReportData, command: str) -> str:
    v = data.promoted or {}
    body: dict[str, Any] = {
        "task": data.task_name,
        "run_id": data.run_id,
        "contract_sha256": data.contract.sha256,
        "evidence": {"speedup": _r(v.get("speedup")), "ci95": [_r(v.get("ci_low")), _r(v.get("ci_high"))],
                     "interleaved_pairs": len(v.get("pairs") or []), "mde": _r(v.get("mde")),
                     "method": "paired A/B against the untouched baseline, t-interval on log ratio"},
        "changed": {k: {"from": a, "to": b} for k, (a, b) in
                    sorted(data.changed(data.winner_config).items()) if not is_patch_knob(k)},
        "patches_applied": data.patch_ids(),
        "config": dict(sorted(launch_knobs(data.winner_config or {}).items())),
        "command": command.replace("\\\n    ", ""),
    }
    head = (f"# Launch config promoted by InfraRSI run {data.run_id}.\n"
            "# The patches listed below are applied to the source in this same commit.\n"
            "# Launch with:\n#   " + command.replace("\n", "\n#  ") + "\n")
    return head + yaml.safe_dump(body, sort_keys=False)


def _r(x: float | None) -> float | None:
    return round(float(x), 4) if x is not None else None


def commit_message(data: ReportData, files: list[str], command: str) -> str:
    v = data.promoted or {}
    b, a = data.before, data.after
    subject = f"infrarsi: {v.get('speedup', 0):.2f}x faster training step for {data.task_name}"
    lines = [subject, "",
             f"Promoted by InfraRSI run {data.run_id} (contract {data.contract.sha256[:12]}).",
             f"Speedup {v.get('speedup', 0):.3f}x, 95% CI [{v.get('ci_low', 0):.3f}, "
             f"{v.get('ci_high', 0):.3f}] over {len(v.get('pairs') or [])} interleaved A/B pairs "
             f"against the untouched baseline; noise floor 1 + {v.get('mde', 0):.3f}."]
    if b and a and b.step_s and a.step_s:
        lines.append(f"Step time {b.step_s * 1e3:.1f} ms -> {a.step_s * 1e3:.1f} ms; tokens/s "
                     f"{b.tokens_per_s or 0:,.0f} -> {a.tokens_per_s or 0:,.0f}.")
    if b and a and b.peak_bytes and a.peak_bytes:
        lines.append(f"Peak memory per device {b.peak_bytes / 2**20:.0f} -> "
                     f"{a.peak_bytes / 2**20:.0f} MiB.")
    lines += ["", "Changed knobs:"]
    lines += [f"  {k}: {x} -> {y}" for k, (x, y) in sorted(data.changed(data.winner_config).items())
              if not is_patch_knob(k)] or ["  (none)"]
    for e in data.patches:
        lines.append(f"Patch {e.patch_id} (verified; touches {', '.join(e.files)}):")
        lines += [f"  {k}: {val}" for k, val in (e.evidence or {}).items()]
    lines += ["", "Files: " + ", ".join(files), "",
              "Launch (on this branch the patches are part of the code):",
              "  " + command.replace("\n", "\n  ")]
    return "\n".join(lines) + "\n"


def _commit_on_branch(root: Path, name: str, edits: dict[str, str | None], message: str) -> str:
    """Create ``name`` at HEAD in a temporary worktree, write ``edits``, commit; return the sha."""
    tmp = Path(tempfile.mkdtemp(prefix="infrarsi-apply-"))
    wt = tmp / "wt"
    git(root, "worktree", "add", "--quiet", "-b", name, str(wt), "HEAD")
    try:
        for rel, text in edits.items():
            path = wt / rel
            if text is None:
                git(wt, "rm", "--quiet", "--", rel)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            git(wt, "add", "--", rel)
        git(wt, "commit", "--quiet", "--no-verify", "-F", str(_msg_file(tmp, message)),
            env=identity_env(root))
        return git(wt, "rev-parse", "HEAD").strip()
    except BaseException:
        git(root, "worktree", "remove", "--force", str(wt), check=False)
        git(root, "branch", "-D", name, check=False)
        raise
    finally:
        if wt.exists():
            git(root, "worktree", "remove", "--force", str(wt), check=False)
        git(root, "worktree", "prune", check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def _msg_file(tmp: Path, message: str) -> Path:
    path = tmp / "COMMIT_MSG"
    path.write_text(message)
    return path
