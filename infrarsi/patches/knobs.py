"""Verified patches as search knobs: one bool knob ``patch:<id>`` each, plus conflict rules."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infrarsi.patches._diff import DiffError
from infrarsi.patches._patch import Patch
from infrarsi.patches._workspace import Scope, apply_patch, copy_workspace
from infrarsi.space import Knob, Rule, patch_knob


def patch_knobs(verified: Iterable[Patch]) -> list[Knob]:
    """One bool knob per verified patch (default off: the baseline is the unpatched code)."""
    return [Knob(p.knob, (False, True), False, "bool",
                 f"apply verified patch {p.id}: {p.rationale[:80]}") for p in verified]


def find_conflicts(verified: Sequence[Patch], workspace: Path, scope: Scope | None = None
                   ) -> list[tuple[str, str, str]]:
    """Pairs of patches that do not apply together (in either order), with the reason."""
    scope = scope or Scope()
    out = []
    with tempfile.TemporaryDirectory(prefix="infrarsi-conflicts-") as tmp:
        for i, (a, b) in enumerate(itertools.combinations(verified, 2)):
            root = copy_workspace(Path(workspace), Path(tmp) / f"c{i}")
            try:
                apply_patch(a, root, scope)
                apply_patch(b, root, scope)
            except DiffError as e:
                out.append((a.id, b.id, str(e)))
    return out


def patch_rules(verified: Sequence[Patch], workspace: Path, scope: Scope | None = None) -> list[Rule]:
    """Legality rules that keep conflicting patches out of the same config."""
    return conflict_rules(find_conflicts(verified, workspace, scope))


def conflict_rules(conflicts: Sequence[tuple[str, str, str]]) -> list[Rule]:
    """Rules keeping each conflicting pair ``(id, id, why)`` out of one config (plain data in,
    so a trial process rebuilds them without re-applying patches)."""
    return [Rule(f"patches {a}+{b}", _conflict(patch_knob(a), patch_knob(b), why))
            for a, b, why in conflicts]


def _conflict(ka: str, kb: str, why: str):
    def check(c: Mapping[str, Any]) -> str | None:
        if c.get(ka) and c.get(kb):
            return f"{ka} and {kb} do not apply together ({why}); turn one of them off"
        return None
    return check
