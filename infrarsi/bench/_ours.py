"""InfraRSI's own searcher in the benchmark registry, run through the same protocol as peers.

It runs as ``infrarsi run`` does: with the offline expert proposer's knob priors (rules of
thumb, no LLM and nothing learned from the benchmark's data), and, in the ``+exp`` rows, with
the leave-one-workload-out experience a bank would hold.
"""

from __future__ import annotations

from infrarsi.bench._peers import METRIC, register_searcher
from infrarsi.proposers import ExpertProposer, ProposerContext
from infrarsi.search import InfraRSISearcher, SearchEngine
from infrarsi.search.engine import ExperienceCache

# The benchmark runs many searches with the same leave-one-out experience: they share one cache
# and fit each experience set once (the fit is deterministic, so sharing changes no decision).
EXPERIENCE_CACHE = ExperienceCache()


@register_searcher("infrarsi", uses_experience=True)
def make_infrarsi(space, backend, budget, seed, experience=None):
    priors = ExpertProposer().priors(ProposerContext(space=space, hardware=backend.hardware))
    engine = SearchEngine(space, backend.workload, backend.hardware, budget=budget, seed=seed,
                          experience=experience or (), objective=backend.objective,
                          baseline=backend.baseline_config(), priors=priors,
                          # the baseline is the first seed, with experience or without (as
                          # `infrarsi run` without a doctor baseline): its peak anchors the
                          # memory model's priors, and with experience from other hardware its
                          # time is the own contrast that tells the residual model where
                          # experience's ranking does not hold (without it, every early trial
                          # sat where experience pointed and the residual could not learn that)
                          include_baseline=True, experience_cache=EXPERIENCE_CACHE)
    return InfraRSISearcher(engine, metric=METRIC, mode="max")
