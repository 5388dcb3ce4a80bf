"""Crash model: P(a config fails for a reason of its own, not memory) from the crashes seen.

Some settings fail only together: torch.compile traces float8 linears, and selective
checkpointing, but not float8 inside selective checkpointing; DeepEP kernels break a compile
graph only with expert parallelism. No single knob explains such a crash and a log-linear model
cannot express the conjunction; a tree can (a split on compile, then precision, then
checkpointing). So: a forest of extremely randomized trees on the encoded features (workload and
hardware included, so crashes of other workloads in the bank transfer where they apply), a
config-caused crash labelled 1, everything else that ran (ok, OOM, rejected) 0.

Only crashes a config causes teach it (:data:`CONFIG_FAULTS`): a lost worker or a failed
collective says nothing about the settings and is left out. Without both a crash and a config
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


def crash_dataset(records: Sequence[TrialRecord]) -> tuple[list[TrialRecord], np.ndarray]:
    """The records that carry evidence and their labels (see :func:`crash_label`)."""
    rows = [(r, lab) for r in records if (lab := crash_label(r)) is not None]
    return [r for r, _ in rows], np.array([lab for _, lab in rows], dtype=int)
