"""The search space seam: typed knobs, legality rules, enumeration and neighbourhoods."""

from __future__ import annotations

from infrarsi.space._patch_knob import (
    PATCH_KNOB_PREFIX,
    is_patch_knob,
    launch_knobs,
    patch_id_of,
    patch_knob,
)
from infrarsi.space._space import Config, Knob, Rule, SearchSpace, config_key

__all__ = ["PATCH_KNOB_PREFIX", "Config", "Knob", "Rule", "SearchSpace", "config_key",
           "is_patch_knob", "launch_knobs", "patch_id_of", "patch_knob"]
