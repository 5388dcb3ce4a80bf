"""What a searcher may know about a backend's space, whatever the backend.

A per-knob sampler draws only the *searched* knobs; :meth:`SpaceView.resolve` completes a
partial config into a legal one (a table resolves derived knobs from its measured rows) or says
that the combination cannot run. Backends may provide ``searched_knobs``, ``resolve(partial, rng)``
and ``maximize()``; without them every knob is searched, a config is legal when the space says
so, and the objective is maximized.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from infrarsi.backends.base import Backend
from infrarsi.space import Config, config_key

__all__ = ["SpaceView"]


class SpaceView:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.space = backend.space
        self.searched: tuple[str, ...] = tuple(
            getattr(backend, "searched_knobs", None) or self.space.names)
        self.maximize: bool = bool(getattr(backend, "maximize", lambda: True)())
        self._legal: list[Config] | None = None

    @property
    def mode(self) -> str:
        return "max" if self.maximize else "min"

    def domain(self, name: str) -> tuple[Any, ...]:
        return self.space.knob(name).values

    def legal_configs(self) -> list[Config]:
        """Every legal config (a table's measured configs); enumerated once, on demand."""
        if self._legal is None:
            self._legal = self.space.enumerate()
        return self._legal

    def resolve(self, partial: Mapping[str, Any], rng: random.Random | None = None) -> Config | None:
        """A legal full config agreeing with ``partial``, or None when none exists."""
        own = getattr(self.backend, "resolve", None)
        if own is not None:
            return own(partial, rng)
        config = self.space.normalize(partial, check=False)
        return config if self.space.is_legal(config) else None

    def baseline(self) -> Config:
        return self.backend.baseline_config()

    def better(self, a: float | None, b: float | None) -> bool:
        """Is objective ``a`` strictly better than ``b`` (None = no measurement)?"""
        if a is None:
            return False
        if b is None:
            return True
        return a > b if self.maximize else a < b

    def key(self, config: Mapping[str, Any]) -> str:
        return config_key(config)
