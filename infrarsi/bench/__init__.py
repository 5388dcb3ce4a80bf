"""Side-by-side search benchmark: our searcher and the peers a user would pick, on one backend.

See :mod:`infrarsi.bench._peers` for the registry (``SEARCHERS``) and how to add a searcher,
:mod:`infrarsi.bench._guard` for how per-knob samplers meet a table's finite set of measured
configs, and :mod:`infrarsi.bench._report` for the figures.
"""

from __future__ import annotations

from infrarsi.bench import _ours  # noqa: F401 - registers "infrarsi"
from infrarsi.bench._engines import Trajectory, execute_trial, run_inline, run_tune
from infrarsi.bench._guard import LegalityGuard
from infrarsi.bench._peers import METRIC, SEARCHERS, SearcherFactory, register_searcher
from infrarsi.bench._runner import BenchRun, build_search_alg, ensure_ray, run_bench, run_search
from infrarsi.bench._view import SpaceView

__all__ = [
    "METRIC",
    "SEARCHERS",
    "BenchRun",
    "LegalityGuard",
    "SearcherFactory",
    "SpaceView",
    "Trajectory",
    "build_search_alg",
    "ensure_ray",
    "execute_trial",
    "register_searcher",
    "run_bench",
    "run_inline",
    "run_search",
    "run_tune",
]
