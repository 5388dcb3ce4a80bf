"""Global step-time model: Bayesian linear base centred on the priors + GP residual.

Why this family (measured by ``scripts/bench_models.py`` on the playbook table): a Bayesian
linear model on log features carries the knob priors exactly (its prior mean *is* the prior
effect, its prior covariance the prior's std), so a few trials move it and many dominate, and it
extrapolates sensibly to configs never seen (log-linear in parallel degrees and batch sizes).
What it cannot express (interactions: tensor parallelism across nodes, pipeline bubbles that
depend on accumulation) goes to a Gaussian-process residual with an ARD Matern kernel fitted by
marginal likelihood, whose variance adds to the linear posterior's. The GP sees at most
``max_gp_points`` rows (a random subset), which keeps fit time flat at 10,000 trials; the linear
part always sees them all.

Targets are ``log(step time)``; ``predict(X, return_std=True)`` gives mean and std on that
scale (Gaussian predictive, so an 80% interval is mean +- 1.2816 std).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from infrarsi.models._common import (
    as_2d,
    clean_X,
    fallback,
    finite_rows,
    prior_arrays,
    setting_count,
)
from infrarsi.models._gp import LeanGP
from infrarsi.models.encoding import FeatureEncoder
from infrarsi.models.priors import KnobPrior, coef_prior


class StepTimeModel(RegressorMixin, BaseEstimator):
    """Predict log step time with a calibrated std.

    Parameters
    ----------
    prior_mean, prior_std:
        Gaussian prior per feature coefficient (see :func:`infrarsi.models.coef_prior`);
        None means mean 0 and ``default_prior_std``.
    intercept, intercept_std:
        Prior on log step time of the default config; used as-is only when no trial is usable.
    residual:
        ``"gp"`` (linear base + GP residual) or ``"none"`` (linear base only).
    max_gp_points, min_gp_points:
        the GP residual fits on at most ``max_gp_points`` random rows, and only from
        ``min_gp_points`` ok trials on (fewer cannot identify its hyperparameters).
    prior_scales:
        candidate multipliers of every slope's prior std; the fit keeps the one with the
        highest evidence (empirical Bayes). ``(1.0,)`` trusts the prior as given; several let
        the data say how far to trust it -- e.g. a residual on experience from other workloads,
        which fits this workload well or does not.
    """

    def __init__(
        self,
        prior_mean=None,
        prior_std=None,
        default_prior_std: float = 1.0,
        intercept: float = 0.0,
        intercept_std: float = 3.0,
        residual: str = "gp",
        max_gp_points: int = 200,
        min_gp_points: int = 8,
        prior_scales: tuple[float, ...] = (1.0,),
        random_state: int = 0,
    ):
        self.prior_mean = prior_mean
        self.prior_std = prior_std
        self.default_prior_std = default_prior_std
        self.intercept = intercept
        self.intercept_std = intercept_std
        self.residual = residual
        self.max_gp_points = max_gp_points
        self.min_gp_points = min_gp_points
        self.prior_scales = prior_scales
        self.random_state = random_state

    @classmethod
    def from_priors(
        cls, encoder: FeatureEncoder, priors: list[KnobPrior] = (), **kwargs
    ) -> StepTimeModel:
        m, s = coef_prior(encoder, priors, "time", kwargs.pop("default_prior_std", 1.0))
        return cls(prior_mean=m, prior_std=s, **kwargs)

    # ---- fitting ------------------------------------------------------------------------
    def fit(self, X, y) -> StepTimeModel:
        if self.residual not in ("gp", "none"):
            raise ValueError(f"residual must be 'gp' or 'none', got {self.residual!r}")
        X = as_2d(X)
        y = np.asarray(y, dtype=float).ravel()
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} rows but y has {len(y)}")
        self.n_features_in_ = X.shape[1]
        m, s = prior_arrays(X.shape[1], self.prior_mean, self.prior_std, self.default_prior_std)
        keep = finite_rows(X, y, model="StepTimeModel")
        X, y = clean_X(X[keep]), y[keep]
        self.X_fit_ = X
        self.gp_ = None
        self.fallen_back_ = len(y) == 0
        if self.fallen_back_:
            fallback("StepTimeModel", "no ok trial with a finite step time")
            self.coef_mean_ = np.concatenate([[self.intercept], m])
            self.coef_cov_ = np.diag(np.concatenate([[self.intercept_std], s]) ** 2)
            self.noise_var_ = 0.1**2
            return self
        self._fit_linear(X, y, m, s)
        if self.residual == "gp" and len(y) >= self.min_gp_points:
            self._fit_gp(X, y - self._linear_mean(X))
        return self

    def _fit_linear(self, X, y, m, s) -> None:
        """Conjugate Bayesian linear fit; the noise variance (and the prior scale, when there
        are several ``prior_scales``) by maximum evidence."""
        n = len(y)
        Z = np.hstack([np.ones((n, 1)), X])
        m0 = np.concatenate([[np.mean(y - X @ m)], m])
        r = y - Z @ m0
        ZtZ, Ztr = Z.T @ Z, Z.T @ r
        best = None
        for scale in self.prior_scales:
            P0 = 1.0 / np.concatenate([[self.intercept_std], s * scale]) ** 2
            log_var, nle = self._noise_by_evidence(n, P0, r, ZtZ, Ztr)
            if best is None or nle < best[0]:
                best = (nle, P0, log_var, scale)
        nle, P0, log_var, self.prior_scale_ = best
        # log marginal likelihood of y (up to the constant every model of the same y shares):
        # lets a caller weigh this model against another of the same trials
        self.log_evidence_ = -nle
        v = float(np.exp(log_var))
        A = np.diag(P0) + ZtZ / v
        cov = np.linalg.inv(A)
        self.coef_mean_ = m0 + cov @ (Ztr / v)
        self.coef_cov_ = (cov + cov.T) / 2
        self.noise_var_ = v

    @staticmethod
    def _noise_by_evidence(n, P0, r, ZtZ, Ztr) -> tuple[float, float]:
        """(log noise variance, negative log evidence) at the evidence's maximum."""

        def neg_log_evidence(log_var: float) -> float:
            v = np.exp(log_var)
            A = np.diag(P0) + ZtZ / v
            L = np.linalg.cholesky(A)
            b = np.linalg.solve(L, Ztr / v)
            quad = r @ r / v - b @ b
            logdet = n * log_var - np.log(P0).sum() + 2 * np.log(np.diag(L)).sum()
            return 0.5 * (quad + logdet)

        res = minimize_scalar(neg_log_evidence, bounds=(np.log(1e-6), np.log(10.0)), method="bounded")
        return float(res.x), float(res.fun)

    def _fit_gp(self, X, resid) -> None:
        rng = np.random.default_rng(self.random_state)
        idx = np.arange(len(resid))
        if len(idx) > self.max_gp_points:
            idx = rng.choice(idx, self.max_gp_points, replace=False)
        Xs = X[idx]
        sd = Xs.std(axis=0)
        self.gp_cols_ = np.flatnonzero(sd > 1e-9)
        if len(self.gp_cols_) == 0:
            return
        self.gp_mu_ = Xs[:, self.gp_cols_].mean(axis=0)
        self.gp_sd_ = sd[self.gp_cols_]
        try:
            gp = LeanGP().fit(self._gp_input(Xs), resid[idx], noise0=self.noise_var_)
        except (np.linalg.LinAlgError, ValueError) as exc:
            fallback("StepTimeModel", f"GP residual failed ({exc}); linear base only")
            return
        self.gp_ = gp

    # ---- prediction ---------------------------------------------------------------------
    def _gp_input(self, X):
        return (X[:, self.gp_cols_] - self.gp_mu_) / self.gp_sd_

    def _linear_mean(self, X):
        return self.coef_mean_[0] + X @ self.coef_mean_[1:]

    def predict(self, X, return_std: bool = False):
        check_is_fitted(self, "coef_mean_")
        X = clean_X(as_2d(X))
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model was fitted on {self.n_features_in_}")
        mean = self._linear_mean(X)
        Z = np.hstack([np.ones((len(X), 1)), X])
        var = np.einsum("ij,jk,ik->i", Z, self.coef_cov_, Z)
        if self.gp_ is not None:
            gm, gs = self.gp_.predict(self._gp_input(X))
            mean = mean + gm
            var = var + gs**2
        else:
            var = var + self.noise_var_
        return (mean, np.sqrt(var)) if return_std else mean

    # ---- for prior revision ---------------------------------------------------------------
    def coef_posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and covariance of the per-feature coefficients (no intercept)."""
        check_is_fitted(self, "coef_mean_")
        return self.coef_mean_[1:].copy(), self.coef_cov_[1:, 1:].copy()

    def setting_counts(self, delta: np.ndarray) -> int:
        check_is_fitted(self, "coef_mean_")
        return setting_count(self.X_fit_, delta)
