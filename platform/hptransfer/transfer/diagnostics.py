"""When to trust a transfer: the fast-transfer test of paper 2 and the warnings a sweep can earn.

Paper 2 (Ghosh, Wu, Bietti, "Understanding the Mechanisms of Fast Hyperparameter Transfer",
arXiv 2512.22768). With φ*_n the best loss at width n and ν*(n) its argmin:
  loss gap        a_n = φ*_n − φ*_∞              ~ A·n^−α
  HP gap          b_n = |log ν*(n) − log ν*(∞)| ~ B·n^−β
  transfer cost   c_n = φ_∞(ν*(n)) − φ*_∞        = Θ(b_n²) near a strongly convex optimum
Transfer is *fast* (a small-width search beats a direct search at equal compute) iff c_n = o(a_n),
i.e. iff β > α/2. ν*(∞) is unknown; the paper puts ν*(n_max) in its place, we fit it jointly (see
fit_drift for why). The predicted penalty of transferring ν*(n_src) is κ·(B·n_src^−β)², κ the
curvature of loss in log ν at the widest width (see optimum.py).
Pure: numpy and scipy (imported when fitting) only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hptransfer.transfer.optimum import OptimumFit

# Optima spread below 5% in ν is no drift worth a verdict: far below any grid step in use (×√2 is
# 35%), and costs κ·0.05² ≈ 2e-4 in loss at a typical κ ≈ 0.08. Assumption, stated.
DRIFT_FLOOR = 0.05


@dataclass(frozen=True)
class LogLinearFit:
    """y = a + b·log n, by (weighted) least squares; b_se is None with fewer than 3 points."""

    a: float
    b: float
    b_se: float | None
    a_se: float | None
    cov_ab: float | None
    n_points: int

    def predict(self, n: float) -> float:
        return self.a + self.b * math.log(n)

    def predict_se(self, n: float) -> float | None:
        if self.a_se is None or self.b_se is None or self.cov_ab is None:
            return None
        ln = math.log(n)
        return math.sqrt(max(0.0, self.a_se**2 + ln**2 * self.b_se**2 + 2 * ln * self.cov_ab))


def fit_log_linear(widths, y, se=None) -> LogLinearFit:
    """Fit y = a + b·log n. se: per-point standard errors (weights 1/se²) when all are positive."""
    n, y = np.asarray(widths, float), np.asarray(y, float)
    if len(n) < 2:
        raise ValueError(f"a trend needs at least 2 widths, got {len(n)}")
    X = np.column_stack([np.ones_like(n), np.log(n)])
    w = np.ones_like(n)
    if se is not None and all(s is not None and s > 0 for s in se):
        w = 1.0 / np.asarray(se, float) ** 2
    W = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(X * W[:, None], y * W, rcond=None)
    if len(n) < 3:
        return LogLinearFit(float(coef[0]), float(coef[1]), None, None, None, len(n))
    resid = y - X @ coef
    dof = len(n) - 2
    s2 = float((w * resid**2).sum() / dof)  # residual scale, so unweighted fits get honest errors too
    cov = s2 * np.linalg.inv((X * w[:, None]).T @ X)
    return LogLinearFit(float(coef[0]), float(coef[1]), float(math.sqrt(cov[1, 1])),
                        float(math.sqrt(cov[0, 0])), float(cov[0, 1]), len(n))


P_MIN, P_MAX = 0.02, 4.0  # exponent range profiled; an estimate at either end is not identified


def _profile_power(n: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """y = c + K·n^−p with p profiled over [P_MIN, P_MAX] (linear in c, K for fixed p): (c, K, p, sse)."""
    from scipy.optimize import minimize_scalar  # scipy costs ~1 s to import: only when fitting

    def solve(p: float):
        X = np.column_stack([np.ones_like(n), n ** -p])
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        return coef, float(((X @ coef - y) ** 2).sum())

    grid = np.linspace(P_MIN, P_MAX, 200)
    k = int(np.argmin([solve(p)[1] for p in grid]))
    lo, hi = grid[max(0, k - 1)], grid[min(len(grid) - 1, k + 1)]
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
    return {"phi_inf": phi_inf, "A": A, "alpha": alpha, "rmse": math.sqrt(sse / len(n)),
            "n_widths": len(n), "exact": len(n) == 3, "at_bound": _at_bound(alpha)}


def _at_bound(p: float) -> bool:
    return p <= P_MIN * 1.05 or p >= P_MAX * 0.99


def fit_drift(widths, log_opt, se=None) -> dict:
    """b_n = |log ν*(n) − log ν*(∞)| = B·n^−β, with ν*(∞) fitted jointly: log ν*(n) = x_∞ + K·n^−β,
    B = |K|. Paper 2 puts ν*(n_max) in place of ν*(∞); that shortcut inflates β when the drift
    decays slowly (the gap to n_max shrinks faster than the gap to ∞), which would call slow
    transfer fast, so we fit x_∞ instead (3 parameters: needs 3 widths, exact at 3).
    Returns {"drift": "none"} when the optima are within DRIFT_FLOOR of each other, or — with
    bootstrap errors `se` for every width — when one constant fits them (χ² test at 5%): seed noise
    must not be read as drift."""
    n, x = np.asarray(widths, float), np.asarray(log_opt, float)
    if np.ptp(x) <= DRIFT_FLOOR:
        return {"drift": "none", "B": 0.0, "beta": None, "x_inf": float(x.mean()), "why": "optima within 5% of each other"}
    if se is not None and len(x) >= 2 and all(s is not None and s > 0 for s in se):
        from scipy.stats import chi2

        w = 1 / np.asarray(se, float) ** 2
        xbar = float((w * x).sum() / w.sum())
        stat = float((w * (x - xbar) ** 2).sum())
        if stat <= chi2.ppf(0.95, len(x) - 1):
            return {"drift": "none", "B": 0.0, "beta": None, "x_inf": xbar,
                    "why": f"a constant fits the optima within their bootstrap errors (chi2={stat:.3g})"}
    if len(n) < 3:
        return {"drift": "unknown", "B": None, "beta": None, "why": "fewer than 3 widths"}
    x_inf, K, beta, sse = _profile_power(n, x)
    return {"drift": "fitted", "B": abs(K), "beta": beta, "x_inf": x_inf, "value_at_infinity": math.exp(min(x_inf, 700.0)),
            "rmse": math.sqrt(sse / len(n)), "exact": len(n) == 3, "at_bound": _at_bound(beta)}


def primary_hp(tuned: list[str]) -> str:
    return "lr" if "lr" in tuned else tuned[0]


def diagnose(fits: dict[int, dict[str, OptimumFit]], tuned: list[str], log_scale: set[str], rule: str,
             parametrization: str, source_width: int, target_width: int,
             transferred: dict[str, float] | None = None) -> dict:
    """Everything a user needs to judge the plan: fits, the verdict, the predicted penalty, warnings.

    transferred: the rule's value for each hyperparameter at the target width before any batch/steps
    heuristic; the predicted penalty prices its distance to the trend's extrapolation."""
    widths = sorted(fits)
    hp = primary_hp(tuned)
    warnings: list[str] = []
    out: dict = {"primary": hp, "widths": widths}

    # φ*_n: the parabola's minimum, unless the parabola fits worse than the best point it went through.
    best = [min(fits[w][hp].fitted_loss, fits[w][hp].best_loss) for w in widths]
    loss_fit = fit_loss_vs_width(widths, best)
    out["loss_fit"] = loss_fit
    if len(widths) >= 3 and loss_fit is None:
        warnings.append(f"best loss does not fall with width ({dict(zip(widths, best))}); the ladder "
                        "may be too short-trained or too noisy to judge transfer")

    trend = {}
    for h in tuned:
        xs = [math.log(fits[w][h].value) if h in log_scale else fits[w][h].value for w in widths]
        if len(widths) >= 2:
            f = fit_log_linear(widths, xs, [fits[w][h].log_se for w in widths])
            trend[h] = {"slope": f.b, "slope_se": f.b_se, "log_scale": h in log_scale}
    out["optimum_trend"] = trend  # d log ν* / d log n (or dν*/d log n): 0 means width-invariant

    drift = fit_drift(widths, [math.log(fits[w][hp].value) if hp in log_scale else fits[w][hp].value
                               for w in widths], [fits[w][hp].log_se for w in widths]) if len(widths) >= 2 else None
    if drift is not None and hp not in log_scale and "value_at_infinity" in drift:
        drift["value_at_infinity"] = drift["x_inf"]  # fitted on ν itself, not log ν
    out["drift_fit"] = drift

    fast = None  # not judged below 3 widths: two points always look like "no drift" or a clean line
    if len(widths) < 3:
        pass
    elif drift["drift"] == "none":
        fast = True
    elif drift.get("beta") is not None and loss_fit is not None:
        if loss_fit["at_bound"] or (drift["at_bound"] and drift["beta"] > P_MIN * 1.05):
            # α at a bound, or β at its upper bound: the comparison would be between artefacts.
            # (β at its lower bound is a real answer: a drift that does not decay — not fast.)
            out["fast_transfer_undecided"] = (f"exponent at the edge of its fit range (alpha={loss_fit['alpha']:.3g}, "
                                              f"beta={drift['beta']:.3g}): too few widths or too much noise")
        else:
            fast = bool(drift["beta"] > loss_fit["alpha"] / 2)
    out["fast_transfer"] = fast
    if drift is not None and loss_fit is not None and drift.get("beta") is not None:
        out["fast_transfer_test"] = f"beta={drift['beta']:.3g} vs alpha/2={loss_fit['alpha'] / 2:.3g}"

    kappa = fits[widths[-1]][hp].curvature
    out["curvature"] = kappa
    # Paper 2's c_n ≈ κ·b_n² at the source width: the loss given up by ν*(n_src) where ν*(∞) is best.
    if len(widths) >= 3 and kappa is not None and drift["drift"] in ("fitted", "none"):
        b_src = drift["B"] * source_width ** -drift["beta"] if drift["drift"] == "fitted" else 0.0
        out["predicted_penalty_asymptotic"] = kappa * b_src**2
        out["predicted_hp_gap"] = b_src
    # At the target: κ·(x_used − x_trend(target))², x_trend the log-linear trend of the optima — the
    # conservative extrapolation (a power law never saturates), robust where β is not identified.
    out["predicted_penalty"] = None
    if kappa is not None and transferred and hp in transferred and hp in trend:
        f = fit_log_linear(widths, [math.log(fits[w][hp].value) if hp in log_scale else fits[w][hp].value
                                    for w in widths])
        used = math.log(transferred[hp]) if hp in log_scale else transferred[hp]
        out["trend_value_at_target"] = math.exp(f.predict(target_width)) if hp in log_scale else f.predict(target_width)
        out["predicted_penalty"] = kappa * (used - f.predict(target_width)) ** 2 if drift["drift"] != "none" else 0.0
    if loss_fit is not None:
        out["loss_gap_at_source"] = loss_fit["A"] * source_width ** -loss_fit["alpha"]
        out["predicted_target_loss"] = loss_fit["phi_inf"] + loss_fit["A"] * target_width ** -loss_fit["alpha"]

    # Warnings: each says what to do next.
    for w in widths:
        for h, f in fits[w].items():
            if f.on_edge:
                warnings.append(f"width {w}: best {h}={f.value:g} is on the grid edge; extend sweep.grid.{h}")
            elif not f.convex:
                warnings.append(f"width {w}: loss against {h} is not convex around the best point "
                                f"{f.best_grid_value:g} (noise or a coarse grid); add seeds or grid points")
            if f.capped_by_divergence:
                warnings.append(f"width {w}: the {h} value above the best one diverged; {h}*={f.value:g} "
                                "sits near the stability edge, the target may be close to diverging")
    if len(widths) < 3:
        warnings.append(f"only {len(widths)} widths with results; 3 or more are needed to judge drift "
                        "(fast-transfer test skipped)")
    if "fast_transfer_undecided" in out:
        warnings.append(f"fast-transfer test undecided: {out['fast_transfer_undecided']}; add a wider width or seeds")
    drifting = fast is False or (hp in trend and trend[hp]["slope_se"] is not None
                                 and abs(trend[hp]["slope"]) > 2 * trend[hp]["slope_se"]
                                 and abs(trend[hp]["slope"]) > 0.05)
    if drifting and rule in ("mup", "mup-independent-wd"):
        warnings.append(f"the optimum of {hp} drifts with width (slope {trend[hp]['slope']:+.3g} per log width"
                        + ("" if fast is not False else ", transfer not fast") + f") under rule `{rule}`; "
                        "use rule `power-law` or extend the ladder to wider models")
    out["warnings"] = warnings
    return out
