"""Crash model: P(a config fails for a reason of its own, not memory) from the crashes seen.

Some settings fail only together: torch.compile traces float8 linears, and selective
checkpointing, but not float8 inside selective checkpointing; DeepEP kernels break a compile
graph only with expert parallelism. No single knob explains such a crash and a log-linear model
cannot express the conjunction; a tree can (a split on compile, then precision, then
checkpointing). So: a forest of extremely randomized trees on the encoded features (workload and
hardware included, so crashes of other workloads in the bank transfer where they apply), a
config-caused crash labelled 1, everything else that ran (ok, OOM, rejected) 0.

Only crashes a config causes teach it (:data:`CONFIG_FAULTS`): a lost worker or a failed
collective says nothing about the settings and is left out. A failure recorded as out of memory
that the memory model does not explain (:func:`unexplained_ooms`: anchored by measured peaks, the
model still puts the config's median peak under the capacity) teaches it too: some sources cannot
tell an OOM from a crash (a pipeline stage left with one layer, a schedule that breaks at one
micro-batch), and no memory model can learn a failure that memory does not cause. Without both a crash and a config
that ran, the model has no contrast to learn from and predicts 0 everywhere: it ranks configs,
and a run in which everything crashed is the search's to judge (a broken workload, or a setting
every crash shared).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.ensemble import ExtraTreesClassifier
from sklearn.utils.validation import check_is_fitted

from infrarsi.models._common import as_2d, clean_X
from infrarsi.trial import ErrorKind, TrialRecord, TrialStatus

# Error kinds the config itself causes (the same config fails again); the others are the
# cluster's (a node lost, a collective broken by a peer, a driver killed).
CONFIG_FAULTS = frozenset({ErrorKind.COMPILE, ErrorKind.PATCH, ErrorKind.CRASH})
# An OOM the memory model gives P(OOM) under this, having seen it, is one memory does not explain
# (its median peak is under the capacity): see unexplained_ooms.
UNEXPLAINED_P_OOM = 0.5


def crash_label(record: TrialRecord) -> int | None:
    """1: the config crashed; 0: it ran (ok, OOM or rejected); None: no evidence either way."""
    if record.status is TrialStatus.ERROR:
        return 1 if record.error_kind in CONFIG_FAULTS else None
    return 0


class CrashModel(BaseEstimator):
    """P(crash | features): extremely randomized trees, their leaf rates averaged.

    ``min_samples_leaf`` smooths a leaf's rate (a single crash does not make its whole
    neighbourhood certain to fail); ``sample_weight`` in :meth:`fit` lets the search's own
    trials weigh more than experience from other workloads.
    """

    def __init__(self, n_estimators: int = 60, min_samples_leaf: int = 2, random_state: int = 0):
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state

    def fit(self, X, crashed, sample_weight=None) -> CrashModel:
        X = clean_X(as_2d(X))
        y = np.asarray(crashed, dtype=int).ravel()
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} rows but crashed has {len(y)}")
        self.n_features_in_ = X.shape[1]
        self.n_crashes_ = int(y.sum())
        self.forest_ = None
        if 0 < self.n_crashes_ < len(y):
            self.forest_ = ExtraTreesClassifier(
                n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf,
                max_features=None, random_state=self.random_state, n_jobs=1,
            ).fit(X, y, sample_weight=sample_weight)
        return self

    def p_crash(self, X) -> np.ndarray:
        check_is_fitted(self, "n_crashes_")
        X = clean_X(as_2d(X))
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model was fitted on {self.n_features_in_}")
        if self.forest_ is None:
            return np.zeros(len(X))
        return self.forest_.predict_proba(X)[:, 1]


def crash_dataset(records: Sequence[TrialRecord], unexplained: Sequence[bool] | None = None
                  ) -> tuple[list[TrialRecord], np.ndarray]:
    """The records that carry evidence and their labels (see :func:`crash_label`).

    ``unexplained``: one flag per record (see :func:`unexplained_ooms`); a flagged OOM is
    labelled a crash (1), since memory does not explain it.
    """
    flags = [False] * len(records) if unexplained is None else list(unexplained)
    if len(flags) != len(records):
        raise ValueError(f"{len(records)} records but {len(flags)} unexplained flags")
    rows = [(r, 1 if u and r.status is TrialStatus.OOM else lab)
            for r, u in zip(records, flags, strict=True) if (lab := crash_label(r)) is not None]
    return [r for r, _ in rows], np.array([lab for _, lab in rows], dtype=int)


def unexplained_ooms(memory_model, X, records: Sequence[TrialRecord], capacity=None,
                     threshold: float = UNEXPLAINED_P_OOM) -> np.ndarray:
    """One flag per record: an OOM that ``memory_model`` (fitted, anchored by measured peaks)
    gives P(OOM) below ``threshold`` at its device's capacity, having seen it (its median peak
    is under the capacity: memory does not explain the failure). ``X``: the encoded records;
    ``capacity``: bytes, for records that do not carry their own.

    An OOM with a reading at or above its capacity did run out of memory and is never flagged.
    The caller judges whether readings anchor the model: from labels alone it places configs
    only relative to these very failures, and every flag would be an artefact.
    """
    flags = np.zeros(len(records), dtype=bool)
    idx, caps = [], []
    for i, r in enumerate(records):
        cap = r.memory_capacity_bytes or getattr(r.hardware, "memory_bytes", None) or capacity
        if (r.status is TrialStatus.OOM and cap
                and not (r.peak_memory_max_bytes or 0) >= cap):
            idx.append(i)
            caps.append(float(cap))
    if idx:
        X = as_2d(X)
        flags[idx] = memory_model.p_oom(X[idx], np.array(caps)) < threshold
    return flags
