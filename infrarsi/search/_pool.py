"""The candidate pool a searcher scores: every legal config, or a fixed-seed sample of them."""

from __future__ import annotations

import random

import numpy as np

from infrarsi.space import Config, SearchSpace, config_key

MAX_ENUMERATE = 20_000


def candidate_pool(space: SearchSpace, seed: int, size: int = 5_000) -> list[Config]:
    """All legal configs when the space is small enough, else ``size`` distinct legal samples.

    Deterministic in ``seed`` so a restored searcher rebuilds the same pool.
    """
    if space.allowed is not None or space.size_upper_bound() <= MAX_ENUMERATE:
        pool = space.enumerate(limit=None)
    else:
        pool = space.sample(size, random.Random(seed))
    pool.sort(key=config_key)
    return pool


def maximin(X: np.ndarray, k: int, *, start: int, exclude: set[int] = frozenset()) -> list[int]:
    """Greedy maximin design: ``k`` row indices of ``X`` spread out, beginning at ``start``."""
    if len(X) == 0 or k <= 0:
        return []
    scale = X.std(axis=0)
    scale[scale < 1e-9] = 1.0
    Z = X / scale
    chosen = [start]
    d = np.linalg.norm(Z - Z[start], axis=1)
    for i in exclude:
        d[i] = -1.0
    while len(chosen) < min(k, len(X)):
        d[chosen] = -1.0
        nxt = int(np.argmax(d))
        if d[nxt] <= 0:
            break
        chosen.append(nxt)
        d = np.minimum(d, np.linalg.norm(Z - Z[nxt], axis=1))
    return chosen
