"""The run stage's search: an experience-seeded, memory-aware Ray Tune searcher."""

from __future__ import annotations

from infrarsi.search.engine import SearchEngine, Suggestion, default_objective
from infrarsi.search.searcher import RECORD_KEY, InfraRSISearcher, record_from_result

__all__ = [
    "RECORD_KEY",
    "InfraRSISearcher",
    "SearchEngine",
    "Suggestion",
    "default_objective",
    "record_from_result",
]
