"""InfraRSI's own searcher in the benchmark registry, run through the same protocol as peers."""

from __future__ import annotations

from infrarsi.bench._peers import METRIC, register_searcher
from infrarsi.search import InfraRSISearcher, SearchEngine


@register_searcher("infrarsi", uses_experience=True)
def make_infrarsi(space, backend, budget, seed, experience=None):
    engine = SearchEngine(space, backend.workload, backend.hardware, budget=budget, seed=seed,
                          experience=experience or (), objective=backend.objective,
                          baseline=backend.baseline_config())
    return InfraRSISearcher(engine, metric=METRIC, mode="max")
