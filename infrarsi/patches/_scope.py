"""Which paths a patch may touch: inside the workspace, editable, not frozen, no symlinks.

Globs follow ``pathlib`` semantics (``**/`` matches zero or more directories), the same way the
contract resolves ``scope.frozen``; they are matched on the normalized relative path, so a file
that does not exist yet (a patch that creates one) is judged by the same rule.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path, PurePosixPath

from infrarsi.patches._diff import DiffError


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def glob_match(rel: str, patterns: Iterable[str]) -> bool:
    return any(_glob_regex(p).match(rel) for p in patterns)


def check_path(root: Path, raw: str, editable: Iterable[str], frozen: Iterable[str]) -> str:
    """The normalized relative path of ``raw`` if a patch may write it; else DiffError(scope)."""
    if raw.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", raw) or raw.startswith("~"):
        raise DiffError(f"{raw!r} is an absolute path; a patch may only touch relative paths "
                        "inside the workspace", "scope")
    if "\\" in raw or "\x00" in raw:
        raise DiffError(f"{raw!r} contains a backslash or NUL byte", "scope")
    parts = PurePosixPath(raw).parts
    if ".." in parts:
        raise DiffError(f"{raw!r} climbs out with '..'; a patch may only touch files inside the "
                        "workspace", "scope")
    rel = posixpath.normpath(raw)
    if rel in (".", "") or rel.startswith("../"):
        raise DiffError(f"{raw!r} does not name a file inside the workspace", "scope")
    if any(p.startswith(".") for p in PurePosixPath(rel).parts):
        raise DiffError(f"{rel!r} is a hidden path (.git, .venv...); not editable", "scope")
    if glob_match(rel, frozen):
        raise DiffError(f"{rel} is frozen by the contract (scope.frozen); a patch may not "
                        "touch it", "scope")
    if not glob_match(rel, editable):
        raise DiffError(f"{rel} is outside the editable scope {list(editable)}", "scope")
    _check_no_symlink(root, rel)
    return rel


def _check_no_symlink(root: Path, rel: str) -> None:
    """Every existing component of ``root/rel`` is a real directory/file inside ``root``."""
    root = root.resolve()
    cur = root
    for part in PurePosixPath(rel).parts:
        cur = cur / part
        if cur.is_symlink():
            raise DiffError(f"{rel}: {cur.relative_to(root)} is a symlink; a patch may not write "
                            "through a symlink", "scope")
        if not cur.exists():
            break
    target = (root / rel).resolve()
    if root not in target.parents:
        raise DiffError(f"{rel} resolves to {target}, outside the workspace", "scope")


def tree_symlinks(root: Path) -> list[str]:
    """Relative paths of every symlink under ``root`` (an honest workspace copy has none)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_symlink())
