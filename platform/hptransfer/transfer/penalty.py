"""The predicted penalty of a plan: the expected loss increase of training the target at the rule's
value instead of its unknown optimum, priced by the parabola's curvature κ (paper 2: c_n = Θ(b_n²);
docs/RESEARCH.md, "Measuring transfer honestly"). Pure: numpy and scipy (imported when pricing).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from hptransfer.transfer.fitting import LEVEL, LogLinearFit, fit_log_linear, trend_of, x_of
from hptransfer.transfer.optimum import OptimumFit


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


def curvature_fit(fits: dict[int, dict[str, OptimumFit]], hp: str) -> OptimumFit | None:
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
      "drift"     → the log-linear trend's value at the target with its prediction error (censored
                    optima as bounds: fitting.fit_log_linear_censored);
      "undecided" → with ≥ 3 uncensored widths, both models averaged (no_drift_weight): pricing the
                    trend alone treated an 8× extrapolation of a slope indistinguishable from 0 as
                    the likely truth, and over-predicted 4–11× on width-invariant synthetic optima
                    (tests/test_calibration.py) and up to 10× in benchmarks/transfer_regret.py;
      else        the widest width's own optimum and error (censored or not: then a bound's spread).
    Keys: predicted_penalty (+ _interval, _basis, _bias, _se, _weights) and trend_value_at_target."""
    usable = [w for w in sorted(fits) if fits[w][hp].censored is None]
    kfit = curvature_fit(fits, hp)
    out = {"predicted_penalty": None, "predicted_penalty_interval": None, "predicted_penalty_basis": None}
    if len(usable) >= 3:
        f = fit_log_linear(usable, [x_of(fits[w][hp], log_scale) for w in usable], [fits[w][hp].log_se for w in usable])
        fc = trend_of({w: fits[w][hp] for w in fits}, log_scale)  # the censored optima as bounds too
        t = fc.predict(target_width)
        out["trend_value_at_target"] = math.exp(t) if log_scale else t
    if kfit is None or rule_value is None:
        return out
    widest = fits[max(fits)][hp]
    verdict_name, weights = verdict["verdict"], None
    if verdict_name == "none" or (verdict_name == "undecided" and len(usable) >= 3):  # "none" implies ≥ MIN_WIDTHS
        x = np.array([x_of(fits[w][hp], log_scale) for w in usable])
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
        mixture = [(1.0, fc.predict(target_width), fc.predict_se(target_width))]
        basis = f"log-linear trend over widths {usable} at the target (drift)" + (
            f", censored widths {sorted(set(fits) - set(usable))} as bounds" if fc.n_censored else ""
        )
    else:
        mixture = [(1.0, x_of(widest, log_scale), widest.log_se or 0.0)]
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
