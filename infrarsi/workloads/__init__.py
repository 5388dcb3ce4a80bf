"""Workloads: the torch knob space and the reference training code (a user's workspace)."""

from __future__ import annotations

from infrarsi.workloads.knobs import build_torch_space, derived

__all__ = ["build_torch_space", "derived"]
