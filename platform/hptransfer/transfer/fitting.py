"""Fitting helpers for the transfer diagnostics: weighted log-linear trends and paper 2's two power
laws over the ladder (docs/RESEARCH.md, "Paper 2").

Paper 2 (Ghosh, Wu, Bietti, "Understanding the Mechanisms of Fast Hyperparameter Transfer",
arXiv 2512.22768). With φ*_n the best loss at width n and ν*(n) its argmin:
  loss gap        a_n = φ*_n − φ*_∞              ~ A·n^−α     (fit_loss_vs_width)
  HP gap          b_n = |log ν*(n) − log ν*(∞)| ~ B·n^−β     (fit_drift)
ν*(∞) is unknown; the paper puts ν*(n_max) in its place, we fit it jointly (see fit_drift for why).
Each law y = c + K·n^−p is linear in (c, K) for fixed p, so p is profiled on a grid (P_GRID) with no
starting guess to get wrong. Pure: numpy and scipy (imported when fitting) only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hptransfer.transfer.optimum import OptimumFit

# Optima spread below 5% in ν is no drift worth a law: far below any grid step in use (×√2 is
# 35%), and costs κ·0.05² ≈ 2e-4 in loss at a typical κ ≈ 0.08. Assumption, stated.
DRIFT_FLOOR = 0.05
LEVEL = 0.95  # two-sided level of every interval a verdict is read from
# The Birge ratio χ²/dof estimates how much the points scatter beyond their given errors; with dof
# residual degrees of freedom it is a χ²_dof/dof draw, whose 90% range at dof 1 is ×0.004–×3.8 and at
# dof 3 still ×0.12–×2.6. Below BIRGE_MIN_DOF it is too unstable to rescale errors by (issue 37):
# the errors are used as given (normal quantiles) unless the points plainly contradict them — χ²
# beyond its own 95% quantile under those errors — when the scatter wins as above. Assumption,
# stated: the per-point se (optimum.py's bootstrap, floored at a quarter grid step) are honest.
BIRGE_MIN_DOF = 3


def birge_scale(chi2: float, dof: int) -> float:
    """The factor on a weighted fit's covariance: max(1, χ²/dof) from BIRGE_MIN_DOF dof on; below,
    only when χ² exceeds its 95% quantile under the given errors (else 1: the errors as given)."""
    if dof <= 0:
        return 1.0
    if dof < BIRGE_MIN_DOF:
        from scipy.stats import chi2 as chi2_dist

        if chi2 <= float(chi2_dist.ppf(0.95, dof)):
            return 1.0
    return max(1.0, chi2 / dof)


@dataclass(frozen=True)
class LogLinearFit:
    """y = a + b·log n, by (weighted) least squares; b_se is None with fewer than 3 points."""

    a: float
    b: float
    b_se: float | None
    a_se: float | None
    cov_ab: float | None
    n_points: int
    dof: int = 0  # residual degrees of freedom (n − 2)
    scale: float = 1.0  # factor on the covariance: the Birge ratio max(1, χ²/dof) with se given, else s²
    weighted: bool = False  # per-point errors were given (weights 1/se²)
    n_censored: int = 0  # points that entered as bounds (fit_log_linear_censored)

    def predict(self, n: float) -> float:
        return self.a + self.b * math.log(n)

    def predict_se(self, n: float) -> float | None:
        if self.a_se is None or self.b_se is None or self.cov_ab is None:
            return None
        ln = math.log(n)
        return math.sqrt(max(0.0, self.a_se**2 + ln**2 * self.b_se**2 + 2 * ln * self.cov_ab))


def fit_log_linear(widths, y, se=None) -> LogLinearFit:
    """Fit y = a + b·log n. se: per-point standard errors (weights 1/se²) when all are positive.

    Covariance: with `se`, (XᵀWX)⁻¹ scaled by the Birge ratio max(1, χ²/dof) — the errors as given
    unless the points scatter more than they allow (then the scatter wins: misfit, or se too small);
    below BIRGE_MIN_DOF residual degrees of freedom only when the misfit is plain (`birge_scale`).
    Without, the residual scale s²·(XᵀX)⁻¹ (ordinary least squares)."""
    n, y = np.asarray(widths, float), np.asarray(y, float)
    if len(n) < 2:
        raise ValueError(f"a trend needs at least 2 widths, got {len(n)}")
    X = np.column_stack([np.ones_like(n), np.log(n)])
    weighted = se is not None and len(se) == len(n) and all(s is not None and s > 0 for s in se)
    w = 1.0 / np.asarray(se, float) ** 2 if weighted else np.ones_like(n)
    W = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(X * W[:, None], y * W, rcond=None)
    if len(n) < 3:
        return LogLinearFit(float(coef[0]), float(coef[1]), None, None, None, len(n))
    resid = y - X @ coef
    dof = len(n) - 2
    s2 = float((w * resid**2).sum() / dof)
    scale = birge_scale(s2 * dof, dof) if weighted else s2
    cov = scale * np.linalg.inv((X * w[:, None]).T @ X)
    return LogLinearFit(
        float(coef[0]),
        float(coef[1]),
        float(math.sqrt(cov[1, 1])),
        float(math.sqrt(cov[0, 0])),
        float(cov[0, 1]),
        len(n),
        dof,
        scale,
        weighted,
    )


def fit_log_linear_censored(widths, y, se=None, censored=None) -> LogLinearFit:
    """y = a + b·log n where some y are bounds: censored[i] = "upper" (yᵢ is at most y[i]: an
    optimum on the grid's low edge), "lower" (at least y[i]: the high edge, or capped by divergence)
    or None (a point). Maximum likelihood with Gaussian errors (a Tobit regression): a point adds
    ½((y − µ)/s)², a bound −log Φ(±(y − µ)/s) — the probability that the optimum lies beyond it.

    Why: dropping grid-edge optima threw away the widest widths exactly when the optimum drifts off
    the grid, so a 1/width drift read "undecided" and `power-law` extrapolated from a shorter ladder.
    A bound the line already satisfies by many s costs nothing; one it crosses pulls it back.
    Each s is the point's se (optimum.py's bootstrap, floored at a quarter grid step; a bound's own
    se is that floor: how sharply the edge is known). Without se for every point, s is the
    scatter of the uncensored points about their own line (needs 3), else the bounds are left out.
    The likelihood is log-concave in (a, b), so Newton's method from the points' own fit converges;
    the covariance is the inverse observed information, scaled by the Birge ratio of the points
    (as fit_log_linear). dof counts the uncensored points only. Without bounds: fit_log_linear."""
    kinds = list(censored) if censored is not None else [None] * len(y)
    if not any(kinds):
        return fit_log_linear(widths, y, se)
    n, y = np.asarray(widths, float), np.asarray(y, float)
    pts = np.array([k is None for k in kinds])
    if pts.sum() < 2:
        raise ValueError(f"a censored trend needs at least 2 uncensored points, got {int(pts.sum())}")
    weighted = se is not None and len(se) == len(n) and all(s is not None and s > 0 for s in se)
    base = fit_log_linear(n[pts], y[pts], [se[i] for i in np.flatnonzero(pts)] if weighted else None)
    if weighted:
        s = np.asarray(se, float)
    elif pts.sum() >= 3 and base.scale > 0:
        s = np.full(len(n), math.sqrt(base.scale))
    else:
        return base  # no scale to weigh a bound against
    from scipy.special import log_ndtr

    X = np.column_stack([np.ones_like(n), np.log(n)])
    # sign: +1 where the truth is above y (lower bound), −1 below (upper bound); 0 for points.
    sign = np.array([0.0 if k is None else (1.0 if k == "lower" else -1.0) for k in kinds])

    def terms(theta):
        mu = X @ theta
        r = (mu - y) / s
        z = sign * r  # a bound is satisfied when z > 0
        logphi = -0.5 * z**2 - 0.5 * math.log(2 * math.pi)
        logcdf = log_ndtr(z)
        lam = np.exp(logphi - logcdf)  # φ(z)/Φ(z), the inverse Mills ratio
        nll = np.where(pts, 0.5 * r**2, -logcdf).sum()
        d1 = np.where(pts, r / s, -sign * lam / s)  # d nll / d µ
        d2 = np.where(pts, 1 / s**2, lam * (z + lam) / s**2)  # > 0: convex
        return float(nll), d1, d2

    theta = np.array([base.a, base.b])
    nll, d1, d2 = terms(theta)
    for _ in range(100):
        g, H = X.T @ d1, (X * d2[:, None]).T @ X
        step = np.linalg.solve(H, g)
        t = 1.0
        while t > 1e-8:
            cand = theta - t * step
            c_nll, c1, c2 = terms(cand)
            if c_nll <= nll + 1e-12:
                break
            t /= 2
        done = abs(nll - c_nll) < 1e-12 and np.abs(t * step).max() < 1e-10
        theta, nll, d1, d2 = cand, c_nll, c1, c2
        if done:
            break
    H = (X * d2[:, None]).T @ X
    resid = (y - X @ theta)[pts]
    dof = int(pts.sum()) - 2
    scale = 1.0
    if weighted:
        scale = birge_scale(float(((resid / s[pts]) ** 2).sum()), dof)
    cov = scale * np.linalg.inv(H)
    return LogLinearFit(
        float(theta[0]),
        float(theta[1]),
        float(math.sqrt(cov[1, 1])),
        float(math.sqrt(cov[0, 0])),
        float(cov[0, 1]),
        len(n),
        max(dof, 0),
        scale,
        weighted,
        int((~pts).sum()),
    )


def trend_of(fits: dict[int, OptimumFit], log_scale: bool) -> LogLinearFit | None:
    """The log-linear trend of one hyperparameter's optima over widths, censored ones as bounds
    (fit_log_linear_censored). None with fewer than 2 uncensored widths."""
    widths = sorted(fits)
    if sum(fits[w].censored is None for w in widths) < 2:
        return None
    return fit_log_linear_censored(
        widths, [x_of(fits[w], log_scale) for w in widths], [fits[w].log_se for w in widths], [fits[w].censored for w in widths]
    )


def normal_quantile(level: float = LEVEL) -> float:
    """The two-sided normal quantile at `level` (1.96 at 95%)."""
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def interval_quantile(fit: LogLinearFit, level: float = LEVEL) -> float:
    """Two-sided quantile for the fit's intervals: normal while the given errors hold (Birge ratio
    1, or too few dof to estimate one), Student t with the residual dof once the scatter sets the
    scale (or no errors were given). Every interval read off a log-linear fit (an exponent, its
    factor at a target, a prediction) takes this one quantile."""
    from scipy.stats import norm, t

    p = 0.5 + level / 2
    return float(norm.ppf(p)) if fit.weighted and fit.scale == 1.0 else float(t.ppf(p, max(fit.dof, 1)))


P_MIN, P_MAX = 0.02, 4.0  # exponent range profiled; an estimate at either end is not identified
P_GRID = np.linspace(P_MIN, P_MAX, 200)


@lru_cache(maxsize=64)
def power_design(widths: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each p on P_GRID: the design [1, n^−p] (P, k, 2), its pseudo-inverse (P, 2, k) and the
    residual maker I − H_p (P, k, k). Cached: calibration refits the same widths thousands of times."""
    n = np.asarray(widths, float)
    X = np.stack([np.column_stack([np.ones_like(n), n**-p]) for p in P_GRID])
    pinv = np.linalg.pinv(X)
    return X, pinv, np.eye(len(n)) - X @ pinv


