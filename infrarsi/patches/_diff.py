"""A strict, pure-Python unified-diff parser and applier.

Why not ``git apply`` or ``patch(1)``: both follow symlinks, honour mode changes, renames and
binary hunks, and resolve paths against the current directory. A patch is untrusted input, so
this applier understands only what an honest source patch needs (edit, create or delete a
regular text file) and refuses every other header with a reason. Paths are returned as written
(``a/``/``b/`` prefixes stripped); the scope check in :mod:`infrarsi.patches._scope` decides
whether they may be touched at all, before anything is written.

Hunks are located by their context: at the stated line first, then at the nearest offset where
the old lines match exactly (like ``patch`` with fuzz 0). Hunk line counts in the ``@@`` header
are not trusted (model-written diffs often get them wrong); the body is read until the next
header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infrarsi.errors import PatchRejectedError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# Extended git headers an honest text edit may carry; anything else is refused.
_ALLOWED_GIT = ("index ", "new file mode 100644", "deleted file mode 100644",
                "new file mode 100755", "deleted file mode 100755")
_REFUSED_GIT = {
    "old mode": "changes a file mode",
    "new mode": "changes a file mode",
    "new file mode": "creates a file with a non-regular mode (symlink or submodule)",
    "deleted file mode": "deletes a non-regular file",
    "rename from": "renames a file",
    "rename to": "renames a file",
    "copy from": "copies a file",
    "copy to": "copies a file",
    "similarity index": "renames or copies a file",
    "dissimilarity index": "rewrites a file by similarity",
    "GIT binary patch": "carries a binary patch",
    "Binary files": "carries a binary patch",
}


class DiffError(PatchRejectedError):
    """The diff is malformed, uses a refused feature, or does not apply."""

    def __init__(self, message: str, rule: str = "apply") -> None:
        super().__init__(message)
        self.rule = rule


@dataclass
class Hunk:
    old_start: int
    old: list[str] = field(default_factory=list)  # context + removed lines
    new: list[str] = field(default_factory=list)  # context + added lines


@dataclass
class FileDiff:
    """One file's change. ``old_path``/``new_path`` None mean /dev/null (create / delete)."""

    old_path: str | None
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path if self.new_path is not None else self.old_path  # type: ignore[return-value]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in dict.fromkeys((self.old_path, self.new_path)) if p is not None)


def _strip(raw: str) -> str | None:
    raw = raw.split("\t", 1)[0].rstrip()
    if raw == "/dev/null":
        return None
    if raw.startswith('"'):
        raise DiffError(f"quoted path {raw!r}: only plain relative paths are accepted", "scope")
    if raw[:2] in ("a/", "b/"):
        raw = raw[2:]
    if not raw:
        raise DiffError("a file header names an empty path", "apply")
    return raw


def parse_diff(text: str) -> list[FileDiff]:
    """Parse a unified diff; raise :class:`DiffError` on refused features or malformed input."""
    lines = text.splitlines()
    files: list[FileDiff] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        for prefix, why in _REFUSED_GIT.items():
            if line.startswith(prefix) and not line.startswith(_ALLOWED_GIT):
                raise DiffError(f"the patch {why} ({line.strip()!r}); only edits of regular "
                                "text files are accepted", "scope")
        if line.startswith("--- ") and i + 1 < n and lines[i + 1].startswith("+++ "):
            fd = FileDiff(_strip(line[4:]), _strip(lines[i + 1][4:]))
            if fd.old_path is None and fd.new_path is None:
                raise DiffError("a file header is /dev/null on both sides")
            i = _parse_hunks(lines, i + 2, fd)
            if not fd.hunks:
                raise DiffError(f"{fd.path}: a file header with no hunks")
            files.append(fd)
            continue
        if line.startswith("@@"):
            raise DiffError(f"line {i + 1}: a hunk before any ---/+++ file header")
        i += 1
    if not files:
        raise DiffError("no file changes found: expected a unified diff with ---/+++ headers")
    return files


def _parse_hunks(lines: list[str], i: int, fd: FileDiff) -> int:
    n = len(lines)
    while i < n:
        m = _HUNK.match(lines[i])
        if not m:
            break
        hunk = Hunk(old_start=int(m.group(1)))
        i += 1
        while i < n:
            line = lines[i]
            if line.startswith(("@@", "diff ")) or (
                    line.startswith("--- ") and i + 1 < n and lines[i + 1].startswith("+++ ")):
                break
            if line.startswith("\\"):  # "\ No newline at end of file"
                i += 1
                continue
            tag, body = (line[:1], line[1:]) if line else (" ", "")
            if tag == " ":
                hunk.old.append(body)
                hunk.new.append(body)
            elif tag == "-":
                hunk.old.append(body)
            elif tag == "+":
                hunk.new.append(body)
            else:
                break  # trailing prose after the diff
            i += 1
        if not hunk.old and not hunk.new:
            raise DiffError(f"{fd.path}: an empty hunk")
        fd.hunks.append(hunk)
    return i


def _find(lines: list[str], needle: list[str], start: int) -> int | None:
    """Index where ``needle`` occurs in ``lines``, nearest to ``start`` first."""
    if not needle:
        return min(max(start, 0), len(lines))
    limit = len(lines) - len(needle)
    for off in range(0, len(lines) + 1):
        for pos in (start + off, start - off) if off else (start,):
            if 0 <= pos <= limit and lines[pos:pos + len(needle)] == needle:
                return pos
    return None


def apply_hunks(original: str | None, fd: FileDiff) -> str | None:
    """The new text of one file (None when deleted); raise DiffError when a hunk does not fit."""
    if fd.old_path is None:
        if original is not None:
            raise DiffError(f"{fd.path}: the patch creates a file that already exists")
        lines: list[str] = []
    else:
        if original is None:
            raise DiffError(f"{fd.old_path}: the patch edits a file that does not exist")
        lines = original.splitlines()
    shift = 0
    for k, h in enumerate(fd.hunks):
        pos = _find(lines, h.old, max(h.old_start - 1, 0) + shift)
        if pos is None:
            raise DiffError(f"{fd.path}: hunk {k + 1} (at line {h.old_start}) does not match the "
                            "file's current text")
        lines[pos:pos + len(h.old)] = h.new
        shift = pos - (h.old_start - 1) + len(h.new) - len(h.old)
    if fd.new_path is None:
        if lines:
            raise DiffError(f"{fd.old_path}: a deletion that leaves lines behind")
        return None
    return "\n".join(lines) + "\n"
