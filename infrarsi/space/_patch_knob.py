"""The name of a patch knob: ``patch:<id>``, a bool knob per verified source patch.

Defined here, with the search space, because every stage reads configs that may hold such knobs
(the search, the proposers, the report, apply, the CLI's ``--set patch:<id>=true``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PATCH_KNOB_PREFIX = "patch:"


def patch_knob(patch_id: str) -> str:
    """The knob name of the patch ``patch_id``."""
    return PATCH_KNOB_PREFIX + patch_id


def is_patch_knob(name: str) -> bool:
    return name.startswith(PATCH_KNOB_PREFIX)


def patch_id_of(knob: str) -> str:
    """The patch id of a patch knob name (``patch:fused_adam`` -> ``fused_adam``)."""
    if not is_patch_knob(knob):
        raise ValueError(f"{knob!r} is not a patch knob (patch knobs are named {PATCH_KNOB_PREFIX}<id>)")
    return knob[len(PATCH_KNOB_PREFIX):]


def launch_knobs(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without its patch knobs: what a launch sets once the patches are in the code."""
    return {k: v for k, v in config.items() if not is_patch_knob(k)}