def profile_power_batch(n, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """y = c + K·n^−p profiled over P_GRID for many curves at once: Y (B, k) → (p, K), each (B,).
    For fixed p the model is linear, its residual (I − H_p)·y with H_p the hat matrix of [1, n^−p]."""
    _, pinv, R = power_design(tuple(float(v) for v in n))
    sse = (np.einsum("pjk,bk->bpj", R, Y) ** 2).sum(axis=2)  # (B, P)
    best = np.argmin(sse, axis=1)
    return P_GRID[best], np.einsum("bk,bk->b", pinv[best, 1, :], Y)


def _profile_power(n: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """y = c + K·n^−p with p profiled over [P_MIN, P_MAX] (linear in c, K for fixed p): the grid,
    then a bounded 1-D refinement around its best point. Returns (c, K, p, sse)."""
    from scipy.optimize import minimize_scalar  # scipy costs ~1 s to import: only when fitting

    def solve(p: float):
        X = np.column_stack([np.ones_like(n), n**-p])
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        return coef, float(((X @ coef - y) ** 2).sum())

    p0 = float(profile_power_batch(n, np.asarray(y, float)[None, :])[0][0])
    k = int(np.searchsorted(P_GRID, p0))
    lo, hi = P_GRID[max(0, k - 1)], P_GRID[min(len(P_GRID) - 1, k + 1)]
    p = float(minimize_scalar(lambda q: solve(q)[1], bounds=(lo, hi), method="bounded").x)
    (c, K), sse = solve(p)
    return float(c), float(K), p, sse


def fit_loss_vs_width(widths, losses) -> dict | None:
    """φ*_n = φ_∞ + A·n^−α (paper 2's loss law). For fixed α the model is linear in (φ_∞, A), so we
    profile α in (0, 4] — no starting guess to get wrong. None when fewer than 3 widths or when
    loss does not improve with width (A ≤ 0)."""
    n, L = np.asarray(widths, float), np.asarray(losses, float)
    if len(n) < 3:
        return None
    phi_inf, A, alpha, sse = _profile_power(n, L)
    if A <= 0:
        return None
    return {
        "phi_inf": phi_inf,
        "A": A,
        "alpha": alpha,
        "rmse": math.sqrt(sse / len(n)),
        "n_widths": len(n),
        "exact": len(n) == 3,
        "at_bound": _at_bound(alpha),
    }


def _at_bound(p: float) -> bool:
    return p <= P_MIN * 1.05 or p >= P_MAX * 0.99


def fit_drift(widths, log_opt, se=None) -> dict:
    """b_n = |log ν*(n) − log ν*(∞)| = B·n^−β, with ν*(∞) fitted jointly: log ν*(n) = x_∞ + K·n^−β,
    B = |K|. Paper 2 puts ν*(n_max) in place of ν*(∞); that shortcut inflates β when the drift
    decays slowly (the gap to n_max shrinks faster than the gap to ∞), which would call slow
    transfer fast, so we fit x_∞ instead (3 parameters: needs 3 widths, exact at 3).
    A description of the optima, not a verdict (that is drift_verdict): {"drift": "none"} when the
    optima are within DRIFT_FLOOR of each other or — with errors `se` for every width — when one
    constant fits them (χ² test at 5%)."""
    n, x = np.asarray(widths, float), np.asarray(log_opt, float)
    if np.ptp(x) <= DRIFT_FLOOR:
        return {"drift": "none", "B": 0.0, "beta": None, "x_inf": float(x.mean()), "why": "optima within 5% of each other"}
    if se is not None and len(x) >= 2 and all(s is not None and s > 0 for s in se):
        from scipy.stats import chi2

        w = 1 / np.asarray(se, float) ** 2
        xbar = float((w * x).sum() / w.sum())
        stat = float((w * (x - xbar) ** 2).sum())
        if stat <= chi2.ppf(0.95, len(x) - 1):
            return {
                "drift": "none",
                "B": 0.0,
                "beta": None,
                "x_inf": xbar,
                "why": f"a constant fits the optima within their errors (chi2={stat:.3g})",
            }
    if len(n) < 3:
        return {"drift": "unknown", "B": None, "beta": None, "why": "fewer than 3 widths"}
    x_inf, K, beta, sse = _profile_power(n, x)
    return {
        "drift": "fitted",
        "B": abs(K),
        "beta": beta,
        "x_inf": x_inf,
        "value_at_infinity": math.exp(min(x_inf, 700.0)),
        "rmse": math.sqrt(sse / len(n)),
        "exact": len(n) == 3,
        "at_bound": _at_bound(beta),
    }


def x_of(f: OptimumFit, log_scale: bool) -> float:
    """An optimum in the units trends are fitted in: log ν for a log-scale hyperparameter, else ν."""
    return math.log(f.value) if log_scale else f.value
