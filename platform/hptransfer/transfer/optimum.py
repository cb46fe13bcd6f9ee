"""Per-width optimum of a hyperparameter from grid evidence, with a bootstrap uncertainty.

Loss is close to quadratic in log(ν) near its minimum (the µTransfer plots of Tensor Programs V;
paper 2, Ghosh et al. arXiv 2512.22768, fits the same form). We average loss over seeds at each grid
value, take the best grid point and fit a parabola in log ν through it and up to two neighbours
each side; the vertex is the optimum, and the parabola's curvature κ (loss per (log ν)²) prices a
miss: transferring ν instead of ν* costs ≈ κ·(log ν − log ν*)² (paper 2: c_n = Θ(b_n²)).

Diverged trials are information, not noise: a grid value where any trial diverged is "too high"
(the run sits at the edge of stability). It is kept out of the loss average — a surviving seed's
loss would understate it — and, when it lies just above the best stable value, it caps the
optimum there instead of letting the fit move past it. Failed trials (crashes) carry no
information and are dropped.

An optimum on the edge of the grid is returned as the grid value and flagged: it means the grid must
be extended, not that we know the optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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
    log_se: float | None = None  # bootstrap std of x* = log ν* (or ν* when linear)
    ci_low: float | None = None  # 2.5% / 97.5% bootstrap quantiles of ν*
    ci_high: float | None = None


LOCAL_WINDOW = 1.2  # log-units (×3.3): a quadratic is a local model; farther out the LR curve is
# visibly asymmetric (steep toward divergence), so farther points bias the vertex.


def _vertex(x: np.ndarray, mean: np.ndarray, capped: bool, window: float) -> tuple[float, float, bool, float | None, int]:
    """(x*, fitted loss, convex, curvature, index of best) from stable grid points sorted by x.
    Fits the best point, its immediate neighbours, and the next ones if within `window` of it."""
    i = int(np.argmin(mean))
    if len(x) < 3 or (i == len(x) - 1 and not capped) or i == 0:
        return float(x[i]), float(mean[i]), False, None, i
    idx = [j for j in range(max(0, i - 2), min(len(x), i + 3)) if abs(j - i) <= 1 or abs(x[j] - x[i]) <= window]
    a, b, c = np.polyfit(x[idx], mean[idx], 2)
    if a <= 0:
        return float(x[i]), float(mean[i]), False, None, i
    # The vertex moves only within the neighbours: a fit never extrapolates past the evidence, and
    # never past a value that diverged.
    upper = x[i] if i == len(x) - 1 else x[i + 1]
    xv = float(np.clip(-b / (2 * a), x[i - 1], upper))
    return xv, float(np.polyval([a, b, c], xv)), True, float(a), i


def fit_optimum(values, losses, log_scale: bool = True, diverged=None, n_boot: int = 200,
                seed: int = 0) -> OptimumFit:
    """values, losses: one entry per trial (seeds pooled).

    diverged: per-trial flags; None means "every non-finite loss diverged". A non-finite loss that
    is not flagged diverged is a failure and is ignored."""
    values, losses = np.asarray(values, float), np.asarray(losses, float)
    div = ~np.isfinite(losses) if diverged is None else np.asarray(diverged, bool)
    finite = np.isfinite(losses) & ~div
    if not finite.any():
        raise ValueError("no trial with a finite loss: every grid point diverged or failed")
    unstable = np.unique(values[div])
    stable_mask = finite & ~np.isin(values, unstable)
    if not stable_mask.any():
        raise ValueError("every grid value had at least one diverged trial; lower the grid")
    grid = np.unique(values[stable_mask])
    all_values = np.unique(np.concatenate([grid, unstable]))
    groups = [losses[stable_mask & (values == v)] for v in grid]
    mean = np.array([g.mean() for g in groups])
    x = np.log(grid) if log_scale else grid
    i = int(np.argmin(mean))
    above = all_values[all_values > grid[i]]
    capped = bool(len(above) and above[0] in unstable)
    edge = grid[i] == all_values[0] or grid[i] == all_values[-1]
    window = LOCAL_WINDOW if log_scale else np.inf
    xv, fitted, convex, curv, _ = _vertex(x, mean, capped, window)
    to_value = (lambda t: math.exp(t)) if log_scale else (lambda t: t)

    se = lo_q = hi_q = None
    if n_boot > 0 and any(len(g) > 1 for g in groups) and not edge:
        # Resample trials (seeds) within each grid value: the spread of x* is the seed noise.
        rng = np.random.default_rng(seed)
        xs = np.empty(n_boot)
        for b in range(n_boot):
            m = np.array([rng.choice(g, len(g)).mean() for g in groups])
            xs[b] = _vertex(x, m, capped, window)[0]
        se = float(xs.std(ddof=1))
        lo_q, hi_q = (to_value(float(q)) for q in np.quantile(xs, [0.025, 0.975]))

    # Not fitted: return the grid value itself, not exp(log(value)) with its rounding.
    return OptimumFit(
        value=to_value(xv) if convex else float(grid[i]), best_grid_value=float(grid[i]),
        best_loss=float(mean[i]), fitted_loss=fitted,
        on_edge=bool(edge), convex=convex, n_points=int(stable_mask.sum()), n_diverged=int(div.sum()),
        capped_by_divergence=capped, curvature=curv, log_se=se, ci_low=lo_q, ci_high=hi_q,
    )
