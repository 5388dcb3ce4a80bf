"""The candidate pool a searcher scores: every legal config, or a fixed-seed sample of them."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from infrarsi.space import Config, SearchSpace, config_key
from infrarsi.trial import WorkloadSignature

MAX_ENUMERATE = 20_000


def buildable(config: Config, workload: WorkloadSignature | None) -> bool:
    """False for a config the workload's shape cannot build on any device.

    A pipeline with more stages than the model has layers leaves a stage without a layer
    (Megatron and nanotron refuse it): on the playbook table 110 of the 111 such runs crashed.
    A space cannot say this (its knobs do not know the model); the search must not spend
    trials learning it.
    """
    if workload is None or not workload.num_layers:
        return True
    pp = config.get("pipeline_parallel_degree", config.get("pp", 1))
    return not (isinstance(pp, int) and pp > workload.num_layers)


def candidate_pool(space: SearchSpace, seed: int, size: int = 5_000,
                   include: Sequence[Config] = (),
                   workload: WorkloadSignature | None = None) -> list[Config]:
    """All legal configs when the space is small enough, else ``size`` distinct legal samples
    plus the legal configs of ``include`` (the baseline and its neighbours: a sample must not
    lose the config every speedup is measured against). Configs the ``workload`` cannot build
    (:func:`buildable`) are left out.

    Deterministic in ``seed`` so a restored searcher rebuilds the same pool.
    """
    if space.allowed is not None or space.size_upper_bound() <= MAX_ENUMERATE:
        pool = space.enumerate(limit=None)
    else:
        pool = space.sample(size, random.Random(seed))
        keys = {config_key(c) for c in pool}
        for c in include:
            if config_key(c) not in keys and space.is_legal(c):
                keys.add(config_key(c))
                pool.append(dict(c))
    pool = [c for c in pool if buildable(c, workload)]
    pool.sort(key=config_key)
    return pool


def neighbourhood(space: SearchSpace, config: Config) -> list[Config]:
    """``config`` and every config that changes one knob of it (legal or not; the pool filters)."""
    out = [dict(config)]
    for k in space.knobs:
        for v in k.values:
            if v != config.get(k.name):
                out.append(space.normalize({**config, k.name: v}, check=False))
    return out


def neighbours(space: SearchSpace, config: Config, max_changes: int = 2) -> list[Config]:
    """The legal configs that change one to ``max_changes`` knobs of ``config``.

    Two, because a layout move changes two degrees at once (more data parallelism on the same
    devices means less tensor or pipeline parallelism): one-knob moves of a layout are illegal.
    """
    out: dict[str, Config] = {}
    frontier = [dict(config)]
    seen = {config_key(config)}
    for _ in range(max_changes):
        nxt = []
        for c in frontier:
            for k in space.knobs:
                for v in k.values:
                    if v == c.get(k.name):
                        continue
                    n = space.normalize({**c, k.name: v}, check=False)
                    key = config_key(n)
                    if key in seen:
                        continue
                    seen.add(key)
                    nxt.append(n)
                    if space.is_legal(n):
                        out[key] = n
        frontier = nxt
    return list(out.values())


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
