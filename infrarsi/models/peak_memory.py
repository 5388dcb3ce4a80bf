"""Censored peak-memory model: a lifelines accelerated-failure-time fit on log features.

Peak memory plays the role of a survival time: an ok trial observed its peak; an OOM trial
only says the peak exceeded the device capacity, so it enters right-censored there. Dropping
those rows or pretending the peak equals the capacity biases the model exactly where the
expensive trials are (``scripts/bench_models.py`` measures both mistakes).

Family: Weibull or log-normal AFT, chosen by AIC (``distribution="auto"``). Both families are
fitted to the same penalized likelihood in numpy (same parameter count, so AIC reduces to the
likelihood; above ``auto_max_rows`` rows on a random subset), and lifelines fits the winner,
started at the numpy optimum: lifelines stays the fit of record (its Hessian gives the
coefficient covariance) at a third of the cost of two lifelines fits.

Regularization and physics, as one penalty inside lifelines' own optimizer (it optimizes the
*mean* log-likelihood on standardized covariates, so the penalty below is scaled to match):

* a Gaussian prior centred on the prior effect, ``beta_j ~ N(m_j, s_j^2)``: the penalty is
  ``(beta_j - m_j)^2 / (2 n s_j^2)`` per mean-likelihood unit, so it is a proper Bayesian prior
  whose weight falls as ``1/n`` -- a handful of trials fit, many trials dominate;
* physics as a soft sign constraint (a larger micro-batch never uses less memory,
  checkpointing never more, see :data:`infrarsi.models.priors.MEMORY_MONOTONE`): a one-sided
  quadratic ``monotone_strength * min(0, sign_j * beta_j)^2``. Soft, not hard, so a knob that
  breaks the rule on some stack still fits instead of failing the search.

Prediction is plain numpy on the fitted parameters (no pandas), so ``p_oom`` scores 10,000
candidates in milliseconds. ``p_oom`` integrates the coefficient uncertainty (Laplace
covariance from lifelines' Hessian) into the predictive distribution; quantiles are plug-in.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from infrarsi.models._common import (
    as_2d,
    clean_X,
    fallback,
    finite_rows,
    prior_arrays,
    setting_count,
)
from infrarsi.models._lifelines import (
    SHAPE_PRIOR,
    fit_aft,
    fit_numpy,
    select_family,
    shape_identified,
)
from infrarsi.models.encoding import FeatureEncoder
from infrarsi.models.priors import KnobPrior, coef_prior, monotone_signs

_GH_X, _GH_W = np.polynomial.hermite.hermgauss(9)

# The smallest spread (std of log peak memory around the fitted location) a prediction keeps.
# A log-linear model is not the truth: with a few trials it interpolates their peaks almost
# exactly (a spread of 2-3%), and a config far from them then gets P(OOM) ~ 0 at 90% of the
# capacity. On the playbook table that made configs predicted at P(OOM) < 0.1 run out of
# memory 12-13% of the time; a 10% floor is the misfit such a model has away from its data.
MIN_SPREAD = 0.1


# A prior-only fit (too few trials for lifelines) still knows how well it is placed: through an
# observed peak its location is measured (std MIN_SPREAD, a measurement's misfit); from OOMs
# alone with a location another fit stated (experience) it is known to about a factor 1.35;
# with neither it is wide. The spread is the shape prior's centre (20%) where there is a
# location, else wide. They were 0.5 and std 1 everywhere, which put P(OOM) near 0.5 on most
# candidates after one trial and left the risk cap nothing to choose from (measured, 4-5 seeds,
# infrarsi only: simulator cold 0.827 -> 0.846, +exp 0.881 -> 0.905; table cold 0.952 -> 0.969,
# +exp 0.953 -> 0.965; fail shares equal or lower).
FALLBACK_SPREAD = 0.2
FALLBACK_WIDE_SPREAD = 0.5
FALLBACK_LOC_SD = {"peak": MIN_SPREAD, "stated": 0.3, "none": 1.0}
# Labels alone (ok without a reading, OOM) and no location stated by another fit: the location
# intercept's prior is centred where the prior slopes put the average trial at the capacities
# seen, std 1 (a factor e), weighed as one pseudo-observation.
LABELS_LOC_SD = 1.0
# An ok trial without a reading says only that its peak was at most the capacity. Where below
# it is the model's own belief (its predictive distribution, truncated at the bound), read on
# this grid of log peaks under the bound (steps of ~5%; the mass lower still sits at the grid's
# lowest point, an overstatement of the risk). Taking the peak at the bound itself, as an exact
# reading would be, put P(OOM) 0.5 on the trial's own config and on every neighbour the model
# calls no lighter, so a search never moved off the baseline's layout where no trial had a
# reading (vTrain's table: its best was the baseline with micro-batch 2, predicted best).
CENSORED_GRID = np.linspace(0.0, 2.0, 41)


def _floor_spread(dist: str, shape: float, min_spread: float) -> float:
    """The shape with its spread floored: log-normal sigma, or Weibull rho (spread pi/(sqrt6 rho))."""
    if not min_spread:
        return shape
    if dist == "lognormal":
        return max(shape, min_spread)
    return min(shape, np.pi / np.sqrt(6.0) / min_spread)


class PeakMemoryModel(BaseEstimator):
    """Peak memory per device given features, with right-censored OOM trials.

    Parameters
    ----------
    distribution: "auto" | "lognormal" | "weibull".
    prior_mean, prior_std: Gaussian prior on each coefficient of log memory
        (:func:`infrarsi.models.coef_prior` with ``target="memory"``); None: 0 and
        ``default_prior_std``.
    monotone: per-column sign (+1, -1, 0) that the coefficient should have (physics);
        None: no constraint. :meth:`from_priors` fills it from ``MEMORY_MONOTONE``.
    capacity: default capacity for :meth:`p_oom` (same unit as the fitted memory).
    prior_intercept: log peak memory at ``X = 0`` that another fit stated (experience), for
        the fits that cannot place it themselves: with no observed peak, only OOMs, it is
        raised as far as those OOMs demand, never lowered.
    encoder: the :class:`FeatureEncoder` behind X, so :meth:`memory_prices` can name knobs.
    warm_start: a fitted PeakMemoryModel of (a subset of) the same rows, e.g. the previous fit
        of a search that since ran one more trial: an interval fit starts at its optimum.
    prior_scales: multipliers of ``prior_std`` (and of the width of ``prior_intercept``, where
        a fit without an observed peak leans on it); the fit keeps the one whose Laplace evidence
        (marginal likelihood of the trials) is highest -- empirical Bayes, as the step-time
        model does. ``(1.0,)`` trusts the prior's width as given; several let the trials say
        how far a transferred prior holds (the chosen one is ``prior_scale_``).
    """

    def __init__(
        self,
        distribution: str = "auto",
        prior_mean=None,
        prior_std=None,
        default_prior_std: float = 1.0,
        monotone=None,
        monotone_strength: float = 1e4,
        capacity: float | None = None,
        prior_intercept: float | None = None,
        param_uncertainty: bool = True,
        auto_max_rows: int = 2000,
        min_spread: float = MIN_SPREAD,
        encoder: FeatureEncoder | None = None,
        random_state: int = 0,
        warm_start: PeakMemoryModel | None = None,
        prior_scales: tuple[float, ...] = (1.0,),
    ):
        self.distribution = distribution
        self.prior_mean = prior_mean
        self.prior_std = prior_std
        self.default_prior_std = default_prior_std
        self.monotone = monotone
        self.monotone_strength = monotone_strength
        self.capacity = capacity
        self.prior_intercept = prior_intercept
        self.param_uncertainty = param_uncertainty
        self.auto_max_rows = auto_max_rows
        self.min_spread = min_spread
        self.encoder = encoder
        self.random_state = random_state
        self.warm_start = warm_start
        self.prior_scales = prior_scales

    @classmethod
    def from_priors(
        cls, encoder: FeatureEncoder, priors: list[KnobPrior] = (), physics=None, **kwargs
    ) -> PeakMemoryModel:
        m, s = coef_prior(encoder, priors, "memory", kwargs.pop("default_prior_std", 1.0))
        return cls(prior_mean=m, prior_std=s, monotone=monotone_signs(encoder, physics),
                   encoder=encoder, **kwargs)

    # ---- fitting ------------------------------------------------------------------------
    def fit(self, X, memory=None, observed=None) -> PeakMemoryModel:
        """``memory``: peak where ``observed``, capacity exceeded where not (right-censored).

        ``memory`` may also be a scikit-survival structured array ``(event, time)``, or an
        ``(n, 2)`` array of interval bounds ``[lower, upper]`` (see :meth:`fit_interval`).
        """
        if self.distribution not in ("auto", "lognormal", "weibull"):
            raise ValueError(f"distribution must be auto|lognormal|weibull, got {self.distribution!r}")
        arr = np.asarray(memory) if memory is not None else None
        if arr is not None and not arr.dtype.names and arr.ndim == 2 and arr.shape[1] == 2:
            if observed is not None:
                raise ValueError("pass either (n, 2) interval bounds or memory + observed, not both")
            return self.fit_interval(X, arr[:, 0], arr[:, 1])
        memory, observed = _split_y(memory, observed)
        X = as_2d(X)
        if len(memory) != len(X):
            raise ValueError(f"X has {len(X)} rows but memory has {len(memory)}")
        p = X.shape[1]
        self.n_features_in_ = p
        m, s = prior_arrays(p, self.prior_mean, self.prior_std, self.default_prior_std)
        sign = np.zeros(p) if self.monotone is None else np.asarray(self.monotone, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            logm = np.log(np.where(memory > 0, memory, np.nan))
        keep = finite_rows(X, logm, model="PeakMemoryModel")
        X, logm, observed = clean_X(X[keep]), logm[keep], observed[keep]
        self.X_fit_ = X
        obs_log = logm[observed]
        self.log_scale_ = float(np.median(obs_log)) if len(obs_log) else (
            float(np.max(logm)) if len(logm) else 0.0)
        self.fallen_back_ = False
        self.n_left_censored_ = 0
        self.log_shape_ = self.shape_held_ = None
        if not observed.any():
            self._fallback(X, logm, observed, m, s, "no trial with an observed peak (all OOM or none)")
            return self
        if len(logm) < 2:  # lifelines cannot fit one row; the prior slopes through its peak are the MAP
            self._fallback(X, logm, observed, m, s, "a single trial: prior slopes through its peak")
            return self
        rng = np.random.default_rng(self.random_state)
        t = logm - self.log_scale_
        s = s * self._prior_scale(self.distribution, X, t, np.where(observed, t, np.inf),
                                  m, s, sign)
        try:
            self._fit_lifelines(X, t, observed, m, s, sign, rng)
        except Exception as exc:  # noqa: BLE001 - ConvergenceError, LinAlgError, lifelines ValueError
            self._fallback(X, logm, observed, m, s, f"lifelines fit failed ({type(exc).__name__}: "
                           f"{str(exc).strip().splitlines()[0][:120]})")
        return self

    def fit_interval(self, X, lower, upper) -> PeakMemoryModel:
        """Fit peak memory known only to lie in ``[lower, upper]`` per trial.

        An observed peak is ``lower == upper``; an OOM is ``[capacity, inf)`` (right-censored,
        or from a partial reading if higher); an ok trial without a reading is ``[0, capacity]``
        (left-censored). So P(OOM) is learned from ok/OOM labels alone: with both kinds of
        labels the likelihood places the location and the slopes between them, where a
        right-censored-only fit, which must drop the unread ok trials, sees OOMs alone and can
        only fall back to the priors. Without a left-censored or proper interval row this is
        exactly :meth:`fit` (the lifelines fit of record); with one, the same penalized
        likelihood is fitted in numpy (:func:`~infrarsi.models._lifelines.fit_numpy`), plus a
        weak prior on the location intercept where no peak was observed (labels alone cannot
        tell a location far below the capacity from one just below).
        """
        X = as_2d(X)
        lo = np.asarray(lower, dtype=float).ravel()
        hi = np.asarray(upper, dtype=float).ravel()
        if not (len(lo) == len(hi) == len(X)):
            raise ValueError(f"X has {len(X)} rows, lower {len(lo)}, upper {len(hi)}")
        if np.any(hi < lo):
            raise ValueError("interval bounds need lower <= upper in every row")
        exact = (lo == hi) & (lo > 0)
        right = np.isinf(hi) & (lo > 0)
        if np.all(exact | right):  # no left-censored or interval row: the classic fit
            return self.fit(X, np.where(exact, lo, lo), exact)
        if self.distribution not in ("auto", "lognormal", "weibull"):
            raise ValueError(f"distribution must be auto|lognormal|weibull, got {self.distribution!r}")
        p = X.shape[1]
        self.n_features_in_ = p
        m, s = prior_arrays(p, self.prior_mean, self.prior_std, self.default_prior_std)
        sign = np.zeros(p) if self.monotone is None else np.asarray(self.monotone, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_lo = np.where(lo > 0, np.log(np.where(lo > 0, lo, 1.0)), -np.inf)
            log_hi = np.log(hi)
        keep = finite_rows(X, np.where(np.isfinite(log_lo), log_lo, log_hi), model="PeakMemoryModel")
        keep &= ~(np.isinf(log_lo) & np.isinf(log_hi))  # (0, inf): no information
        X, log_lo, log_hi = clean_X(X[keep]), log_lo[keep], log_hi[keep]
        exact = log_lo == log_hi
        self.X_fit_ = X
        self.fallen_back_ = False
        self.log_shape_ = self.shape_held_ = None
        self.n_left_censored_ = int(np.sum(np.isinf(log_lo)))
        self.log_scale_ = float(np.median(log_lo[exact])) if exact.any() else float(
            np.median(np.where(np.isfinite(log_hi), log_hi, log_lo)))
        left = np.isinf(log_lo)
        right = np.isinf(log_hi)
        if not exact.any() and not (left.any() and right.any()):
            why = ("only ok trials without a reading (no OOM, no observed peak)" if left.any()
                   else "no trial with an observed peak (all OOM or none)")
            obs = np.zeros(len(X), bool)
            self._fallback(X, np.where(right, log_lo, log_hi), obs, m, s, why,
                           below=not right.any())
            return self
        t_lo, t_hi = log_lo - self.log_scale_, log_hi - self.log_scale_
        b0_prior = None
        if not exact.any():
            # labels alone: a weak prior on the location (the capacity's median where no other
            # fit stated one, one pseudo-observation of std LABELS_LOC_SD)
            if self.prior_intercept is not None:
                c0, sd0 = float(self.prior_intercept) - self.log_scale_, FALLBACK_LOC_SD["stated"]
            else:
                c0 = float(np.mean(np.where(right, t_lo, t_hi) - X @ m))
                sd0 = LABELS_LOC_SD
            b0_prior = (c0, 1.0 / (len(X) * sd0**2))
        const = X.std(axis=0) < 1e-9
        cols = np.flatnonzero(~const)
        # labels alone at one capacity cannot place the spread (a flat direction, see
        # shape_identified): hold it at the shape prior's centre, the slopes are then in its units
        held = not shape_identified(t_lo, t_hi)
        self.shape_held_ = held
        c = self._prior_scale(self.distribution, X, t_lo, t_hi, m, s, sign, b0_prior, held)
        s = s * c
        if b0_prior is not None and self.prior_intercept is not None:
            b0_prior = (b0_prior[0], b0_prior[1] / c**2)  # a stated location is transferred too
        args = (m[cols], s[cols], sign[cols], self.monotone_strength, self.min_spread)
        dists = ["lognormal", "weibull"] if self.distribution == "auto" else [self.distribution]
        fits = {}
        for d in dists:
            x0 = self._start(d, X, cols, const)
            if x0 is None and d == "weibull" and "lognormal" in fits:
                # from the log-normal optimum, with the same mean: a Weibull start far from
                # the data overflows its likelihood (exp(rho * distance))
                th = fits["lognormal"][1]
                x0 = np.concatenate([th[:-1], [SHAPE_PRIOR[d] if held else
                                               np.log(np.pi / np.sqrt(6) / np.exp(th[-1]))]])
                x0[-2] += 0.5772 / np.exp(x0[-1])
            try:
                fits[d] = fit_numpy(d, X[:, cols], t_lo, t_hi, *args, b0_prior=b0_prior,
                                    x0=x0, fixed_la=SHAPE_PRIOR[d] if held else None)
            except Exception as exc:  # noqa: BLE001 - a failed family leaves the other
                last = exc
        if not fits:
            self._fallback(X, np.where(right, log_lo, log_hi), np.zeros(len(X), bool), m, s,
                           f"interval-censored fit failed ({type(last).__name__}: {last})")
            return self
        self.aic_ = {d: f.aic for d, (f, _) in fits.items()}
        dist = min(self.aic_, key=self.aic_.get)
        fit, th = fits[dist]
        self.log_shape_ = float(th[-1])  # unfloored, for a warm start
        self._store_fit(fit, X, m, s, const, cols)
        return self

    def _prior_scale(self, dist, X, t_lo, t_hi, m, s, sign, b0_prior=None,
                     held=False) -> float:
        """The multiplier of ``prior_std`` (one of ``prior_scales``) with the highest Laplace
        evidence, stored as ``prior_scale_``.

        ``log Z ~ -n F(theta*) - sum_j log s_j + log det(cov) / 2`` (F the penalized mean
        objective, s_j the prior stds, cov the location parameters' Laplace covariance), up to
        terms equal for every scale. Why: a prior transferred from other workloads is as wide
        as the caller guessed; too wide, and every prediction away from the own trials carries
        that width as parameter uncertainty, flattening P(OOM) towards 0.5 (predicted 0.15 ran
        out of memory 3% of the time on the Ultra-Scale labels with experience); too narrow,
        and the own trials cannot move it. The own trials' evidence says which.
        """
        scales = tuple(self.prior_scales)
        self.prior_scale_ = float(scales[0]) if scales else 1.0
        if len(scales) < 2 or len(X) < 2:
            return self.prior_scale_
        const = X.std(axis=0) < 1e-9
        cols = np.flatnonzero(~const)
        d = "lognormal" if dist == "auto" else dist
        best, best_z = self.prior_scale_, -np.inf
        for c in scales:
            sc = s[cols] * c
            bp = b0_prior
            if bp is not None and self.prior_intercept is not None:
                bp = (bp[0], bp[1] / c**2)
            try:
                fit, _ = fit_numpy(d, X[:, cols], t_lo, t_hi, m[cols], sc, sign[cols],
                                   self.monotone_strength, self.min_spread, b0_prior=bp,
                                   fixed_la=SHAPE_PRIOR[d] if held else None)
                sign_det, logdet = np.linalg.slogdet(fit.loc_cov)
            except Exception:  # noqa: BLE001 - a scale that cannot be fitted has no evidence
                continue
            z = -(fit.aic - 2 * (len(cols) + 2)) / 2 - float(np.sum(np.log(sc))) + 0.5 * logdet
            if bp is not None and self.prior_intercept is not None:
                z -= np.log(c)  # the stated location's prior std, scaled with the slopes'
            if sign_det > 0 and np.isfinite(z) and z > best_z:
                best, best_z = float(c), z
        self.prior_scale_ = best
        return best

    def _start(self, dist: str, X, cols, const) -> np.ndarray | None:
        """``warm_start``'s optimum as a start of this fit: ``[slopes of cols, intercept at
        this log_scale_ with constant columns absorbed, log shape]``, or None."""
        prev = self.warm_start
        if (prev is None or getattr(prev, "dist_", None) != dist or getattr(prev, "fallen_back_", True)
                or getattr(prev, "log_shape_", None) is None
                or len(prev.coef_) != X.shape[1]):
            return None
        b0 = prev.log_scale_ + prev.intercept_ - self.log_scale_
        if const.any():
            b0 += float(X[0, const] @ prev.coef_[const])
        return np.concatenate([prev.coef_[cols], [b0, prev.log_shape_]])
    def _fit_lifelines(self, X, t, observed, m, s, sign, rng) -> None:
        const = X.std(axis=0) < 1e-9
        cols = np.flatnonzero(~const)
        args = (m[cols], s[cols], sign[cols], self.monotone_strength, self.min_spread)
        dist, warm = self.distribution, None
        if dist == "auto":
            # AIC on the identical penalized likelihood, computed in numpy (both families at
            # lifelines' cost would double the fit time); lifelines then fits the winner.
            sub = np.arange(len(t))
            if len(sub) > self.auto_max_rows:
                sub = rng.choice(sub, self.auto_max_rows, replace=False)
            dist, self.aic_, warm = select_family(X[sub][:, cols], t[sub], observed[sub], *args)
            if len(sub) < len(t):
                warm = None
        try:
            fit = fit_aft(dist, X[:, cols], t, observed, *args, warm=warm)
        except Exception:  # noqa: BLE001 - try the other family before giving up
            if self.distribution != "auto":
                raise
            dist = "weibull" if dist == "lognormal" else "lognormal"
            fit = fit_aft(dist, X[:, cols], t, observed, *args)
        if self.distribution != "auto":
            self.aic_ = {dist: fit.aic}
        self._store_fit(fit, X, m, s, const, cols)

    def _store_fit(self, fit, X, m, s, const, cols) -> None:
        p = X.shape[1]
        coef = m.copy()
        coef[cols] = fit.coef
        # constant columns were absorbed into the fitted intercept; give them the prior slope
        intercept = fit.intercept - float(X[0, const] @ m[const]) if const.any() else fit.intercept
        cov = np.zeros((p + 1, p + 1))
        idx = np.concatenate([[0], cols + 1])
        cov[np.ix_(idx, idx)] = fit.loc_cov
        cov[np.flatnonzero(const) + 1, np.flatnonzero(const) + 1] = s[const] ** 2
        self.dist_, self.intercept_, self.coef_ = fit.dist, intercept, coef
        self.shape_ = _floor_spread(fit.dist, fit.shape, self.min_spread)
        self.loc_cov_ = cov
        # a constant column's slope is uncertain only away from the value it was seen at
        self.var_center_ = np.where(const, X[0], 0.0)

    def _fallback(self, X, logm, observed, m, s, why: str, below: bool = False) -> None:
        fallback("PeakMemoryModel", why)
        self.fallen_back_ = True
        self.dist_, self.aic_ = "lognormal", {}
        if observed.any():
            self.shape_, loc_sd = FALLBACK_SPREAD, FALLBACK_LOC_SD["peak"]
        elif self.prior_intercept is not None:
            self.shape_, loc_sd = FALLBACK_SPREAD, FALLBACK_LOC_SD["stated"]
        else:
            self.shape_, loc_sd = FALLBACK_WIDE_SPREAD, FALLBACK_LOC_SD["none"]
        if observed.any():
            b0 = float(np.mean(logm[observed] - X[observed] @ m)) - self.log_scale_
        elif len(logm) and below:  # only ok trials without a reading: 50% below the capacities
            b0 = float(np.mean(logm - X @ m)) - np.log(1.5) - self.log_scale_
            if self.prior_intercept is not None:
                b0 = min(b0, float(self.prior_intercept) - self.log_scale_)
        elif len(logm):  # only censored rows: put the median 50% above the capacities seen
            b0 = float(np.mean(logm - X @ m)) + np.log(1.5) - self.log_scale_
            if self.prior_intercept is not None:
                b0 = max(b0, float(self.prior_intercept) - self.log_scale_)
        elif self.prior_intercept is not None:
            b0 = float(self.prior_intercept) - self.log_scale_
        elif self.capacity:  # nothing at all: half the capacity, wide
            b0 = float(np.log(self.capacity * 0.5)) - self.log_scale_
        else:
            b0 = 0.0
        self.intercept_, self.coef_ = b0, m.copy()
        self.loc_cov_ = np.diag(np.concatenate([[loc_sd**2], s**2]))
        self.var_center_ = X.mean(axis=0) if len(X) else np.zeros(len(m))

    # ---- prediction ---------------------------------------------------------------------
    def _loc(self, X) -> tuple[np.ndarray, np.ndarray]:
        check_is_fitted(self, "coef_")
        X = clean_X(as_2d(X))
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model was fitted on {self.n_features_in_}")
        mu = self.log_scale_ + self.intercept_ + X @ self.coef_
        if not self.param_uncertainty:
            return mu, np.zeros(len(mu))
        Z = np.hstack([np.ones((len(X), 1)), X - self.var_center_])
        return mu, np.einsum("ij,jk,ik->i", Z, self.loc_cov_, Z)

    def predict_quantiles(self, X, q=(0.1, 0.5, 0.9)) -> np.ndarray:
        """Plug-in quantiles of peak memory, shape ``(n, len(q))`` (a scalar q gives ``(n,)``)."""
        mu, _ = self._loc(X)
        qs = np.atleast_1d(np.asarray(q, dtype=float))
        if self.dist_ == "lognormal":
            off = self.shape_ * ndtri(qs)
        else:
            off = np.log(-np.log1p(-qs)) / self.shape_
        out = np.exp(mu[:, None] + off[None, :])
        return out[:, 0] if np.ndim(q) == 0 else out

    def predict(self, X) -> np.ndarray:
        """Median peak memory."""
        return self.predict_quantiles(X, 0.5)

    def survival(self, X, threshold) -> np.ndarray:
        """P(peak > threshold | x), vectorized; ``threshold`` scalar or one per row."""
        mu, v = self._loc(X)
        z = np.log(np.asarray(threshold, dtype=float)) - mu
        if self.dist_ == "lognormal":
            return ndtr(-z / np.sqrt(self.shape_**2 + v))
        # Weibull: S = exp(-exp(rho * (z - e))), e ~ N(0, v) by Gauss-Hermite quadrature
        e = np.sqrt(2 * v)[:, None] * _GH_X[None, :]
        s = np.exp(-np.exp(np.clip(self.shape_ * (z[..., None] - e), -50, 50)))
        return s @ _GH_W / np.sqrt(np.pi)

    def p_oom(self, X, capacity=None) -> np.ndarray:
        """P(OOM | x) = S(capacity | x)."""
        cap = self.capacity if capacity is None else capacity
        if cap is None:
            raise ValueError("p_oom needs a capacity: pass capacity= here or to the constructor")
        return self.survival(X, cap)

    def p_oom_near(self, X, X_seen, bounds, capacity: float, noise: float = 0.05,
                   p=None) -> np.ndarray:
        """P(OOM) of ``X`` bounded by the outcomes of trials of the same workload and device.

        The fitted spread treats every trial's misfit as independent, but memory is nearly
        deterministic: a config that differs from one that ran out of memory only by knobs
        the model believes add memory (or are memory-neutral) will run out too, whatever the
        spread says. So, per seen trial ``j`` with log peak bounds and the model's difference
        ``delta = mu(x) - mu(x_j)`` (its variance from the coefficient covariance, plus
        ``noise**2`` for run-to-run variation):

        * an OOM (peak_j > capacity) bounds P(OOM | x) from below by P(delta >= 0);
        * an ok trial with a reading (peak_j = upper_j) bounds it from above by
          P(delta > log(capacity / upper_j));
        * an ok trial without one (peak_j <= upper_j) bounds it from above by that probability
          averaged over where the model believes peak_j sat below upper_j (see
          :data:`CENSORED_GRID`, :meth:`_p_oom_given_fit`).

        ``p``: the model's own P(OOM) of ``X`` (computed if None), clipped into the tightest
        bounds; where the bounds cross (the seen outcomes disagree), the model's value stays.
        """
        X = clean_X(as_2d(X))
        p = self.p_oom(X, capacity) if p is None else np.asarray(p, float)
        Xs = clean_X(as_2d(X_seen))
        b = np.asarray(bounds, float).reshape(-1, 2)
        if not len(Xs):
            return p
        oom = np.isinf(b[:, 1]) & (b[:, 0] >= capacity)
        ok = np.isfinite(b[:, 1]) & (b[:, 1] <= capacity)
        cov = self.loc_cov_[1:, 1:] if self.param_uncertainty else np.zeros((X.shape[1],) * 2)
        lower, upper = np.zeros(len(X)), np.ones(len(X))
        for j in np.flatnonzero(oom | ok):
            d = X - Xs[j]
            delta = d @ self.coef_
            sd = np.sqrt(np.einsum("ij,jk,ik->i", d, cov, d) + noise**2)
            if oom[j]:
                lower = np.maximum(lower, ndtr(delta / sd))
            elif b[j, 0] >= b[j, 1]:  # a reading: the peak is known
                upper = np.minimum(upper, ndtr((delta - np.log(capacity / b[j, 1])) / sd))
            else:
                upper = np.minimum(upper, self._p_oom_given_fit(Xs[j], b[j], delta, sd, capacity))
        agree = lower <= upper
        return np.where(agree, np.clip(p, lower, upper), p)

    def _p_oom_given_fit(self, x_seen, bounds, delta, sd, capacity: float) -> np.ndarray:
        """P(OOM) of configs ``delta`` (log units, std ``sd``) above a seen config whose peak
        was within ``bounds`` (finite upper) but not read: P(peak_j e^delta > capacity) averaged
        over the model's distribution of peak_j truncated to ``bounds``."""
        lo, hi = float(bounds[0]), float(bounds[1])
        t = np.log(hi) - CENSORED_GRID
        if lo > 0:
            t = t[t > np.log(lo)]  # keeps t[0]: an unread peak's bounds are lo < hi
        edges = np.append(t, np.log(lo)) if lo > 0 else t
        below = 1.0 - self.survival(np.repeat(x_seen[None, :], len(edges), axis=0), np.exp(edges))
        below = below if lo > 0 else np.append(below, 0.0)  # P(peak_j <= each edge)
        mass = np.append(below[:-2] - below[1:-1], below[-2] - below[-1])  # cells, then the rest
        total = below[0] - below[-1]
        if not total > 1e-12:  # the model cannot place the peak under the bound: assume it at it
            return ndtr((delta - np.log(capacity / hi)) / sd)
        at = np.append((t[:-1] + t[1:]) / 2, t[-1]) - np.log(capacity)
        return ndtr((delta[:, None] + at[None, :]) / sd[:, None]) @ (np.maximum(mass, 0.0) / total)

    # ---- prices and prior revision ------------------------------------------------------------
    def coef_posterior(self) -> tuple[np.ndarray, np.ndarray]:
        check_is_fitted(self, "coef_")
        return self.coef_.copy(), self.loc_cov_[1:, 1:].copy()

    def setting_counts(self, delta: np.ndarray) -> int:
        check_is_fitted(self, "coef_")
        return setting_count(self.X_fit_, delta)

    def memory_prices(self, encoder: FeatureEncoder | None = None, z: float = 1.96) -> pd.DataFrame:
        """What each knob setting costs in memory vs its default: a table a person reads.

        Columns: knob, setting, effect (multiplicative, e.g. 1.8 = +80%), ci_low, ci_high,
        log_effect, log_se, n (fitted trials at that setting), source ("fit" or "prior").
        Without an encoder, one row per feature column (effect of +1 unit).
        """
        coef, cov = self.coef_posterior()
        enc = encoder or self.encoder
        if enc is not None:
            items = [(k, v, enc.setting_delta(k, v)) for k, v in enc.knob_settings()]
        else:
            eye = np.eye(len(coef))
            items = [(f"x{j}", "+1", eye[j]) for j in range(len(coef))]
        rows = []
        for knob, setting, d in items:
            le, se = float(d @ coef), float(np.sqrt(max(d @ cov @ d, 0.0)))
            rows.append({
                "knob": knob, "setting": setting, "effect": np.exp(le),
                "ci_low": np.exp(le - z * se), "ci_high": np.exp(le + z * se),
                "log_effect": le, "log_se": se, "n": self.setting_counts(d),
                "source": "prior" if self.fallen_back_ else "fit",
            })
        return pd.DataFrame(rows)


