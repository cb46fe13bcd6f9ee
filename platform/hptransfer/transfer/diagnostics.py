"""When to trust a transfer: the fast-transfer test of paper 2, a drift test that can abstain, the
predicted penalty of a plan, and the warnings a sweep can earn.

Paper 2 (Ghosh, Wu, Bietti, "Understanding the Mechanisms of Fast Hyperparameter Transfer",
arXiv 2512.22768). With φ*_n the best loss at width n and ν*(n) its argmin:
  loss gap        a_n = φ*_n − φ*_∞              ~ A·n^−α
  HP gap          b_n = |log ν*(n) − log ν*(∞)| ~ B·n^−β
  transfer cost   c_n = φ_∞(ν*(n)) − φ*_∞        = Θ(b_n²) near a strongly convex optimum
Transfer is *fast* (a small-width search beats a direct search at equal compute) iff c_n = o(a_n),
i.e. iff β > α/2. ν*(∞) is unknown; the paper puts ν*(n_max) in its place, we fit it jointly (see
fit_drift for why).

Verdicts abstain (docs/RESEARCH.md, "Measuring transfer honestly"; issue 12, item 3). Each verdict
is decided only with MIN_WIDTHS uncensored optima (one residual degree of freedom for a
3-parameter law) and only when the interval of its statistic excludes the boundary; otherwise it is
"undecided" with the reason. Censored optima (grid edge, capped by divergence: optimum.py) are
bounds and never enter a fit — a capped optimum repeated at every width has no spread at all, and
weighting it by 1/se² once made any slope read as drift.
Calibrated on synthetic sweeps drawn many times: tests/test_calibration.py.
Pure: numpy and scipy (imported when fitting) only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from hptransfer.transfer.optimum import OptimumFit

# Optima spread below 5% in ν is no drift worth a law: far below any grid step in use (×√2 is
# 35%), and costs κ·0.05² ≈ 2e-4 in loss at a typical κ ≈ 0.08. Assumption, stated.
DRIFT_FLOOR = 0.05
# A slope d log ν*/d log n whose 95% interval lies inside ±DRIFT_TOLERANCE is "none": over a 16×
# transfer (ln 16 = 2.8) it moves ν* by at most ×1.32, less than one ×√2 grid step. Assumption.
DRIFT_TOLERANCE = 0.1
MIN_WIDTHS = 4  # uncensored widths a verdict needs: 3-parameter laws keep one residual dof
LEVEL = 0.95  # two-sided level of every interval a verdict is read from
MUP_RULES = ("mup", "mup-independent-wd", "mup-standard-wd")


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
    unless the points scatter more than they allow (then the scatter wins: misfit, or se too small).
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
    scale = max(1.0, s2) if weighted else s2
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


def interval_quantile(fit: LogLinearFit, level: float = LEVEL) -> float:
    """Two-sided quantile for the fit's intervals: normal while the given errors hold (Birge ratio
    1), Student t with the residual dof once the scatter sets the scale (or no errors were given)."""
    from scipy.stats import norm, t

    p = 0.5 + level / 2
    return float(norm.ppf(p)) if fit.weighted and fit.scale == 1.0 else float(t.ppf(p, max(fit.dof, 1)))


P_MIN, P_MAX = 0.02, 4.0  # exponent range profiled; an estimate at either end is not identified
_P_GRID = np.linspace(P_MIN, P_MAX, 200)


@lru_cache(maxsize=64)
def _power_design(widths: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each p on _P_GRID: the design [1, n^−p] (P, k, 2), its pseudo-inverse (P, 2, k) and the
    residual maker I − H_p (P, k, k). Cached: calibration refits the same widths thousands of times."""
    n = np.asarray(widths, float)
    X = np.stack([np.column_stack([np.ones_like(n), n**-p]) for p in _P_GRID])
    pinv = np.linalg.pinv(X)
    return X, pinv, np.eye(len(n)) - X @ pinv


