"""The noise model doctor measures; it lives in :mod:`infrarsi.stats` (shared with the
verifier, below both doctor and the search). Re-exported here under its old name."""

from __future__ import annotations

from infrarsi.stats import (
    DEFAULT_MDE,
    DEFAULT_PAIRS,
    MEDIAN_EFFICIENCY,
    mde_at_pairs,
    mde_for,
    noise_model,
    paired_speedup,
    required_pairs,
    required_steps,
    trial_sigma,
)

__all__ = ["DEFAULT_MDE", "DEFAULT_PAIRS", "MEDIAN_EFFICIENCY", "mde_at_pairs", "mde_for",
           "noise_model", "paired_speedup", "required_pairs", "required_steps", "trial_sigma"]
