"""A thin wrapper over lifelines' AFT fitters with a prior-centred, sign-aware penalty.

lifelines minimizes ``-mean log-likelihood + penalty(params)`` on covariates divided by their
standard deviation (``self._norm_std``), with the parameters flattened in ``_norm_std``'s index
order. We override ``_add_penalty`` (the hook lifelines calls inside its objective) to put a
Gaussian prior ``N(m_j, s_j^2)`` on each location coefficient -- rescaled to standardized units
and divided by ``n`` so it weighs like a prior on the summed likelihood -- plus a one-sided
quadratic for the physics sign constraints. The location intercept is not penalized; the log of
the shape parameter gets a weak Gaussian prior (:data:`SHAPE_PRIOR`): with fewer observed peaks
than coefficients the likelihood alone is unbounded (the fit interpolates the peaks and the
shape goes to zero), which is exactly the early search. The shape is also held (softly, like
the signs) at or above a floor on its spread, ``min_spread``: the model keeps that floor at
prediction anyway, so the fit should not buy an exact interpolation with a spread it will not
keep -- and a spread driven to zero is where lifelines' optimizer loses precision and gives up
(a ConvergenceError on 7 trials of 16 columns). Written against lifelines 0.30.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import autograd.numpy as anp
import numpy as np
import pandas as pd
from autograd.misc import flatten
from lifelines import LogNormalAFTFitter, WeibullAFTFitter
from scipy.optimize import minimize
from scipy.special import log_ndtr
from threadpoolctl import threadpool_limits

_PRIMARY = {"lognormal": ("mu_", "sigma_"), "weibull": ("lambda_", "rho_")}

# Prior on the log shape: centred on a 20% spread of log peak memory around the linear model
# (log-normal sigma 0.2; the Weibull rho with the same standard deviation, pi / (sqrt(6) rho)),
# std 1 in log units: a factor e either way, weighed like one pseudo-observation.
SHAPE_PRIOR_STD = 1.0
SHAPE_PRIOR = {"lognormal": float(np.log(0.2)), "weibull": float(np.log(np.pi / np.sqrt(6) / 0.2))}


def _log_shape_bound(dist: str, min_spread: float) -> tuple[float, float]:
    """``(bound, sign)``: the log shape must satisfy ``sign * (log_shape - bound) >= 0`` for a
    spread of at least ``min_spread`` (log-normal sigma; Weibull rho, whose spread is
    pi / (sqrt(6) rho)). ``sign`` 0: no floor."""
    if not min_spread or min_spread <= 0:
        return 0.0, 0.0
    if dist == "lognormal":
        return float(np.log(min_spread)), 1.0
    return float(np.log(np.pi / np.sqrt(6) / min_spread)), -1.0


class _PriorPenalty:
    """Mixin: the prior-centred penalty. Set ``_prior`` = (m, s, sign, strength, min_spread)
    before fit."""

    _prior: tuple[np.ndarray, np.ndarray, np.ndarray, float, float]
    _primary: str
    _ancillary: str
    _dist: str
    _pen = None

    def _build_penalty(self):
        m, s, sign, _, min_spread = self._prior
        n = float(self.weights.sum())
        idx = self._norm_std.index
        center, prec, sg, bound = (np.zeros(len(idx)) for _ in range(4))
        for i, (param, cov) in enumerate(idx):
            if param == self._ancillary and cov == "Intercept":
                center[i] = SHAPE_PRIOR[self._dist]
                prec[i] = 1.0 / (n * SHAPE_PRIOR_STD**2)
                bound[i], sg[i] = _log_shape_bound(self._dist, min_spread)
                continue
            if param != self._primary or cov == "Intercept":
                continue
            j, sd = int(cov[1:]), float(self._norm_std.iloc[i])
            center[i] = m[j] * sd
            prec[i] = 1.0 / (n * s[j] ** 2 * sd**2)
            sg[i] = sign[j]
        return center, prec, sg, bound

    def _add_penalty(self, params, neg_ll):
        arr, _ = flatten(params)
        if self._pen is None:
            self._pen = self._build_penalty()
        center, prec, sg, bound = self._pen
        pen = 0.5 * anp.sum(prec * (arr - center) ** 2)
        viol = anp.minimum(0.0, sg * (arr - bound))
        return neg_ll + pen + self._prior[3] * anp.sum(viol**2)


class _LogNormal(_PriorPenalty, LogNormalAFTFitter):
    _primary, _ancillary, _dist = "mu_", "sigma_", "lognormal"


class _Weibull(_PriorPenalty, WeibullAFTFitter):
    _primary, _ancillary, _dist = "lambda_", "rho_", "weibull"


@dataclass(frozen=True)
class AFTFit:
    dist: str
    intercept: float  # log-scale location at x = 0
    coef: np.ndarray  # log-scale location slope per column
    shape: float  # lognormal sigma, or Weibull rho
    loc_cov: np.ndarray  # covariance of [intercept, coef]
    aic: float


def _row_loglik(dist: str, r_lo, r_hi, exact, la, hess: bool = False):
    """Per-row log-likelihood and its derivatives in the location and the log shape.

    ``r_lo``/``r_hi``: log bounds minus the location (``-inf``/``+inf`` for an open end); an
    ``exact`` row's value is ``r_lo``. A censored row contributes ``log(S(lo) - S(hi))``: right-
    censored (an OOM: ``hi = inf``), left-censored (ok without a reading: ``lo = -inf``) or a
    proper interval. Returns ``(ll, dll/dmu, dll/dlog_shape)``, and ``d2ll/dmu2`` if ``hess``.
    """
    if dist == "lognormal":  # log T = mu + sigma * N(0, 1)
        sig = np.exp(la)
        # no clipping (a clipped z is flat in the parameters while its gradient is not, which
        # stalls L-BFGS on rows far from the location); an open end is a very distant bound
        za = np.where(np.isfinite(r_lo), r_lo, -1e6) / sig
        zb = np.where(np.isfinite(r_hi), r_hi, 1e6) / sig
        # exact: log pdf
        ll_e = -0.5 * za**2 - la - 0.5 * np.log(2 * np.pi)
        # censored: log(Phi(zb) - Phi(za)) on whichever side keeps precision
        lsa, lsb = log_ndtr(-za), log_ndtr(-zb)
        lfa, lfb = log_ndtr(za), log_ndtr(zb)
        with np.errstate(divide="ignore", invalid="ignore"):
            surv = lsa + np.log(-np.expm1(np.minimum(lsb - lsa, -1e-300)))
            cdf = lfb + np.log(-np.expm1(np.minimum(lfa - lfb, -1e-300)))
        ll_c = np.where(za > 0, surv, cdf)
        lphi = -0.5 * np.log(2 * np.pi)
        ga = np.exp(np.minimum(lphi - 0.5 * za**2 - ll_c, 700))
        gb = np.exp(np.minimum(lphi - 0.5 * zb**2 - ll_c, 700))
        dmu_c, dla_c = (ga - gb) / sig, ga * za - gb * zb
        dmu_e, dla_e = za / sig, za**2 - 1
        if hess:  # d(phi(z))/dmu = phi(z) z / sigma
            d2_c, d2_e = (ga * za - gb * zb) / sig**2 - dmu_c**2, np.full(za.shape, -1 / sig**2)
    else:  # log T = mu + Gumbel_min / rho: S(t) = exp(-exp(rho * (log t - mu)))
        rho = np.exp(la)
        w_e = np.clip(rho * np.where(np.isfinite(r_lo), r_lo, 0.0), -50, 50)
        # an open end stays open (exp(-inf) = 0, exp(inf) = inf) and contributes no gradient:
        # clipping it to a finite bound made both ends equal far from the location (a zero
        # interval, an infinite gradient)
        fa, fb = np.isfinite(r_lo), np.isfinite(r_hi)
        wa = np.where(fa, np.clip(rho * np.where(fa, r_lo, 0.0), -700, 700), -np.inf)
        wb = np.where(fb, np.clip(rho * np.where(fb, r_hi, 0.0), -700, 700), np.inf)
        ll_e = la + w_e - np.exp(w_e)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            ea, eb = np.exp(wa), np.exp(wb)
            ll_c = -ea + np.log(np.maximum(-np.expm1(ea - eb), 1e-300))
            # left-censored far below the location: log(1 - exp(-e^w)) ~ w - e^w / 2 (the
            # general form loses it below 1e-300 and its gradient then points nowhere)
            ll_c = np.where(~fa & (wb < -30), wb - eb / 2, ll_c)
            ga = np.where(fa, np.exp(np.minimum(wa - ea - ll_c, 700)), 0.0)
            gb = np.where(fb, np.exp(np.minimum(wb - eb - ll_c, 700)), 0.0)
            dmu_c = rho * (ga - gb)
            dla_c = -(np.where(fa, ga * wa, 0.0) - np.where(fb, gb * wb, 0.0))
            if hess:  # d(e exp(-e))/dmu = -rho (1 - e) e exp(-e), e = exp(w)
                d2_c = -rho**2 * (np.where(fa, (1 - ea) * ga, 0.0)
                                  - np.where(fb, (1 - eb) * gb, 0.0)) - dmu_c**2
                # one open end in closed form: the general one cancels e^2-sized terms
                d2_c = np.where(fb, d2_c, -rho**2 * ea)  # right-censored: ll = -e^w
                d2_c = np.where(fa, d2_c, rho**2 * gb * (1 - eb - gb))  # left-censored
                d2_e = -rho**2 * np.exp(w_e)
        dmu_e, dla_e = -rho * (1 - np.exp(w_e)), 1 + w_e * (1 - np.exp(w_e))
    out = (np.where(exact, ll_e, ll_c), np.where(exact, dmu_e, dmu_c),
           np.where(exact, dla_e, dla_c))
    return out + (np.where(exact, d2_e, d2_c),) if hess else out


def _bounds(log_t, observed, log_hi):
    """``(log lower, log upper, exact)`` from the right-censored form or explicit bounds."""
    obs = np.asarray(observed, bool)
    lo = np.asarray(log_t, float)
    if log_hi is None:
        hi = np.where(obs, lo, np.inf)
    else:
        hi = np.asarray(log_hi, float)
    return lo, hi, obs & (hi == lo)


def _objective(dist, Xs, lo, hi, exact, center, prec, sign, strength, min_spread,
               b0_prior=None, fixed_la=None):
    """The penalized mean negative log-likelihood (and gradient) of ``[g, b0, log shape]``:
    the objective lifelines optimizes with :class:`_PriorPenalty`, for interval-censored rows
    too. ``b0_prior``: ``(centre, precision)`` of the location intercept (per mean unit).
    ``fixed_la``: the log shape held there; the parameters are then ``[g, b0]`` only."""
    if fixed_la is not None:
        full = _objective(dist, Xs, lo, hi, exact, center, prec, sign, strength, min_spread,
                          b0_prior)

        def f_fixed(th):
            val, grad = full(np.concatenate([th, [fixed_la]]))
            return val, grad[:-1]

        return f_fixed
    n, p = Xs.shape
    la_center = SHAPE_PRIOR[dist]
    la_bound, la_sign = _log_shape_bound(dist, min_spread)
    la_prec = 1.0 / (n * SHAPE_PRIOR_STD**2)

    def f(th):
        g, b0, la = th[:p], th[p], th[p + 1]
        loc = Xs @ g + b0
        ll, dmu, dla = _row_loglik(dist, lo - loc, hi - loc, exact, la)
        viol = np.minimum(0.0, sign * g)
        la_viol = min(0.0, la_sign * (la - la_bound))
        val = (-ll.mean() + 0.5 * np.sum(prec * (g - center) ** 2) + strength * np.sum(viol**2)
               + 0.5 * la_prec * (la - la_center) ** 2 + strength * la_viol**2)
        grad_g = -(Xs.T @ dmu) / n + prec * (g - center) + 2 * strength * viol * sign
        grad_la = -dla.mean() + la_prec * (la - la_center) + 2 * strength * la_viol * la_sign
        grad_b0 = -dmu.mean()
        if b0_prior is not None:
            val += 0.5 * b0_prior[1] * (b0 - b0_prior[0]) ** 2
            grad_b0 += b0_prior[1] * (b0 - b0_prior[0])
        return val, np.concatenate([grad_g, [grad_b0, grad_la]])

    return f


def _warm_start(dist, X, log_t, observed, m, s, sign, strength, min_spread=0.0,
                log_hi=None, b0_prior=None, x0=None, tol=(1e-15, 1e-10, 2000),
                fixed_la=None) -> tuple[np.ndarray, float]:
    """Optimum of the same penalized objective in numpy, in lifelines' flattened layout.

    lifelines' generic autograd optimizer spends ~0.1 s of Python overhead per step; starting it
    at its optimum leaves it a step or two, which keeps 10,000 trials under 2 s. Returns
    standardized slopes, then the location intercept and the log shape (log sigma, or log rho).
    ``log_hi``: per-row log upper bounds (interval censoring; ``log_t`` is then the lower bound,
    ``-inf`` for none); ``x0``: a start (e.g. the previous fit's optimum). ``fixed_la``: the log
    shape held there (not optimized; still the last entry of the result).
    """
    n, p = X.shape
    sd = X.std(axis=0, ddof=1) if n > 1 else np.ones(p)
    sd = np.where(sd > 1e-12, sd, 1.0)
    Xs = X / sd
    center, prec = m * sd, 1.0 / (n * s**2 * sd**2)
    lo, hi, exact = _bounds(log_t, observed, log_hi)
    f = _objective(dist, Xs, lo, hi, exact, center, prec, sign, strength, min_spread, b0_prior,
                   fixed_la)
    if x0 is None:
        lognormal = dist == "lognormal"
        mid = np.where(np.isfinite(lo), lo, hi)
        mid = np.where(np.isfinite(mid), mid, 0.0)
        spread = max(float(np.std(mid)), 0.05)
        la0 = np.log(spread) if lognormal else np.log(1.2825 / spread)
        b00 = float(np.mean(mid)) + (0.0 if lognormal else 0.5772 * spread / 1.2825)
        if b0_prior is not None and not exact.any():
            b00 = float(b0_prior[0])
        x0 = np.concatenate([center, [b00, la0]])
    x0 = np.asarray(x0, float)
    if fixed_la is None:
        try:
            return _newton_profile(dist, Xs, lo, hi, exact, center, prec, sign, strength,
                                   min_spread, b0_prior, x0)
        except (FloatingPointError, np.linalg.LinAlgError, ValueError):
            pass  # the quasi-Newton route below, from the same start
    else:
        x0 = x0[:-1]
    res = minimize(f, x0, jac=True, method="L-BFGS-B",
                   options={"maxiter": tol[2], "ftol": tol[0], "gtol": tol[1]})
    th = res.x if fixed_la is None else np.concatenate([res.x, [fixed_la]])
    return th, float(res.fun)


def _newton_profile(dist, Xs, lo, hi, exact, center, prec, sign, strength, min_spread,
                    b0_prior, x0, xatol: float = 1e-7) -> tuple[np.ndarray, float]:
    """Minimize the penalized objective over ``[g, b0, log shape]`` as a profile: Brent's
    method on the log shape, each value's ``[g, b0]`` by :func:`_newton_held` started at the
    previous one's optimum. Returns ``(th, mean objective)`` like :func:`_warm_start`.

    Why: L-BFGS crawled along the nearly flat directions of these likelihoods (two collinear
    knob columns, a knob every large setting of which ran out of memory) to its 2,000-step
    limit -- 1.3 s per family on 2,000 trials, most of a fit's time -- where Newton at a held
    shape converges in a few steps and the profile over one scalar in a few dozen.
    """
    from scipy.optimize import minimize_scalar

    n = len(Xs)
    la_center = SHAPE_PRIOR[dist]
    la_bound, la_sign = _log_shape_bound(dist, min_spread)
    la_prec = 1.0 / (n * SHAPE_PRIOR_STD**2)
    state = {"th": np.asarray(x0, float)[:-1]}

    def outer(la: float) -> float:
        th, val, _ = _newton_held(dist, Xs, lo, hi, exact, center, prec, sign, strength, la,
                                  b0_prior, state["th"])
        if not np.all(np.isfinite(th)):
            raise FloatingPointError("non-finite profile fit")
        state["th"] = th
        viol = min(0.0, la_sign * (la - la_bound))
        return val + 0.5 * la_prec * (la - la_center) ** 2 + strength * viol**2

    la0 = float(x0[-1])
    res = minimize_scalar(outer, bounds=(la0 - 4.0, la0 + 4.0), method="bounded",
                          options={"xatol": xatol})
    la = float(res.x)
    fun = outer(la)  # leaves state at the optimum's [g, b0]
    if not np.isfinite(fun):
        raise FloatingPointError("non-finite profile objective")
    return np.concatenate([state["th"], [la]]), float(fun)


# The numpy fit of record stops at a relative objective change of 1e-10 (lifelines' own
# convergence is looser): the warm start's 1e-15 took 1,356 L-BFGS steps (57 s on a shared core)
# on the Ultra-Scale table's 1,374 label-only rows, for parameters equal to 1e-4.
FIT_TOL = (1e-10, 1e-6, 300)


def _newton_held(dist, Xs, lo, hi, exact, center, prec, sign, strength, la, b0_prior, x0,
                 max_steps: int = 50) -> tuple[np.ndarray, float, np.ndarray]:
    """Minimize the penalized objective over ``[g, b0]`` at a held log shape ``la`` by Newton's
    method with the analytic Hessian; returns ``(th, mean objective, summed Hessian)``.

    Why not L-BFGS: labels alone are nearly separable along some directions (a knob whose
    every large setting ran out of memory), so the optimum sits where only the weak priors
    bend a long shallow valley; L-BFGS crawled along it to its 300-step limit (1.4 s on the
    Ultra-Scale labels), Newton steps across it. At a held shape every row's negative
    log-likelihood is convex in the location (log-concave densities), and so are the prior
    and the sign penalty: Newton with a backtracking line search converges from any start.
    """
    n, p = Xs.shape
    A = np.hstack([Xs, np.ones((n, 1))])
    pr = np.concatenate([prec, [b0_prior[1] if b0_prior is not None else 0.0]])
    ctr = np.concatenate([center, [b0_prior[0] if b0_prior is not None else 0.0]])
    sg = np.concatenate([sign, [0.0]])

    def value(th, hess=False):
        loc = A @ th
        r = _row_loglik(dist, lo - loc, hi - loc, exact, la, hess=hess)
        viol = np.minimum(0.0, sg * th)
        val = -r[0].mean() + 0.5 * np.sum(pr * (th - ctr) ** 2) + strength * np.sum(viol**2)
        if not hess:
            return val
        grad = -(A.T @ r[1]) / n + pr * (th - ctr) + 2 * strength * viol * sg
        w = np.maximum(-r[3], 0.0)  # convex rows: -d2 >= 0 (the max guards rounding)
        H = (A.T * w) @ A / n + np.diag(pr + 2 * strength * sg**2 * (viol < 0))
        return val, grad, H

    th = np.asarray(x0, float)
    if not np.isfinite(value(th)):
        raise FloatingPointError("the Newton fit's start has a non-finite likelihood")
    for _ in range(max_steps):
        val, grad, H = value(th, hess=True)
        try:
            step = np.linalg.solve(H + 1e-10 * np.eye(p + 1), grad)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(H, grad, rcond=None)[0]
        t, dec = 1.0, float(grad @ step)
        if dec < 1e-14 * max(1.0, abs(val)):
            break  # converged: no line search can resolve a smaller decrease from rounding
        while t > 1e-8:
            new = value(th - t * step)
            if np.isfinite(new) and new <= val - 1e-4 * t * dec:
                break
            t *= 0.5
        else:
            break
        th = th - t * step
        if dec < 1e-12 * max(1.0, abs(val)) and t == 1.0:
            break
    val, _, H = value(th, hess=True)
    return th, float(val), n * H


def shape_identified(log_lo, log_hi) -> bool:
    """Whether interval bounds place the shape (the spread of log peak memory) at all.

    Labels alone (no observed peak) at a single capacity are a probit (log-normal) or
    complementary log-log (Weibull) model of P(OOM) = F((location - log capacity) / spread):
    scaling the slopes, the location's offset from the capacity and the spread together leaves
    the likelihood unchanged. That flat direction is what kept the optimizer at its step limit
    on the Ultra-Scale labels (only the weak priors bend it). Different capacities (devices)
    break it in principle -- one spread must explain the labels at each -- and so does any
    observed peak.
    """
    lo, hi = np.asarray(log_lo, float), np.asarray(log_hi, float)
    if np.any(lo == hi):
        return True
    ends = np.concatenate([lo[np.isfinite(lo)], hi[np.isfinite(hi)]])
    return bool(len(ends)) and float(np.ptp(ends)) > 0.05


def fit_numpy(dist, X, log_lo, log_hi, m, s, sign, strength, min_spread=0.0,
              b0_prior=None, x0=None, fixed_la=None) -> tuple[AFTFit, np.ndarray]:
    """The interval-censored fit in numpy: the same penalized likelihood lifelines' fitter
    optimizes, with the Laplace covariance from a finite-difference Hessian of the analytic
    gradient. Returns the fit and its optimum (a warm start for the next fit).

    ``fixed_la``: the log shape held there where the data cannot place it (see
    :func:`shape_identified`): the slopes are then in units of that spread. ``x0`` and the
    returned optimum are ``[slopes, intercept, log shape]`` in X's own units (not standardized),
    so the optimum of a fit on fewer rows starts the next one.
    """
    n, p = X.shape
    sd = X.std(axis=0, ddof=1) if n > 1 else np.ones(p)
    sd = np.where(sd > 1e-12, sd, 1.0)
    if x0 is not None:
        x0 = np.concatenate([np.asarray(x0[:p], float) * sd, np.asarray(x0[p:], float)])
    exact = np.asarray(log_lo) == np.asarray(log_hi)
    if fixed_la is not None:
        # a held shape is not uncertain: the location's covariance is the conditional one
        lo, hi, exact = _bounds(log_lo, exact, log_hi)
        if x0 is None:
            mid = np.where(np.isfinite(lo), lo, hi)
            b00 = (float(b0_prior[0]) if b0_prior is not None
                   else float(np.mean(np.where(np.isfinite(mid), mid, 0.0))))
            x0 = np.concatenate([m * sd, [b00]])
        g_b0, fun, H = _newton_held(dist, X / sd, lo, hi, exact, m * sd,
                                    1.0 / (n * s**2 * sd**2), sign, strength, fixed_la,
                                    b0_prior, np.asarray(x0, float)[:p + 1])
        th = np.concatenate([g_b0, [fixed_la]])
    else:
        th, fun = _warm_start(dist, X, log_lo, exact, m, s, sign, strength, min_spread,
                              log_hi=log_hi, b0_prior=b0_prior, x0=x0, tol=FIT_TOL)
        lo, hi, exact = _bounds(log_lo, exact, log_hi)
        f = _objective(dist, X / sd, lo, hi, exact, m * sd, 1.0 / (n * s**2 * sd**2), sign,
                       strength, min_spread, b0_prior)
        k = len(th)
        H = np.empty((k, k))
        for i in range(k):
            h = 1e-5 * max(1.0, abs(th[i]))
            e = np.zeros(k)
            e[i] = h
            H[i] = (f(th + e)[1] - f(th - e)[1]) / (2 * h)
        H = n * (H + H.T) / 2  # the summed objective's Hessian
    try:
        cov_full = np.linalg.inv(H + 1e-9 * np.eye(len(H)))
    except np.linalg.LinAlgError:
        cov_full = np.linalg.pinv(H)
    # parameters [g (standardized), b0, log shape] -> [b0, beta = g / sd]
    idx = np.concatenate([[p], np.arange(p)])
    scale = np.concatenate([[1.0], 1.0 / sd])
    cov = cov_full[np.ix_(idx, idx)] * np.outer(scale, scale)
    coef = th[:p] / sd
    shape = float(np.exp(th[p + 1]))
    if not (np.all(np.isfinite(coef)) and np.isfinite(shape) and np.all(np.isfinite(cov))):
        raise FloatingPointError("non-finite AFT parameters")
    aic = 2 * n * fun + 2 * (p + 2)
    return AFTFit(dist, float(th[p]), coef, shape, (cov + cov.T) / 2, aic), np.concatenate(
        [coef, th[p:]])


def select_family(X, log_t, observed, m, s, sign, strength,
                  min_spread=0.0) -> tuple[str, dict, np.ndarray]:
    """Pick log-normal or Weibull by AIC of the penalized fit (same parameter count, so the
    lower penalized negative log-likelihood wins); returns the winner's warm start too."""
    fits = {d: _warm_start(d, X, log_t, observed, m, s, sign, strength, min_spread)
            for d in ("lognormal", "weibull")}
    k = X.shape[1] + 2
    aic = {d: 2 * len(log_t) * fun + 2 * k for d, (_, fun) in fits.items()}
    best = min(aic, key=aic.get)
    return best, aic, fits[best][0]


def fit_aft(dist, X, log_t, observed, m, s, sign, strength, min_spread=0.0,
            warm=None) -> AFTFit:
    """Fit one AFT family on ``log_t`` (log of a scaled positive quantity); raises on failure."""
    cls = _LogNormal if dist == "lognormal" else _Weibull
    primary, anc = _PRIMARY[dist]
    if warm is None:
        warm, _ = _warm_start(dist, X, log_t, observed, m, s, sign, strength, min_spread)
    names = [f"x{j:04d}" for j in range(X.shape[1])]  # sort-stable names
    df = pd.DataFrame(X, columns=names)
    df["T"] = np.exp(log_t)
    df["E"] = np.asarray(observed, dtype=bool)
    fitter = cls(penalizer=0.0)
    fitter._prior = (np.asarray(m), np.asarray(s), np.asarray(sign), float(strength),
                     float(min_spread))
    fitter._pen = None
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        warnings.simplefilter("ignore")
        fitter.fit(df, "T", "E", initial_point=warm)
    params = fitter.params_
    loc = [(primary, "Intercept")] + [(primary, n) for n in names]
    coef = np.array([params[k] for k in loc[1:]], dtype=float)
    cov = fitter.variance_matrix_.loc[loc, loc].to_numpy(dtype=float)
    shape = float(np.exp(params[(anc, "Intercept")]))
    if not (np.all(np.isfinite(coef)) and np.isfinite(shape) and np.all(np.isfinite(cov))):
        raise FloatingPointError("non-finite AFT parameters")
    return AFTFit(dist, float(params[loc[0]]), coef, shape, (cov + cov.T) / 2, float(fitter.AIC_))
