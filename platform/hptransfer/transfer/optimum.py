"""Per-width optimum of a hyperparameter from grid evidence, with an uncertainty that survives one seed.

Loss is close to quadratic in log(ν) near its minimum (the µTransfer plots of Tensor Programs V;
paper 2, Ghosh et al. arXiv 2512.22768, fits the same form). We average loss over seeds at each grid
value, take the best grid point and fit a parabola in log ν through it and up to two neighbours
each side; the vertex is the optimum, and the parabola's curvature κ (loss per (log ν)²) prices a
miss: transferring ν instead of ν* costs ≈ κ·(log ν − log ν*)² (paper 2: c_n = Θ(b_n²)).

Uncertainty (docs/RESEARCH.md, "Measuring transfer honestly"). The seed-averaged curve at grid value
g carries noise σ/√n_g, σ the per-trial loss noise and n_g the trials averaged there. σ comes, in
this order, from (1) the caller (a measured noise per width: the sweep replicates its best point),
(2) the pooled within-value spread of seed replicates, (3) the residuals of the local parabola (one
seed and nothing measured: a rough, usually pessimistic estimate — misfit counts as noise). We
redraw the curve `n_boot` times as mean_g + σ/√n_g·z and refit: the spread of the vertex is the
standard error of x* = log ν*, and of κ and of the fitted minimum likewise (a parametric bootstrap;
resampling 1–3 seeds instead would give zero or badly underestimated spread). The error is floored
at SE_FLOOR_STEPS grid steps in log space — assumption: with a quadratic that matches the data
exactly, the optimum is still not known better than a fraction of the spacing the grid resolves.

Diverged trials are information, not noise: a grid value where any trial diverged is "too high"
(the run sits at the edge of stability). It is kept out of the loss average — a surviving seed's
loss would understate it — and, when it lies just above the best stable value, it caps the
optimum there instead of letting the fit move past it. Failed trials (crashes) carry no
information and are dropped.

Censoring. An optimum on the edge of the grid, or capped because the next value up diverged, is a
bound, not a point: `censored = "upper"` (ν* is at most `value`: best at the low edge) or
`"lower"` (ν* is at least `value`: best at the high edge, or capped by divergence — there the best
*stable* value lies below the diverged one, `bound_high`). Trend fits must leave censored optima out
(their spread is not noise, and a bootstrap over identical capped values has none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Censoring = Literal["upper", "lower"]


@dataclass(frozen=True)
class OptimumFit:
    value: float  # the estimated optimum ν*
    best_grid_value: float  # the stable grid value with the lowest mean loss
    best_loss: float  # mean loss at the best grid point
    fitted_loss: float  # parabola's value at its vertex (= best_loss when not fitted)
    on_edge: bool  # best value is the smallest or largest value tried: extend the grid
    convex: bool  # a convex parabola was fitted (False: not enough points or a concave curve)
    n_points: int  # finite-loss trials used
    n_diverged: int
    capped_by_divergence: bool = False  # the next value up diverged: ν* is capped at the best point
    curvature: float | None = None  # κ in loss ≈ κ·(x − x*)² + min, x = log ν (or ν when linear)
    log_se: float | None = None  # std of x* = log ν* (or ν* when linear): parametric bootstrap, floored
    ci_low: float | None = None  # 2.5% / 97.5% bootstrap quantiles of ν*; for a censored optimum the
    ci_high: float | None = None  # open side is 0 (log scale) / -inf, or +inf
    censored: Censoring | None = None  # "upper": ν* ≤ value; "lower": ν* ≥ value; None: a point estimate
    bound_low: float | None = None  # when censored: the interval ν* is known to lie in (None: open)
    bound_high: float | None = None
    noise: float | None = None  # per-trial loss noise σ used for the uncertainty
    noise_source: str = "none"  # "given", "seed replicates", "parabola residuals" or "none"
    n_seeds: int = 1  # trials averaged at the best grid point
    se_floor: float = 0.0  # SE_FLOOR_STEPS × the grid step in x: the least log_se can be
    curvature_low: float | None = None  # 2.5% / 97.5% bootstrap quantiles of κ (convex redraws)
    curvature_high: float | None = None
    loss_se: float | None = None  # std of the fitted minimum loss φ*_n (floored at σ/√n_seeds)
    undecided: bool = False  # the points do not pin it (transfer/joint_pooled.py): its value is where they are, not an estimate
    joint: Any = None  # transfer/joint.py's JointFit when the optimum came from a joint fit over scattered points


LOCAL_WINDOW = 1.2  # log-units (×3.3): a quadratic is a local model; farther out the LR curve is
# visibly asymmetric (steep toward divergence), so farther points bias the vertex.
SE_FLOOR_STEPS = 0.25  # least log_se, in grid steps (docs/RESEARCH.md: "a quarter of a grid step"). Assumption.


def _window(x: np.ndarray, i: int, window: float) -> list[int]:
    """The best point, its immediate neighbours, and the next ones if within `window` of it."""
    return [j for j in range(max(0, i - 2), min(len(x), i + 3)) if abs(j - i) <= 1 or abs(x[j] - x[i]) <= window]


def _vertices(x: np.ndarray, M: np.ndarray, capped: bool, window: float):
    """Vertex fits of many curves at once. x: stable grid points sorted (G,); M: mean losses (B, G).

    Returns (x*, fitted loss, convex, curvature, index of best), each of shape (B,). Rows whose best
    point is at an uncapped end, or whose parabola is not convex, return the best grid point itself.
    The vertex moves only within the neighbours: a fit never extrapolates past the evidence, and
    never past a value that diverged."""
    B, G = M.shape
    best = np.argmin(M, axis=1)
    xv, fitted = x[best].astype(float), M[np.arange(B), best].astype(float)
    convex, curv = np.zeros(B, bool), np.full(B, np.nan)
    if G < 3:
        return xv, fitted, convex, curv, best
    for i in np.unique(best):
        if i == 0 or (i == G - 1 and not capped):
            continue
        rows = np.where(best == i)[0]
        idx = _window(x, int(i), window)
        d = x[idx] - x[i]  # centred: a well-conditioned design
        a, b, c = np.linalg.pinv(np.column_stack([d * d, d, np.ones_like(d)])) @ M[np.ix_(rows, idx)].T
        ok = a > 0
        upper = x[i] if i == G - 1 else x[i + 1]
        v = np.clip(-b[ok] / (2 * a[ok]), x[i - 1] - x[i], upper - x[i])
        r = rows[ok]
        xv[r], fitted[r] = x[i] + v, a[ok] * v * v + b[ok] * v + c[ok]
        convex[r], curv[r] = True, a[ok]
    return xv, fitted, convex, curv, best


def _residual_noise(x: np.ndarray, mean: np.ndarray, counts: np.ndarray, window: float) -> float | None:
    """σ per trial from the scatter of the seed-averaged curve about its local parabola (needs ≥ 4
    points: at least one residual degree of freedom). Misfit counts as noise: an overestimate."""
    i = int(np.argmin(mean))
    idx = _window(x, i, window)
    if len(idx) < 4:
        idx = list(range(max(0, i - 2), min(len(x), i + 3)))
    if len(idx) < 4:
        return None
    d = x[idx] - x[i]
    coef, *_ = np.linalg.lstsq(np.column_stack([d * d, d, np.ones_like(d)]), mean[idx], rcond=None)
    resid = (mean[idx] - np.column_stack([d * d, d, np.ones_like(d)]) @ coef) * np.sqrt(counts[idx])
    return float(math.sqrt((resid**2).sum() / (len(idx) - 3)))


def fit_optimum(
    values, losses, log_scale: bool = True, diverged=None, n_boot: int = 200, seed: int = 0, noise: float | None = None
) -> OptimumFit:
    """values, losses: one entry per trial (seeds pooled).

    diverged: per-trial flags; None means "every non-finite loss diverged". A non-finite loss that
    is not flagged diverged is a failure and is ignored.
    noise: the measured per-trial loss noise σ at this width (same seed-to-seed std the sweep's
    replicated best point gives); None: estimated from seed replicates, else from the parabola's
    residuals (see the module docstring)."""
    values, losses = np.asarray(values, float), np.asarray(losses, float)
    div = ~np.isfinite(losses) if diverged is None else np.asarray(diverged, bool)
    finite = np.isfinite(losses) & ~div
    if not finite.any():
        raise ValueError("no trial with a finite loss: every grid point diverged or failed")
    if noise is not None and not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a finite loss std >= 0, got {noise!r}")
    unstable = np.unique(values[div])
    stable_mask = finite & ~np.isin(values, unstable)
    if not stable_mask.any():
        raise ValueError("every grid value had at least one diverged trial; lower the grid")
    grid = np.unique(values[stable_mask])
    all_values = np.unique(np.concatenate([grid, unstable]))
    groups = [losses[stable_mask & (values == v)] for v in grid]
    mean = np.array([g.mean() for g in groups])
    counts = np.array([len(g) for g in groups], float)
    x = np.log(grid) if log_scale else grid
    i = int(np.argmin(mean))
    above = all_values[all_values > grid[i]]
    capped = bool(len(above) and above[0] in unstable)
    edge = grid[i] == all_values[0] or grid[i] == all_values[-1]
    window = LOCAL_WINDOW if log_scale else np.inf
    xv_a, fit_a, convex_a, curv_a, _ = _vertices(x, mean[None, :], capped, window)
    xv, fitted, convex = float(xv_a[0]), float(fit_a[0]), bool(convex_a[0])
    curv = float(curv_a[0]) if convex else None
    to_value = (lambda t: math.exp(t)) if log_scale else (lambda t: t)

    # σ per trial: given > seed replicates > parabola residuals.
    dof = float((counts - 1).sum())
    if noise is not None:
        sigma, source = float(noise), "given"
    elif dof > 0:
        sigma = float(math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / dof))
        source = "seed replicates"
    else:
        sigma = _residual_noise(x, mean, counts, window)
        source = "parabola residuals" if sigma is not None else "none"

    x_all = np.log(all_values) if log_scale else all_values
    step = float(np.median(np.diff(x_all))) if len(x_all) > 1 else 0.0
    floor = SE_FLOOR_STEPS * step
    se, qs, loss_se, k_lo, k_hi = 0.0, (xv, xv), 0.0, None, None
    if n_boot > 0 and sigma is not None and sigma > 0:
        rng = np.random.default_rng(seed)
        M = mean + sigma / np.sqrt(counts) * rng.standard_normal((n_boot, len(grid)))
        xs, fs, cv, ks, _ = _vertices(x, M, capped, window)
        se = float(xs.std(ddof=1))
        qs = tuple(float(q) for q in np.quantile(xs, [0.025, 0.975]))
        loss_se = float(fs.std(ddof=1))
        if convex and cv.sum() >= 10:
            k_lo, k_hi = (float(q) for q in np.quantile(ks[cv], [0.025, 0.975]))
    se = max(se, floor)
    if sigma is not None:
        loss_se = max(loss_se, sigma / math.sqrt(counts[i]))  # the best point's own noise, at least

    ci_low, ci_high = to_value(min(qs[0], xv - 1.96 * floor)), to_value(max(qs[1], xv + 1.96 * floor))
    value = to_value(xv) if convex else float(grid[i])  # not fitted: the grid value itself, unrounded
    censored, bound_low, bound_high = None, None, None
    if edge and grid[i] == all_values[0] and len(all_values) > 1:
        censored, bound_high = "upper", value
        ci_low = 0.0 if log_scale else -math.inf
    elif (edge and grid[i] == all_values[-1]) or capped:
        censored, bound_low = "lower", value
        bound_high = float(above[0]) if capped else None
        ci_high = bound_high if capped else math.inf
        # The optimum could be anywhere up to the diverged value: at least a uniform spread over it.
        if capped:
            gap = math.log(bound_high / value) if log_scale else bound_high - value
            se = max(se, gap / math.sqrt(12))

    return OptimumFit(
        value=value,
        best_grid_value=float(grid[i]),
        best_loss=float(mean[i]),
        fitted_loss=fitted,
        on_edge=bool(edge),
        convex=convex,
        n_points=int(stable_mask.sum()),
        n_diverged=int(div.sum()),
        capped_by_divergence=capped,
        curvature=curv,
        log_se=se,
        ci_low=ci_low,
        ci_high=ci_high,
        censored=censored,
        bound_low=bound_low,
        bound_high=bound_high,
        noise=sigma,
        noise_source=source,
        n_seeds=int(counts[i]),
        se_floor=floor,
        curvature_low=k_lo,
        curvature_high=k_hi,
        loss_se=loss_se if sigma is not None else None,
    )
