"""Isolated workspace copies: apply patches there, never in the user's tree.

:func:`materialize` builds (once per combination, cached under a content key) a copy of the
workspace with a sequence of patches applied; :func:`workspace_for` maps a search config (with
``patch:<id>`` bool knobs) to that copy, so the backend runs it with ``workspace=``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.patches._diff import DiffError, apply_hunks, parse_diff
from infrarsi.patches._patch import Patch
from infrarsi.patches._scope import check_path, glob_match

_SKIP = ("__pycache__",)


@dataclass(frozen=True)
class Scope:
    """What a patch may touch: editable globs, frozen globs (relative to the workspace)."""

    editable: tuple[str, ...] = ("**/*.py",)
    frozen: tuple[str, ...] = ("entry.py",)
    entry: str = "entry.py"
    frozen_hashes: dict[str, str] = field(default_factory=dict)  # rel path -> sha256

    @classmethod
    def from_spec(cls, spec: Any) -> Scope:
        frozen = tuple(spec.scope.frozen)
        if spec.workload.entry not in frozen:
            frozen += (spec.workload.entry,)
        return cls(tuple(spec.scope.editable), frozen, spec.workload.entry)

    @classmethod
    def from_contract(cls, contract: Any) -> Scope:
        spec = contract.spec()
        base = cls.from_spec(spec)
        hashes = {k.split("/", 1)[1]: v for k, v in contract.frozen_files.items()
                  if k.startswith("workspace/")}
        return cls(tuple(contract.editable), base.frozen, base.entry, hashes)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*")
                  if not any(s in p.parts for s in _SKIP) and (p.is_file() or p.is_symlink()))


def tree_digest(root: Path) -> str:
    """A content hash of a workspace (relative paths and bytes; caches key on it)."""
    h = hashlib.sha256()
    root = Path(root)
    for p in _files(root):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update((b"L" + os.readlink(p).encode()) if p.is_symlink() else p.read_bytes())
    return h.hexdigest()


def copy_workspace(src: Path, dest: Path) -> Path:
    """A private copy of ``src`` (symlinks kept as links, so the scope check can refuse them)."""
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(*_SKIP))
    return dest


def apply_patch(patch: Patch, root: Path, scope: Scope) -> list[str]:
    """Apply ``patch`` to the tree at ``root`` (an isolated copy); return the paths it wrote.

    Every path is checked and every hunk computed before the first byte is written, so a
    refused or non-applying patch leaves ``root`` unchanged. Raises :class:`DiffError` with
    ``rule`` "scope" (touches what it may not) or "apply" (malformed, does not match).
    """
    root = Path(root)
    plan: dict[str, str | None] = {}
    for fd in parse_diff(patch.diff):
        rels = [check_path(root, p, scope.editable, scope.frozen) for p in fd.paths]
        rel = rels[-1]
        if len(set(rels)) > 1:
            raise DiffError(f"{fd.old_path} -> {fd.new_path}: a patch may not rename files", "scope")
        target = root / rel
        current = plan[rel] if rel in plan else (target.read_text() if target.is_file() else None)
        plan[rel] = apply_hunks(current, fd)
    for rel, text in plan.items():
        target = root / rel
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return sorted(plan)


def check_frozen(root: Path, scope: Scope, base: Path | None = None) -> str | None:
    """None when every frozen file of ``root`` matches the contract (or ``base``'s copy)."""
    for p in _files(root):
        rel = str(p.relative_to(root))
        if not glob_match(rel, scope.frozen):
            continue
        if p.is_symlink():
            return f"frozen file {rel} is a symlink in the patched workspace"
        want = scope.frozen_hashes.get(rel)
        if want is None and base is not None and (base / rel).is_file():
            want = hashlib.sha256((base / rel).read_bytes()).hexdigest()
        if want is not None and hashlib.sha256(p.read_bytes()).hexdigest() != want:
            return f"frozen file {rel} differs from the contract's copy"
    return None


def cache_root() -> Path:
    root = Path(os.environ.get("INFRARSI_PATCH_CACHE") or
                Path(tempfile.gettempdir()) / "infrarsi-patched")
    root.mkdir(parents=True, exist_ok=True)
    return root


def materialize(workspace: Path, patches: Sequence[Patch], scope: Scope | None = None, *,
                cache: Path | None = None) -> Path:
    """A cached, isolated copy of ``workspace`` with ``patches`` applied in order.

    The copy lives under ``cache`` (default ``$INFRARSI_PATCH_CACHE`` or the temp dir) at a key
    of the workspace's content and the patches' diffs, so the same combination is built once.
    Raises :class:`DiffError` when a patch does not apply (e.g. two patches conflict).
    """
    workspace = Path(workspace).resolve()
    scope = scope or Scope()
    h = hashlib.sha256(tree_digest(workspace).encode())
    for p in patches:
        h.update(p.id.encode() + b"\0" + p.digest.encode())
    key = h.hexdigest()[:20]
    root = Path(cache) if cache else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / key
    if (dest / ".infrarsi-complete").is_file():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    try:
        ws = copy_workspace(workspace, tmp / "ws")
        for p in patches:
            try:
                apply_patch(p, ws, scope)
            except DiffError as e:
                raise DiffError(f"patch {p.id}: {e}", e.rule) from None
        (ws / ".infrarsi-complete").write_text(",".join(p.id for p in patches) + "\n")
        try:
            os.replace(ws, dest)
        except OSError:  # another process published the same combination first
            if not (dest / ".infrarsi-complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def enabled_patches(config: Mapping[str, Any], verified: Iterable[Patch]) -> list[Patch]:
    return [p for p in verified if bool(config.get(p.knob, False))]


def workspace_for(config: Mapping[str, Any], base_workspace: Path, verified: Iterable[Patch],
                  scope: Scope | None = None, *, cache: Path | None = None) -> Path:
    """The workspace a config runs in: the base one, or the cached copy with its patches on."""
    on = enabled_patches(config, verified)
    if not on:
        return Path(base_workspace)
    return materialize(base_workspace, on, scope, cache=cache)