def _profile_power_batch(n, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """y = c + K·n^−p profiled over _P_GRID for many curves at once: Y (B, k) → (p, K), each (B,).
    For fixed p the model is linear, its residual (I − H_p)·y with H_p the hat matrix of [1, n^−p]."""
    _, pinv, R = _power_design(tuple(float(v) for v in n))
    sse = (np.einsum("pjk,bk->bpj", R, Y) ** 2).sum(axis=2)  # (B, P)
    best = np.argmin(sse, axis=1)
    return _P_GRID[best], np.einsum("bk,bk->b", pinv[best, 1, :], Y)


def _profile_power(n: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """y = c + K·n^−p with p profiled over [P_MIN, P_MAX] (linear in c, K for fixed p): the grid,
    then a bounded 1-D refinement around its best point. Returns (c, K, p, sse)."""
    from scipy.optimize import minimize_scalar  # scipy costs ~1 s to import: only when fitting

    def solve(p: float):
        X = np.column_stack([np.ones_like(n), n**-p])
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        return coef, float(((X @ coef - y) ** 2).sum())

    p0 = float(_profile_power_batch(n, np.asarray(y, float)[None, :])[0][0])
    k = int(np.searchsorted(_P_GRID, p0))
    lo, hi = _P_GRID[max(0, k - 1)], _P_GRID[min(len(_P_GRID) - 1, k + 1)]
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


def drift_verdict(widths, x, se, tolerance: float = DRIFT_TOLERANCE, level: float = LEVEL) -> dict:
    """Does the optimum move with width? The statistic is the slope b = d x*/d log n of a weighted
    log-linear fit (x* = log ν*), over uncensored optima only, with its `level` interval [lo, hi]:
      "none"      the interval lies inside ±tolerance (a drift, if any, too small to matter);
      "drift"     otherwise, the interval excludes 0;
      "undecided" otherwise, or with fewer than MIN_WIDTHS widths.
    The linear slope is the test, not paper 2's β: under no drift β is not identified at all, and
    a decaying drift still has a slope of one sign over the ladder."""
    out = {
        "verdict": "undecided",
        "slope": None,
        "slope_se": None,
        "slope_ci": None,
        "tolerance": tolerance,
        "n_widths": len(widths),
    }
    if len(widths) < MIN_WIDTHS:
        return {
            **out,
            "reason": f"{len(widths)} widths with an uncensored optimum; a drift verdict needs "
            f"{MIN_WIDTHS} (one residual degree of freedom beyond a 3-parameter law)",
        }
    f = fit_log_linear(widths, x, se)
    q = interval_quantile(f, level)
    lo, hi = f.b - q * f.b_se, f.b + q * f.b_se
    out.update(slope=f.b, slope_se=f.b_se, slope_ci=[lo, hi])
    ci = f"slope {f.b:+.3g} per log width, {level:.0%} interval [{lo:+.3g}, {hi:+.3g}]"
    if -tolerance < lo and hi < tolerance:
        return {**out, "verdict": "none", "reason": f"{ci} inside ±{tolerance:g}"}
    if lo > 0 or hi < 0:
        return {**out, "verdict": "drift", "reason": f"{ci} excludes 0"}
    return {**out, "reason": f"{ci} contains 0 and reaches beyond ±{tolerance:g}: add seeds or widths"}


def fast_transfer_verdict(
    widths, x, x_se, best_loss, loss_se, drift: dict, n_boot: int = 400, seed: int = 0, level: float = LEVEL
) -> dict:
    """Paper 2's test β > α/2, decided on an interval, over uncensored widths.

    - drift "none": True — the optimum is flat within tolerance over the ladder, so b_n ≈ 0 (β
      effectively infinite). Assumption: what holds over the ladder holds beyond it.
    - drift "undecided": "undecided" — whether ν* moves is unknown, so is how fast it settles.
    - drift "drift": the statistic s = β − α/2 from a parametric bootstrap (optima redrawn from
      N(x, x_se²), best losses from N(φ*, loss_se²), both laws refitted); True when its `level`
      interval is above 0, False when below, else undecided."""
    out = {"fast": "undecided", "interval": None}
    if len(widths) < MIN_WIDTHS:
        return {
            **out,
            "reason": f"{len(widths)} widths with an uncensored optimum: a 3-parameter law on "
            f"fewer than {MIN_WIDTHS} widths interpolates and cannot decide β > α/2",
        }
    if drift["verdict"] == "none":
        return {**out, "fast": True, "reason": f"no material drift of the optimum ({drift['reason']}): β effectively infinite"}
    if drift["verdict"] != "drift":
        return {**out, "reason": f"cannot tell whether the optimum drifts ({drift['reason']})"}
    n = np.asarray(widths, float)
    rng = np.random.default_rng(seed)
    X = np.asarray(x, float) + np.asarray(x_se, float) * rng.standard_normal((n_boot, len(n)))
    L = np.asarray(best_loss, float) + np.asarray(loss_se, float) * rng.standard_normal((n_boot, len(n)))
    beta, _ = _profile_power_batch(n, X)
    alpha, A = _profile_power_batch(n, L)
    s = np.where(A > 0, beta - alpha / 2, np.nan)
    bad = float(np.isnan(s).mean())
    if bad > (1 - level) / 2:
        return {**out, "reason": f"best loss does not fall with width in {bad:.0%} of redraws: α not identified"}
    lo, hi = (float(v) for v in np.nanquantile(s, [(1 - level) / 2, (1 + level) / 2]))
    txt = f"β − α/2 in [{lo:+.3g}, {hi:+.3g}] ({level:.0%}, {n_boot} redraws)"
    if lo > 0:
        return {**out, "fast": True, "interval": [lo, hi], "reason": txt + ": above 0"}
    if hi < 0:
        return {**out, "fast": False, "interval": [lo, hi], "reason": txt + ": below 0"}
    return {**out, "interval": [lo, hi], "reason": txt + ": contains 0; add widths or seeds"}


class Penalty(NamedTuple):
    mean: float  # κ·(bias² + se²): expected loss increase of the rule's value
    lo: float  # `level` predictive interval of the realized increase
    hi: float
    bias: float  # x_rule − x̂ at the target (log ν for log-scale hyperparameters)
    se: float  # std of x̂, the estimate of the target's optimum (of the whole mixture, when averaged)
    curvature: float


def predicted_penalty(
    fit: OptimumFit,
    rule_value: float,
    *,
    log_scale: bool = True,
    estimate: float | None = None,
    estimate_se: float | None = None,
    mixture: list[tuple[float, float, float]] | None = None,
    level: float = LEVEL,
) -> Penalty | None:
    """Expected loss increase of training at `rule_value` instead of the target's unknown optimum x*.

    Near the optimum loss ≈ φ* + κ·(x − x*)² (optimum.py; paper 2: c_n = Θ(b_n²)). With our estimate
    x* ~ N(x̂, se²) (x̂ = `estimate`, default the fit's own optimum; se = `estimate_se`, default its
    log_se) and x_rule = log(rule_value):
        E[κ·(x_rule − x*)²] = κ·(bias² + se²),  bias = x_rule − x̂.
    A rule that lands exactly on the estimate still pays κ·se²: the penalty prices what we do not
    know, so `power-law` is not free by construction. Predictive interval: (x_rule − x*)²/se² is
    noncentral χ²₁ with noncentrality bias²/se²; its quantiles × se² × κ's bootstrap bounds (both
    ends at once: conservative). None without a fitted curvature.

    `mixture` = [(weight, x̂_k, se_k), …] (x̂ in x units: log ν when log-scale) replaces the single
    normal by a mixture of normals (model averaging, penalty_at_target): the mean is Σ w_k·κ·(bias_k²
    + se_k²) and the interval's ends are quantiles of the mixture of the scaled noncentral χ²₁."""
    if fit.curvature is None:
        return None
    to_x = math.log if log_scale else (lambda v: v)
    x_rule = to_x(rule_value)
    if mixture is None:
        x_hat = to_x(estimate if estimate is not None else fit.value)
        mixture = [(1.0, x_hat, float(estimate_se if estimate_se is not None else (fit.log_se or 0.0)))]
    w = np.array([c[0] for c in mixture], float)
    w = w / w.sum()
    xs, ses = np.array([c[1] for c in mixture], float), np.array([c[2] for c in mixture], float)
    m = float((w * xs).sum())
    var = float((w * (ses**2 + (xs - m) ** 2)).sum())
    k = fit.curvature
    k_lo = fit.curvature_low if fit.curvature_low is not None else k
    k_hi = fit.curvature_high if fit.curvature_high is not None else k
    bias = x_rule - m
    mean = k * float((w * ((x_rule - xs) ** 2 + ses**2)).sum())  # = κ·(bias² + var)
    ps = [(1 - level) / 2, (1 + level) / 2]
    d2 = _mixture_sq_quantiles(w, x_rule - xs, ses, ps)
    return Penalty(mean, float(k_lo * d2[0]), float(k_hi * d2[1]), bias, math.sqrt(var), k)


def _mixture_sq_quantiles(w: np.ndarray, bias: np.ndarray, se: np.ndarray, ps: list[float]) -> list[float]:
    """Quantiles of D² where D ~ Σ w_k·N(bias_k, se_k²): per component D²/se² is noncentral χ²₁
    (λ = bias²/se²; a point mass at bias² when se = 0); the mixture's CDF is inverted by bisection."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, ncx2

    def cdf(t: float) -> float:
        total = 0.0
        for wk, b, s in zip(w, bias, se):
            if s <= 0:
                total += wk * float(t >= b * b)
            else:
                lam = b * b / (s * s)
                total += wk * float(chi2.cdf(t / s**2, 1) if lam < 1e-12 else ncx2.cdf(t / s**2, 1, lam))
        return total

    if not (np.isfinite(bias).all() and np.isfinite(se).all() and np.isfinite(w).all()):
        return [math.nan] * len(ps)  # a degenerate fit (e.g. an absurd loss): no interval, as ncx2 gives
    if len(w) == 1 and se[0] > 0:  # one normal: the closed form
        lam = bias[0] ** 2 / se[0] ** 2
        return [float(se[0] ** 2 * q) for q in (chi2.ppf(ps, 1) if lam < 1e-12 else ncx2.ppf(ps, 1, lam))]
    out = []
    hi = float(max(b * b + 40 * s * s + 40 * abs(b) * s for b, s in zip(bias, se))) + 1e-12
    lo_cdf, hi_cdf = cdf(0.0), cdf(hi)
    for p in ps:
        if not (math.isfinite(lo_cdf) and math.isfinite(hi_cdf)) or hi_cdf < p:
            out.append(math.nan)
        elif lo_cdf >= p:
            out.append(0.0)
        elif len(w) == 1:  # se = 0: the point mass
            out.append(float(bias[0] ** 2))
        else:
            out.append(float(brentq(lambda t, p=p: cdf(t) - p, 0.0, hi, xtol=1e-14, rtol=1e-10)))
    return out


def primary_hp(tuned: list[str]) -> str:
    return "lr" if "lr" in tuned else tuned[0]


def _x(f: OptimumFit, log_scale: bool) -> float:
    return math.log(f.value) if log_scale else f.value


def diagnose(
    fits: dict[int, dict[str, OptimumFit]],
    tuned: list[str],
    log_scale: set[str],
    rule: str,
    parametrization: str,
    source_width: int,
    target_width: int,
    transferred: dict[str, float] | None = None,
    n_boot: int = 400,
    seed: int = 0,
) -> dict:
    """Everything a user needs to judge the plan: fits, the verdicts, the predicted penalty, warnings.

    transferred: the rule's value for each hyperparameter at the target width before any batch/steps
    heuristic; the predicted penalty prices its distance to the target's estimated optimum."""
    widths = sorted(fits)
    hp = primary_hp(tuned)
    hp_log = hp in log_scale
    warnings: list[str] = []
    out: dict = {"primary": hp, "widths": widths}
    usable = [w for w in widths if fits[w][hp].censored is None]  # censored optima are bounds
    out["usable_widths"] = usable
    # Width keys are strings, as in the plan's other per-width maps: YAML/JSON give strings back.
    out["censored_widths"] = {h: {str(w): fits[w][h].censored for w in widths if fits[w][h].censored} for h in tuned}
    out["noise_by_width"] = {str(w): fits[w][hp].noise for w in widths}

    # φ*_n: the parabola's minimum, unless the parabola fits worse than the best point it went through.
    best = {w: min(fits[w][hp].fitted_loss, fits[w][hp].best_loss) for w in widths}
    loss_fit = fit_loss_vs_width(widths, [best[w] for w in widths])
    out["loss_fit"] = loss_fit
    if len(widths) >= 3 and loss_fit is None:
        warnings.append(
            f"best loss does not fall with width ({best}); the ladder may be too short-trained or too noisy to judge transfer"
        )

    trend = {}
    for h in tuned:
        ok = [w for w in widths if fits[w][h].censored is None]
        if len(ok) >= 2:
            f = fit_log_linear(ok, [_x(fits[w][h], h in log_scale) for w in ok], [fits[w][h].log_se for w in ok])
            trend[h] = {"slope": f.b, "slope_se": f.b_se, "log_scale": h in log_scale, "widths": ok}
    out["optimum_trend"] = trend  # d log ν* / d log n (or dν*/d log n): 0 means width-invariant

    xs = {w: _x(fits[w][hp], hp_log) for w in widths}
    ses = {w: fits[w][hp].log_se for w in widths}
    drift = fit_drift(usable, [xs[w] for w in usable], [ses[w] for w in usable]) if len(usable) >= 2 else None
    if drift is not None and not hp_log and "value_at_infinity" in drift:
        drift["value_at_infinity"] = drift["x_inf"]  # fitted on ν itself, not log ν
    out["drift_fit"] = drift
    verdict = drift_verdict(usable, [xs[w] for w in usable], [ses[w] for w in usable])
    out["drift_verdict"] = verdict

    fast = fast_transfer_verdict(
        usable,
        [xs[w] for w in usable],
        [ses[w] for w in usable],
        [best[w] for w in usable],
        [fits[w][hp].loss_se or 0.0 for w in usable],
        verdict,
        n_boot=n_boot,
        seed=seed,
    )
    out["fast_transfer"] = fast["fast"]
    out["fast_transfer_reason"] = fast["reason"]
    out["fast_transfer_interval"] = fast["interval"]
    if fast["fast"] == "undecided":
        out["fast_transfer_undecided"] = fast["reason"]
    if drift is not None and loss_fit is not None and drift.get("beta") is not None:
        out["fast_transfer_test"] = f"beta={drift['beta']:.3g} vs alpha/2={loss_fit['alpha'] / 2:.3g}"

    kfit = _curvature_fit(fits, hp)
    out["curvature"] = kfit.curvature if kfit else None
    if len(usable) >= 3 and kfit is not None and drift["drift"] in ("fitted", "none"):
        # Paper 2's c_n ≈ κ·b_n² at the source width: the loss given up by ν*(n_src) where ν*(∞) is best.
        b_src = drift["B"] * source_width ** -drift["beta"] if drift["drift"] == "fitted" else 0.0
        out["predicted_penalty_asymptotic"] = kfit.curvature * b_src**2
        out["predicted_hp_gap"] = b_src

    out.update(penalty_at_target(fits, hp, hp_log, verdict, target_width, (transferred or {}).get(hp)))
    if loss_fit is not None:
        out["loss_gap_at_source"] = loss_fit["A"] * source_width ** -loss_fit["alpha"]
        out["predicted_target_loss"] = loss_fit["phi_inf"] + loss_fit["A"] * target_width ** -loss_fit["alpha"]
        out["predicted_target_loss_interval"] = _target_loss_interval(
            widths, [best[w] for w in widths], [fits[w][hp] for w in widths], target_width, seed=seed
        )
    out["ladder_best_loss"] = min(best.values()) if best else None

    out["warnings"] = warnings + _warnings(fits, widths, hp, rule, verdict, fast, trend)
    return out


def _target_loss_interval(widths, losses, fits, target_width: int, n_boot: int = 200, seed: int = 0):
    """95% interval of the loss law's prediction at the target: redraw each width's best loss from
    its standard error (the measured noise / √seeds, floored at 0.5% of the loss — a fit to three
    exact points would otherwise claim certainty), refit, predict; the 2.5/97.5% quantiles of the
    refits that still fall with width. None when under half of them do."""
    rng = np.random.default_rng(seed)
    n, L = np.asarray(widths, float), np.asarray(losses, float)
    se = np.array([max(f.loss_se or 0.0, 0.005 * abs(loss)) for f, loss in zip(fits, L)])
    if len(n) < 3:
        return None
    # All redraws at once (same draws, row by row, as one at a time): the law profiled on _P_GRID —
    # fit_loss_vs_width's bounded refinement of α moves a quantile by far less than its spread.
    Y = L + rng.normal(0, se, size=(n_boot, len(n)))
    _, pinv, R = _power_design(tuple(float(v) for v in n))
    best = np.argmin((np.einsum("pjk,bk->bpj", R, Y) ** 2).sum(axis=2), axis=1)
    phi_inf, A = np.einsum("bk,bk->b", pinv[best, 0, :], Y), np.einsum("bk,bk->b", pinv[best, 1, :], Y)
    preds = (phi_inf + A * float(target_width) ** -_P_GRID[best])[A > 0]  # a law only where loss falls with width
    if len(preds) < n_boot / 2:
        return None
    return [float(np.quantile(preds, 0.025)), float(np.quantile(preds, 0.975))]


def check_target(diagnostics: dict, measured: float | None) -> dict:
    """After the large run: is the target inside the predicted interval, and not worse than the
    best of its narrower ladder ("wider is better" at fixed hyperparameters, Tensor Programs V)?
    Returns {"verdict": "ok" | "worse than predicted" | "worse than the ladder" | "unchecked",
    "messages": [...]}; any verdict but ok/unchecked is a warning to show loudly."""
    if measured is None or not math.isfinite(measured):
        return {"verdict": "unchecked", "messages": ["the large run has no finite validation loss"]}
    msgs, verdict = [], "ok"
    interval = diagnostics.get("predicted_target_loss_interval")
    ladder = diagnostics.get("ladder_best_loss")
    if interval:
        lo, hi = interval
        if measured > hi:
            verdict = "worse than predicted"
            msgs.append(f"target val loss {measured:.4g} is above the predicted interval [{lo:.4g}, {hi:.4g}]")
        else:
            msgs.append(
                f"target val loss {measured:.4g} {'inside' if measured >= lo else 'below'} the predicted "
                f"interval [{lo:.4g}, {hi:.4g}]"
            )
    else:
        msgs.append("no predicted interval (needs ≥ 3 widths whose best loss falls with width)")
    if ladder is not None and measured > ladder:
        verdict = "worse than the ladder" if verdict == "ok" else verdict
        msgs.append(
            f"target val loss {measured:.4g} is WORSE than the ladder's best {ladder:.4g}: a wider model "
            "should not lose at the same horizon and hyperparameters (a short horizon, noise, or a transfer "
            "that did not hold — compare seeds before trusting the plan)"
        )
    return {"verdict": verdict, "messages": msgs}


def _curvature_fit(fits: dict[int, dict[str, OptimumFit]], hp: str) -> OptimumFit | None:
    """The fit whose κ prices a miss: the widest uncensored width with a convex parabola (else the
    widest convex one). Assumption: κ in base-width units is stable from there to the target."""
    widths = sorted(fits)
    usable = [w for w in widths if fits[w][hp].censored is None]
    curved = [w for w in (usable or widths) if fits[w][hp].curvature is not None]
    return fits[curved[-1]][hp] if curved else None


def penalty_at_target(
    fits: dict[int, dict[str, OptimumFit]], hp: str, log_scale: bool, verdict: dict, target_width: int, rule_value: float | None
) -> dict:
    """Price a rule's value for `hp` at the target: its estimated optimum x̂ ± se, then
    predicted_penalty against it. x̂ by the drift verdict (drift_verdict's dict):
      "none"      → the weighted mean of the uncensored optima (the slope is immaterial: pooling is
                    the better estimator; error by the Birge ratio as in fit_log_linear);
      "drift"     → the log-linear trend's value at the target with its prediction error;
      "undecided" → with ≥ 3 uncensored widths, both models averaged (no_drift_weight): pricing the
                    trend alone treated an 8× extrapolation of a slope indistinguishable from 0 as
                    the likely truth, and over-predicted 4–11× on width-invariant synthetic optima
                    (tests/test_calibration.py) and up to 10× in benchmarks/transfer_regret.py;
      else        the widest width's own optimum and error (censored or not: then a bound's spread).
    Keys: predicted_penalty (+ _interval, _basis, _bias, _se, _weights) and trend_value_at_target."""
    usable = [w for w in sorted(fits) if fits[w][hp].censored is None]
    kfit = _curvature_fit(fits, hp)
    out = {"predicted_penalty": None, "predicted_penalty_interval": None, "predicted_penalty_basis": None}
    if len(usable) >= 3:
        f = fit_log_linear(usable, [_x(fits[w][hp], log_scale) for w in usable], [fits[w][hp].log_se for w in usable])
        t = f.predict(target_width)
        out["trend_value_at_target"] = math.exp(t) if log_scale else t
    if kfit is None or rule_value is None:
        return out
    widest = fits[max(fits)][hp]
    verdict_name, weights = verdict["verdict"], None
    if verdict_name == "none" or (verdict_name == "undecided" and len(usable) >= 3):  # "none" implies ≥ MIN_WIDTHS
        x = np.array([_x(fits[w][hp], log_scale) for w in usable])
        wts = 1 / np.array([fits[w][hp].log_se for w in usable]) ** 2
        est = float((wts * x).sum() / wts.sum())
        chi2_dof = float((wts * (x - est) ** 2).sum() / (len(x) - 1))
        mixture = [(1.0, est, math.sqrt(max(1.0, chi2_dof) / wts.sum()))]
        basis = "no drift: weighted mean of the uncensored optima"
        if verdict_name == "undecided":
            w0 = no_drift_weight(usable, x, 1 / np.sqrt(wts), trend=f)
            mixture = [(w0, est, mixture[0][2]), (1 - w0, f.predict(target_width), f.predict_se(target_width))]
            weights = {"no_drift": w0, "trend": 1 - w0}
            basis = (
                f"drift undecided: no-drift mean of widths {usable} (weight {w0:.2f}) averaged with "
                f"their log-linear trend at the target (weight {1 - w0:.2f})"
            )
    elif verdict_name == "drift" and len(usable) >= 3:
        mixture = [(1.0, f.predict(target_width), f.predict_se(target_width))]
        basis = f"log-linear trend over widths {usable} at the target (drift)"
    else:
        mixture = [(1.0, _x(widest, log_scale), widest.log_se or 0.0)]
        basis = f"widest width {max(fits)} alone ({len(usable)} uncensored widths)"
    p = predicted_penalty(kfit, rule_value, log_scale=log_scale, mixture=mixture)
    return {
        **out,
        "predicted_penalty": p.mean,
        "predicted_penalty_interval": [p.lo, p.hi],
        "predicted_penalty_basis": basis,
        "predicted_penalty_bias": p.bias,
        "predicted_penalty_se": p.se,
        "predicted_penalty_weights": weights,
    }


def no_drift_weight(widths, x, se, trend: LogLinearFit | None = None) -> float:
    """Weight of "the optimum does not move" against "it moves log-linearly" when the drift test
    abstains: BIC model averaging (Raftery 1995), w₀ = 1 / (1 + exp(−ΔBIC/2)) with
        ΔBIC = BIC(constant) − BIC(trend) = (χ²₀ − χ²₁)/s − ln k,
    k widths, χ² with the optima's own errors, s the trend's Birge ratio max(1, χ²₁/(k − 2)) — scatter
    beyond the errors is noise for both models, as in an F-test, not evidence for the slope.
    `trend`: fit_log_linear(widths, x, se) when the caller has it already."""
    x, se = np.asarray(x, float), np.asarray(se, float)
    w = 1 / se**2
    chi0 = float((w * (x - (w * x).sum() / w.sum()) ** 2).sum())
    f = trend if trend is not None else fit_log_linear(widths, x, se)
    chi1 = float((w * (x - np.array([f.predict(n) for n in widths])) ** 2).sum())
    s = max(1.0, chi1 / max(len(x) - 2, 1))
    d_bic = (chi0 - chi1) / s - math.log(len(x))
    return float(1 / (1 + math.exp(min(700.0, d_bic / 2))))


def _warnings(fits, widths, hp, rule, verdict, fast, trend) -> list[str]:
    """Each warning says what to do next."""
    warnings = []
    for w in widths:
        for h, f in fits[w].items():
            if f.on_edge:
                warnings.append(
                    f"width {w}: best {h}={f.value:g} is on the grid edge; extend sweep.grid.{h} "
                    "(the optimum is a bound, left out of the trend fits)"
                )
            elif not f.convex:
                warnings.append(
                    f"width {w}: loss against {h} is not convex around the best point "
                    f"{f.best_grid_value:g} (noise or a coarse grid); add seeds or grid points"
                )
            if f.capped_by_divergence:
                warnings.append(
                    f"width {w}: the {h} value above the best one diverged; {h}*={f.value:g} "
                    "sits near the stability edge (a bound, left out of the trend fits), "
                    "the target may be close to diverging"
                )
    if len(widths) < 3:
        warnings.append(
            f"only {len(widths)} widths with results; {MIN_WIDTHS} or more are needed to judge drift (fast-transfer test skipped)"
        )
    if fast["fast"] == "undecided":
        warnings.append(f"fast-transfer test undecided: {fast['reason']}; add a wider width or seeds")
    if verdict["verdict"] == "drift" and fast["fast"] is True:
        if rule == "power-law":
            warnings.append(
                f"the optimum of {hp} drifts over the ladder but settles fast ({fast['reason']}); "
                "a power law extrapolates the drift past where it stops: consider rule `mup`"
            )
    elif verdict["verdict"] == "drift" or fast["fast"] is False:
        t = trend.get(hp, {})
        slope = f"slope {t['slope']:+.3g} per log width" if t.get("slope") is not None else "slope unknown"
        if rule in MUP_RULES:
            warnings.append(
                f"the optimum of {hp} drifts with width ({slope}"
                + (", transfer not fast" if fast["fast"] is False else "")
                + f") under rule `{rule}`; "
                "use rule `power-law` or extend the ladder to wider models"
            )
    elif verdict["verdict"] == "undecided" and len(widths) >= 3:
        warnings.append(f"cannot tell whether the optimum of {hp} drifts with width: {verdict['reason']}")
    return warnings
