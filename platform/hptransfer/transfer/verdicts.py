"""Verdicts that can abstain: does the optimum drift with width, is the transfer fast (paper 2's
β > α/2), and the warnings a sweep can earn (docs/RESEARCH.md, "Measuring transfer honestly";
issue 12, item 3).

Transfer is *fast* (a small-width search beats a direct search at equal compute) iff the transfer
cost c_n = φ_∞(ν*(n)) − φ*_∞ = Θ(b_n²) is o(a_n), i.e. iff β > α/2 (paper 2, arXiv 2512.22768).
Each verdict is decided only with MIN_WIDTHS widths (one residual degree of freedom for a
3-parameter law) and only when the interval of its statistic excludes the boundary; otherwise it is
"undecided" with the reason. Censored optima (grid edge, capped by divergence: optimum.py) are
bounds, never points: the drift slope takes them through a censored likelihood
(fitting.fit_log_linear_censored) once MIN_POINTS widths are points — a capped optimum repeated at
every width has no spread at all, and weighting it as a point by 1/se² once made any slope read as
drift; leaving it out called a drift off the grid's edge "undecided". The fast-transfer test
(paper 2's laws, 3 parameters each) is fitted on the uncensored widths only.
Calibrated on synthetic sweeps drawn many times: tests/test_calibration.py. Pure: numpy only.
"""

from __future__ import annotations

import numpy as np

from hptransfer.transfer.fitting import LEVEL, fit_log_linear_censored, interval_quantile, profile_power_batch

# A slope d log ν*/d log n whose 95% interval lies inside ±DRIFT_TOLERANCE is "none": over a 16×
# transfer (ln 16 = 2.8) it moves ν* by at most ×1.32, less than one ×√2 grid step. Assumption.
DRIFT_TOLERANCE = 0.1
MIN_WIDTHS = 4  # widths a verdict needs: 3-parameter laws keep one residual dof
MIN_POINTS = 3  # of them uncensored, for the drift slope: one residual dof among the points themselves
MUP_RULES = ("mup", "mup-independent-wd", "mup-standard-wd")  # rules that carry the optimum over as is


def drift_verdict(widths, x, se, censored=None, tolerance: float = DRIFT_TOLERANCE, level: float = LEVEL) -> dict:
    """Does the optimum move with width? The statistic is the slope b = d x*/d log n of a weighted
    log-linear fit (x* = log ν*) with its `level` interval [lo, hi]; `censored` (None, "upper" or
    "lower" per width) makes an optimum a bound in that fit (a censored likelihood):
      "none"      the interval lies inside ±tolerance (a drift, if any, too small to matter);
      "drift"     otherwise, the interval excludes 0;
      "undecided" otherwise, or with fewer than MIN_WIDTHS widths or MIN_POINTS uncensored ones.
    The linear slope is the test, not paper 2's β: under no drift β is not identified at all, and
    a decaying drift still has a slope of one sign over the ladder."""
    kinds = list(censored) if censored is not None else [None] * len(widths)
    n_points = sum(k is None for k in kinds)
    out = {
        "verdict": "undecided",
        "slope": None,
        "slope_se": None,
        "slope_ci": None,
        "tolerance": tolerance,
        "n_widths": n_points,
        "n_bounds": len(widths) - n_points,
    }
    if len(widths) < MIN_WIDTHS or n_points < MIN_POINTS:
        return {
            **out,
            "reason": f"{n_points} widths with an uncensored optimum and {len(widths) - n_points} bounds; a drift "
            f"verdict needs {MIN_WIDTHS} widths (one residual degree of freedom beyond a 3-parameter law), "
            f"{MIN_POINTS} of them uncensored",
        }
    f = fit_log_linear_censored(widths, x, se, kinds)
    q = interval_quantile(f, level)
    lo, hi = f.b - q * f.b_se, f.b + q * f.b_se
    out.update(slope=f.b, slope_se=f.b_se, slope_ci=[lo, hi])
    ci = f"slope {f.b:+.3g} per log width, {level:.0%} interval [{lo:+.3g}, {hi:+.3g}]" + (
        f" ({f.n_censored} censored optima as bounds)" if f.n_censored else ""
    )
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
    beta, _ = profile_power_batch(n, X)
    alpha, A = profile_power_batch(n, L)
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


def sweep_warnings(fits, widths, hp, rule, verdict, fast, trend) -> list[str]:
    """Each warning says what to do next."""
    warnings = []
    for w in widths:
        for h, f in fits[w].items():
            if f.on_edge:
                warnings.append(
                    f"width {w}: best {h}={f.value:g} is on the grid edge; extend sweep.grid.{h} "
                    "(the optimum is a bound: it enters the trend fits as one)"
                )
            elif not f.convex:
                warnings.append(
                    f"width {w}: loss against {h} is not convex around the best point "
                    f"{f.best_grid_value:g} (noise or a coarse grid); add seeds or grid points"
                )
            if f.capped_by_divergence:
                warnings.append(
                    f"width {w}: the {h} value above the best one diverged; {h}*={f.value:g} "
                    "sits near the stability edge (a bound in the trend fits), "
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
