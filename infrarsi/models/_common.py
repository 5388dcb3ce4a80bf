"""Input checks shared by the cost models: NaN rows, prior arrays, fallback warnings."""

from __future__ import annotations

import warnings

import numpy as np

from infrarsi.errors import ModelFallbackWarning


def as_2d(X) -> np.ndarray:
    X = np.asarray(X, dtype=float)
    if X.ndim == 1:
        X = X[None, :]
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows x features), got shape {X.shape}")
    return X


def fallback(model: str, why: str) -> None:
    warnings.warn(f"{model}: {why}; using the priors only", ModelFallbackWarning, stacklevel=3)


def finite_rows(X: np.ndarray, *ys: np.ndarray, model: str = "model") -> np.ndarray:
    """Boolean mask of usable rows; warns (ModelFallbackWarning) when some are dropped."""
    keep = np.ones(len(X), dtype=bool)
    # A NaN in a column is dropped by column when the whole column is NaN (e.g. no workload
    # given), else by row.
    for y in ys:
        keep &= np.isfinite(np.asarray(y, dtype=float))
    col_nan = np.isnan(X).all(axis=0) if len(X) else np.zeros(X.shape[1], bool)
    keep &= np.isfinite(X[:, ~col_nan]).all(axis=1)
    if (~keep).any():
        warnings.warn(
            f"{model}: dropped {int((~keep).sum())} of {len(keep)} rows with NaN/inf features or "
            "targets", ModelFallbackWarning, stacklevel=3,
        )
    return keep


def prior_arrays(p: int, mean, std, default_std: float) -> tuple[np.ndarray, np.ndarray]:
    m = np.zeros(p) if mean is None else np.asarray(mean, dtype=float)
    s = np.full(p, float(default_std)) if std is None else np.asarray(std, dtype=float)
    if m.shape != (p,) or s.shape != (p,):
        raise ValueError(
            f"prior_mean/prior_std must have one entry per feature ({p}); got {m.shape}, {s.shape}"
            " -- build them with infrarsi.models.coef_prior(encoder, priors)"
        )
    return m, np.maximum(s, 1e-6)


def clean_X(X: np.ndarray) -> np.ndarray:
    """NaN columns (a missing workload/hardware) read as 0 (the prior's reference)."""
    return np.where(np.isnan(X), 0.0, X)


def setting_count(X: np.ndarray, delta: np.ndarray) -> int:
    J = np.flatnonzero(delta)
    if len(J) == 0 or X is None or len(X) == 0:
        return 0
    return int(np.all(np.isclose(X[:, J], delta[J]), axis=1).sum())
