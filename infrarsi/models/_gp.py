"""A lean exact GP (ARD Matern-5/2 + white noise) for residuals, hyperparameters by evidence.

scikit-learn's GaussianProcessRegressor is general and, on this 2-core box, takes seconds for a
few hundred rows; this one computes the analytic gradient of the log marginal likelihood
directly and stops after ``maxiter`` L-BFGS steps, which is all a residual model needs.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

_S5 = np.sqrt(5.0)


def _kernel(D2: np.ndarray, amp: float) -> tuple[np.ndarray, np.ndarray]:
    """Matern-5/2 on scaled squared distances; also dk/d(r^2) * 2 for the gradient."""
    r = np.sqrt(np.maximum(D2, 0.0))
    e = np.exp(-_S5 * r)
    k = amp * (1.0 + _S5 * r + 5.0 / 3.0 * D2) * e
    dk = amp * 5.0 / 3.0 * (1.0 + _S5 * r) * e  # = -2 dk/d(r^2)
    return k, dk


class LeanGP:
    def __init__(self, maxiter: int = 60, bounds=((1e-4, 10.0), (0.05, 100.0), (1e-6, 1.0))):
        self.maxiter = maxiter
        self.bounds = bounds

    def fit(self, X: np.ndarray, y: np.ndarray, noise0: float = 1e-2) -> LeanGP:
        # small matrices: multi-threaded BLAS only contends (7x slower measured on 2 cores)
        with threadpool_limits(limits=1, user_api="blas"):
            return self._fit(X, y, noise0)

    def _fit(self, X: np.ndarray, y: np.ndarray, noise0: float) -> LeanGP:
        n, p = X.shape
        diff2 = (X[:, None, :] - X[None, :, :]) ** 2  # n x n x p
        var = max(float(np.var(y)), 1e-4)
        th0 = np.log(np.concatenate([[var], np.ones(p), [min(max(noise0, 1e-5), 0.5)]]))
        (alo, ahi), (llo, lhi), (nlo, nhi) = self.bounds
        bnds = [(np.log(alo), np.log(ahi))] + [(np.log(llo), np.log(lhi))] * p + [
            (np.log(nlo), np.log(nhi))]

        def nlml(th):
            amp, ls, noise = np.exp(th[0]), np.exp(th[1:-1]), np.exp(th[-1])
            S = diff2 / ls**2
            D2 = S.sum(axis=2)
            K, dk = _kernel(D2, amp)
            K[np.diag_indices(n)] += noise + 1e-8
            try:
                c = cho_factor(K, lower=True)
            except np.linalg.LinAlgError:
                return 1e10, np.zeros_like(th)
            a = cho_solve(c, y)
            val = 0.5 * y @ a + np.log(np.diag(c[0])).sum()
            W = np.outer(a, a) - cho_solve(c, np.eye(n))
            g = np.empty_like(th)
            g[0] = -0.5 * np.sum(W * (K - np.diag(np.full(n, noise + 1e-8))))
            # dK/dlog l_d = dk * S_d  (since d(r^2)/dlog l_d = -2 S_d and dk = -2 dk/dr^2)
            g[1:-1] = -0.5 * np.einsum("ij,ijd->d", W * dk, S)
            g[-1] = -0.5 * noise * np.trace(W)
            return val, g

        res = minimize(nlml, th0, jac=True, method="L-BFGS-B", bounds=bnds,
                       options={"maxiter": self.maxiter})
        th = res.x
        self.amp_, self.ls_, self.noise_ = np.exp(th[0]), np.exp(th[1:-1]), np.exp(th[-1])
        self.X_ = X
        D2 = (((X[:, None, :] - X[None, :, :]) / self.ls_) ** 2).sum(axis=2)
        K, _ = _kernel(D2, self.amp_)
        K[np.diag_indices(n)] += self.noise_ + 1e-8
        chol = cho_factor(K, lower=True)
        self.alpha_ = cho_solve(chol, y)
        self.linv_ = solve_triangular(chol[0], np.eye(n), lower=True)
        return self

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std of a new *observation* (latent variance plus noise)."""
        A, B = X / self.ls_, self.X_ / self.ls_
        D2 = (A**2).sum(1)[:, None] + (B**2).sum(1)[None, :] - 2.0 * A @ B.T
        Ks, _ = _kernel(np.maximum(D2, 0.0), self.amp_)
        mean = Ks @ self.alpha_
        V = Ks @ self.linv_.T
        var = self.amp_ + self.noise_ - (V**2).sum(axis=1)
        return mean, np.sqrt(np.maximum(var, 1e-12))