def memory_bounds(record, capacity: float | None = None) -> tuple[float, float] | None:
    """``(lower, upper)`` bytes of one trial's peak memory, or None when it says nothing.

    An observed peak is exact; an OOM is right-censored at the capacity it exceeded (its
    ``memory_censor_bytes``, or a partial reading if higher); an ok trial without a reading is
    left-censored at its device's capacity (it fit). ``capacity``: the device's, for records
    that do not carry their own. Errors and rejected trials say nothing about memory.
    """
    from infrarsi.trial import TrialStatus

    cap = (record.memory_capacity_bytes or getattr(record.hardware, "memory_bytes", None)
           or capacity)
    if record.status is TrialStatus.OOM:
        lo = max(float(record.memory_censor_bytes or 0), float(cap or 0),
                 float(record.peak_memory_max_bytes or 0))
        return (lo, float("inf")) if lo > 0 else None
    if record.status is not TrialStatus.OK:
        return None
    peak = record.peak_memory_max_bytes
    if peak:
        return float(peak), float(peak)
    return (0.0, float(cap)) if cap else None


def interval_dataset(encoder: FeatureEncoder, records, capacity: float | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(X, bounds)``: every trial that says something about memory, bounds ``(n, 2)`` bytes
    ``[lower, upper]`` (see :func:`memory_bounds`), for :meth:`PeakMemoryModel.fit`."""
    rows = [(r, b) for r in records if (b := memory_bounds(r, capacity)) is not None]
    X = encoder.transform_records([r for r, _ in rows])
    bounds = np.array([b for _, b in rows], dtype=float).reshape(len(rows), 2)
    return X, bounds


def has_memory_signal(bounds: np.ndarray) -> bool:
    """Whether bounds can place a memory model: an observed peak, or both a trial that fit
    (left-censored) and one that did not (right-censored)."""
    b = np.asarray(bounds, dtype=float).reshape(-1, 2)
    exact = (b[:, 0] == b[:, 1]) & (b[:, 0] > 0)
    return bool(exact.any() or ((b[:, 0] <= 0).any() and np.isinf(b[:, 1]).any()))


def _split_y(memory, observed) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray(memory)
    if arr.dtype.names and len(arr.dtype.names) == 2:  # scikit-survival: (event, time)
        ev, tm = arr.dtype.names
        return arr[tm].astype(float), arr[ev].astype(bool)
    mem = arr.astype(float).ravel()
    obs = np.ones(len(mem), bool) if observed is None else np.asarray(observed, dtype=bool).ravel()
    if len(obs) != len(mem):
        raise ValueError(f"memory has {len(mem)} rows but observed has {len(obs)}")
    return mem, obs

