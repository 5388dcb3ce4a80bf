"""The search space seam: typed knobs, legality rules, enumeration and neighbourhoods."""

from __future__ import annotations

from infrarsi.space._space import Config, Knob, Rule, SearchSpace, config_key

__all__ = ["Config", "Knob", "Rule", "SearchSpace", "config_key"]
