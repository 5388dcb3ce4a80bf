"""Source patches: untrusted diffs applied in isolated copies and verified against the contract.

A :class:`Patch` is a unified diff plus metadata. :func:`verify_patch` applies it to a private
copy of the workspace and rejects it, with a stated reason, when it touches anything outside the
editable scope, does not apply, uses what the contract forbids, changes the work, the gradients
or the loss, or tampers with the harness. A verified patch becomes a bool knob
(:func:`patch_knobs`); :func:`workspace_for` gives the workspace a config runs in.
"""

from __future__ import annotations

from infrarsi.patches._catalog import CATALOG_DIR, CatalogEntry, honest_patches, load_catalog
from infrarsi.patches._diff import DiffError, parse_diff
from infrarsi.patches._patch import KNOB_PREFIX, Patch, load_patch
from infrarsi.patches._static import new_findings, scan_source
from infrarsi.patches._workspace import (
    Scope,
    apply_patch,
    copy_workspace,
    enabled_patches,
    materialize,
    tree_digest,
    workspace_for,
)
from infrarsi.patches.knobs import find_conflicts, patch_knobs, patch_rules
from infrarsi.patches.verify import PatchVerdict, verify_patch

__all__ = [
    "CATALOG_DIR",
    "KNOB_PREFIX",
    "CatalogEntry",
    "DiffError",
    "Patch",
    "PatchVerdict",
    "Scope",
    "apply_patch",
    "copy_workspace",
    "enabled_patches",
    "find_conflicts",
    "honest_patches",
    "load_catalog",
    "load_patch",
    "materialize",
    "new_findings",
    "parse_diff",
    "patch_knobs",
    "patch_rules",
    "scan_source",
    "tree_digest",
    "verify_patch",
    "workspace_for",
]
