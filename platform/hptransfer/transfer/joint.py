"""The joint optimum of several tuned hyperparameters from points that are not a grid (any searcher's
table): a local quadratic, full with cross terms, in each hyperparameter's search scale, fitted to
the best points, with a bootstrap over rows for its interval (docs/RESEARCH.md, "Optima from
scattered points").

Why not coordinate slices: with two correlated hyperparameters (the LR and the readout multiplier
trade off: a larger `output_mult` wants a smaller LR) the loss is a tilted bowl. A slice through the
best grid point finds the minimum *along that slice*, which sits off the joint optimum by
(H_uv/H_uu)·Δv, Δv the other coordinate's miss (up to half its grid step). The full quadratic
recovers the vertex wherever the points are.

Estimator, per width (x_j = log ν_j for a log-scale tunable, ν_j otherwise: `Hyperparameters`):
1. standardise each x_j by its spread over the width's ok points (a well-conditioned design);
2. keep the best points: the n_fit lowest losses, n_fit = max(MIN_POINTS_PER_COEF·p, ⌈FIT_FRACTION·n⌉),
   p = 1 + k + k(k+1)/2 coefficients: a quadratic is a local model, and the far, steep side of the
   LR curve (toward divergence) is not quadratic;
3. weighted least squares of loss = c + bᵀz + zᵀAz, weights tricube in the loss rank (LOESS's kernel,
   on rank so the loss scale does not matter): the best points weigh most;
4. the vertex z* = −H⁻¹b, H = 2A, when H is positive definite; a vertex outside the points' box is
   held at the box on that coordinate and the others re-minimised (an active set), and the held
   hyperparameter's optimum is a bound (censored), as a grid edge is;
5. the interval: the whole of 1–4 redone on B row-bootstrap resamples (a resample whose quadratic is
   not convex contributes its best point, as the estimate would): the spread of x*_j is its standard
   error, floored at SE_FLOOR_STEPS of the step an equal-count grid would have.
Falls back to the best point (lowest loss, seeds averaged at one point), with the reason, when there
are too few points, when the quadratic is not convex (a ridge or saddle: the points do not bracket a
minimum in every direction), or when the point nearest the vertex diverged (the fit ran into the
unstable region). Pure: numpy and pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from hptransfer.hyperparameters import LOG_SCALE
from hptransfer.transfer.optimum import SE_FLOOR_STEPS, OptimumFit

FIT_FRACTION = 0.5  # share of the ok points the quadratic is fitted to (the best ones). Assumption.
MIN_POINTS_PER_COEF = 2  # at least this many points per coefficient of the full quadratic. Assumption.
N_BOOT = 200
GRID_FILL = 0.5  # a width whose distinct points fill ≥ half the product of its per-hyperparameter values is a grid


def is_grid(results: pd.DataFrame, tuned: list[str]) -> bool:
    """True when every width's points lie on a (product) grid of its values: distinct points ≥
    GRID_FILL × Π_j (distinct values of hyperparameter j). A grid with holes (dropped or missing
    trials) stays a grid; scattered points (each with its own values) fill ~n/n^k of the product.
    One tuned hyperparameter: a grid when its values recur across widths or are evenly spaced in its
    search scale (holes allowed) at every width (`_grid_1d`); a searcher's values do neither. Every
    row counts, whatever its status: the design, not the outcome, decides."""
    if len(tuned) == 1:
        return _grid_1d(results, tuned[0])
    for _, g in results.groupby("width"):
        distinct = len(g[tuned].drop_duplicates())
        product = math.prod(g[hp].nunique() for hp in tuned)
        if distinct < GRID_FILL * product:
            return False
    return True


SPACING_TOLERANCE = 0.03  # a gap within 3% of 1, 2 or 3 grid steps is a grid's (with holes)


def _grid_1d(results: pd.DataFrame, hp: str) -> bool:
    """One hyperparameter's values form a grid: at every width, half or more of its distinct values
    recur at another width (one grid, run at each width), or they are evenly spaced in the search
    scale up to holes of two missing values (a grid of its own per width)."""
    values = {int(w): set(pd.to_numeric(g[hp]).astype(float)) for w, g in results.groupby("width")}
    log = hp in LOG_SCALE
    for w, mine in values.items():
        others = set().union(*(v for o, v in values.items() if o != w))
        if len(mine) <= 2 or len(mine & others) >= len(mine) / 2:
            continue
        x = np.sort(np.log(list(mine)) if log else np.array(list(mine)))
        gaps = np.diff(x) / np.diff(x).min()
        if not np.all((np.abs(gaps - np.round(gaps)) <= SPACING_TOLERANCE * np.round(gaps)) & (np.round(gaps) <= 3)):
            return False
    return True


@dataclass(frozen=True)
class JointFit:
    """One width's joint fit, shared by its per-hyperparameter `OptimumFit`s (`.joint`)."""

    hyperparameters: tuple[str, ...]
    value: dict[str, float]  # the optimum ν* of each (the best point's values on a fallback)
    fitted_loss: float
    best_loss: float
    hessian: list[list[float]] | None  # ∂²loss/∂x_i∂x_j in the search scale (x = log ν or ν)
    coupling: dict[str, float]  # "a|b": −H_ab/√(H_aa·H_bb), the tilt of the bowl (0: slices are unbiased)
    optimum_correlation: dict[str, float]  # "a|b": correlation of x*_a and x*_b over the bootstrap
    n_points: int
    n_fit: int
    n_diverged: int
    n_boot: int
    n_boot_convex: int
    convex: bool
    fallback: str | None  # why the best point was used instead of the vertex; None: the vertex
    held: dict[str, str]  # hyperparameter → "low" / "high": the vertex lay outside the points' box there
    noise: float | None
    noise_source: str
    # The pooled fit (transfer/joint_pooled.py); None on a per-width fit.
    model: str | None = None  # which model, chosen by held-out error
    heldout_rmse: float | None = None
    pooled_widths: list[int] | None = None
    undecided: list[str] | None = None  # tunables the points do not pin
    drift: dict[str, float | None] | None = None  # dx*/d log2(width) in the search scale, when modelled


def _n_coef(k: int) -> int:
    return 1 + k + k * (k + 1) // 2


def _design(z: np.ndarray) -> np.ndarray:
    k = z.shape[1]
    cols = [np.ones(len(z)), *(z[:, j] for j in range(k))]
    cols += [z[:, i] * z[:, j] for i in range(k) for j in range(i, k)]
    return np.column_stack(cols)


def _unpack(coef: np.ndarray, k: int) -> tuple[float, np.ndarray, np.ndarray]:
    """(c, b, H) of loss = c + bᵀz + ½zᵀHz from the design's coefficients."""
    c, b = float(coef[0]), coef[1 : 1 + k]
    H, t = np.zeros((k, k)), 1 + k
    for i in range(k):
        for j in range(i, k):
            H[i, j] = H[j, i] = 2 * coef[t] if i == j else coef[t]
            t += 1
    return c, b, H


def _vertex(b: np.ndarray, H: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, dict[int, str]]:
    """argmin of bᵀz + ½zᵀHz (H positive definite) within the box [lo, hi]: coordinates whose free
    vertex leaves the box are held at the bound and the rest re-minimised, until none leaves."""
    k, held = len(b), {}
    z = np.linalg.solve(H, -b)
    for _ in range(k):
        out = {j: ("low" if z[j] < lo[j] else "high") for j in range(k) if j not in held and not lo[j] <= z[j] <= hi[j]}
        if not out:
            break
        held.update(out)
        fixed = np.array(sorted(held))
        free = np.array([j for j in range(k) if j not in held], int)
        z = z.copy()
        z[fixed] = [lo[j] if held[j] == "low" else hi[j] for j in fixed]
        if len(free):
            z[free] = np.linalg.solve(H[np.ix_(free, free)], -(b[free] + H[np.ix_(free, fixed)] @ z[fixed]))
    return z, held


@dataclass(frozen=True)
class _Core:
    z: np.ndarray  # the vertex (or the best point), standardised
    fitted: float
    H: np.ndarray | None
    convex: bool
    held: dict[int, str]
    n_fit: int
    resid: np.ndarray | None


def _fit(z: np.ndarray, y: np.ndarray) -> _Core:
    """Steps 2–4 of the module docstring on standardised points; the best point when not convex
    or too few points (the caller names why)."""
    n, k = z.shape
    p = _n_coef(k)
    best = int(np.argmin(y))
    if n < MIN_POINTS_PER_COEF * p:
        return _Core(z[best], float(y[best]), None, False, {}, n, None)
    n_fit = min(n, max(MIN_POINTS_PER_COEF * p, math.ceil(FIT_FRACTION * n)))
    sel = np.argsort(y, kind="stable")[:n_fit]
    w = (1 - (np.arange(n_fit) / n_fit) ** 3) ** 3  # tricube in the loss rank
    X = _design(z[sel])
    coef, *_ = np.linalg.lstsq(X * np.sqrt(w)[:, None], y[sel] * np.sqrt(w), rcond=None)
    c, b, H = _unpack(coef, k)
    eig = np.linalg.eigvalsh(H)
    if not eig.min() > 1e-9 * max(abs(eig).max(), 1e-300):
        return _Core(z[best], float(y[best]), H, False, {}, n_fit, None)
    v, held = _vertex(b, H, z.min(axis=0), z.max(axis=0))
    fitted = c + float(b @ v) + 0.5 * float(v @ H @ v)
    return _Core(v, fitted, H, True, held, n_fit, y[sel] - X @ coef)


def joint_optimum(
    points: pd.DataFrame,
    tuned: list[str],
    diverged: pd.DataFrame | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
    best_point: str | None = None,
) -> dict[str, OptimumFit]:
    """One width's joint optimum. points: its ok trials (columns `tuned` and `val_loss`, finite);
    diverged: its diverged trials (columns `tuned`), which cap the fit. `best_point`: a reason to
    take the best point whatever the fit says (a quadratic shown not to describe the points).
    Returns an `OptimumFit` per
    tuned hyperparameter, each carrying the shared `JointFit` as `.joint`."""
    k = len(tuned)
    log = np.array([hp in LOG_SCALE for hp in tuned])
    raw = points[tuned].to_numpy(float)
    x = np.where(log, np.log(np.where(log, raw, 1.0)), raw)
    y = points["val_loss"].to_numpy(float)
    n = len(y)
    div_raw = np.empty((0, k)) if diverged is None or diverged.empty else diverged[tuned].to_numpy(float)
    x_div = np.where(log, np.log(np.where(log, div_raw, 1.0)), div_raw)
    centre = x.mean(axis=0)
    spread = x.std(axis=0)
    flat = [hp for hp, s in zip(tuned, spread) if not s > 0]
    scale = np.where(spread > 0, spread, 1.0)
    z = (x - centre) / scale

    # Seeds averaged at a repeated point: the best point is the best mean, and the replicates give σ.
    keys = [tuple(r) for r in raw]
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    means = {key: float(y[idx].mean()) for key, idx in groups.items()}
    best_key = min(means, key=means.get)
    best_idx = groups[best_key][0]
    dof = sum(len(idx) - 1 for idx in groups.values())
    p = _n_coef(k)

    core = _fit(z, y) if not flat else _Core(z[best_idx], means[best_key], None, False, {}, n, None)
    fallback = None
    if flat:
        fallback = f"{', '.join(flat)} took one value here: a joint fit needs every tuned hyperparameter to vary"
    elif core.H is None:
        fallback = (
            f"too few points: {n} ok trials, a full quadratic in {k} hyperparameters has {p} coefficients "
            f"and needs ≥ {MIN_POINTS_PER_COEF * p}"
        )
    elif not core.convex:
        eig = np.linalg.eigvalsh(core.H / np.outer(scale, scale))
        fallback = (
            f"the fitted quadratic is not convex (Hessian eigenvalues {np.array2string(eig, precision=3)} in the "
            "search scale): the points do not bracket a minimum in every direction"
        )
    capped = False
    if core.convex and len(x_div):
        zd = (x_div - centre) / scale
        d_ok, d_div = np.linalg.norm(z - core.z, axis=1).min(), np.linalg.norm(zd - core.z, axis=1).min()
        if d_div < d_ok:
            capped = True
            fallback = "the point nearest the fitted vertex diverged: the fit reached into the unstable region"
    if best_point:
        fallback = best_point
    use_vertex = core.convex and not capped and not best_point
    z_hat = core.z if use_vertex else z[best_idx]
    fitted = core.fitted if use_vertex else means[best_key]
    held = core.held if use_vertex else {}
    # Held at an edge beyond which trials diverged: the optimum is at the edge of stability (a bound, as
    # a grid value capped by the next one up diverging), not outside the search box.
    for j, side in held.items():
        beyond = x_div[:, j] > x[:, j].max() if side == "high" else x_div[:, j] < x[:, j].min()
        capped = capped or bool(beyond.any())

    # Bootstrap over rows: the whole estimator again, a non-convex resample giving its best point.
    rng = np.random.default_rng(seed)
    zs, fs, hs = [], [], []
    if not flat:
        for _ in range(n_boot):
            i = rng.integers(0, n, n)
            c = _fit(z[i], y[i])
            zs.append(c.z)
            fs.append(c.fitted)
            if c.convex:
                hs.append(np.diag(c.H))
    zs = np.array(zs).reshape(-1, k)
    xs = centre + zs * scale
    x_hat = centre + z_hat * scale

    # σ per trial: seed replicates at repeated points, else the fit's residuals (misfit counts as noise).
    if dof > 0:
        sigma = math.sqrt(sum(((y[idx] - y[idx].mean()) ** 2).sum() for idx in groups.values()) / dof)
        source = "seed replicates"
    elif core.resid is not None and core.n_fit > p:
        sigma, source = float(math.sqrt((core.resid**2).sum() / (core.n_fit - p))), "quadratic residuals"
    else:
        sigma, source = None, "none"

    x_all = np.vstack([x, x_div]) if len(x_div) else x
    span = x_all.max(axis=0) - x_all.min(axis=0)
    steps = span / max(n ** (1 / k) - 1, 1.0)  # the step of a grid with as many points
    H_x = core.H / np.outer(scale, scale) if core.convex else None
    coupling, corr = {}, {}
    for a in range(k):
        for b_ in range(a + 1, k):
            key = f"{tuned[a]}|{tuned[b_]}"
            if H_x is not None:
                coupling[key] = float(-H_x[a, b_] / math.sqrt(H_x[a, a] * H_x[b_, b_]))
            if len(xs) > 2 and xs[:, a].std() > 0 and xs[:, b_].std() > 0:
                corr[key] = float(np.corrcoef(xs[:, a], xs[:, b_])[0, 1])
    # A fallback reports the best point's own values (unrounded by the log round trip).
    values = [float(math.exp(x_hat[j]) if log[j] else x_hat[j]) if use_vertex else float(raw[best_idx, j]) for j in range(k)]
    joint = JointFit(
        hyperparameters=tuple(tuned),
        value=dict(zip(tuned, values)),
        fitted_loss=float(fitted),
        best_loss=means[best_key],
        hessian=H_x.tolist() if H_x is not None else None,
        coupling=coupling,
        optimum_correlation=corr,
        n_points=n,
        n_fit=core.n_fit,
        n_diverged=len(x_div),
        n_boot=len(xs),
        n_boot_convex=len(hs),
        convex=bool(use_vertex),
        fallback=fallback,
        held={tuned[j]: s for j, s in held.items()},
        noise=sigma,
        noise_source=source,
    )
    loss_se = float(np.std(fs, ddof=1)) if len(fs) > 1 else 0.0
    if sigma is not None:
        loss_se = max(loss_se, sigma / math.sqrt(len(groups[best_key])))
    out = {}
    for j, hp in enumerate(tuned):
        to_value = math.exp if log[j] else float
        floor = SE_FLOOR_STEPS * float(steps[j])
        se = max(float(xs[:, j].std(ddof=1)) if len(xs) > 1 else 0.0, floor)
        q = np.quantile(xs[:, j], [0.025, 0.975]) if len(xs) else (x_hat[j], x_hat[j])
        ci_low, ci_high = to_value(min(q[0], x_hat[j] - 1.96 * floor)), to_value(max(q[1], x_hat[j] + 1.96 * floor))
        # A bound, not a point: the vertex held at the box edge, or a fallback best point on it.
        side = held.get(j)
        if side is None and not use_vertex and not flat:
            side = "low" if x_hat[j] <= x[:, j].min() else "high" if x_hat[j] >= x[:, j].max() else None
        censored = {"low": "upper", "high": "lower"}.get(side)
        value = values[j]
        if censored == "upper":
            ci_low = 0.0 if log[j] else -math.inf
        elif censored == "lower":
            ci_high = math.inf
        kappa = 0.5 * H_x[j, j] if H_x is not None else None
        k_lo = k_hi = None
        if H_x is not None and len(hs) >= 10:
            k_lo, k_hi = (float(v) for v in np.quantile(0.5 * np.array(hs)[:, j] / scale[j] ** 2, [0.025, 0.975]))
        out[hp] = OptimumFit(
            value=value,
            best_grid_value=float(raw[best_idx, j]),
            best_loss=means[best_key],
            fitted_loss=float(fitted),
            on_edge=side is not None,
            convex=bool(use_vertex),
            n_points=n,
            n_diverged=len(x_div),
            capped_by_divergence=capped,
            curvature=kappa,
            log_se=se,
            ci_low=ci_low,
            ci_high=ci_high,
            censored=censored,
            bound_low=value if censored == "lower" else None,
            bound_high=value if censored == "upper" else None,
            noise=sigma,
            noise_source=source,
            n_seeds=len(groups[best_key]),
            se_floor=floor,
            curvature_low=k_lo,
            curvature_high=k_hi,
            loss_se=loss_se if sigma is not None else None,
            joint=joint,
        )
    return out


def joint_optima_by_width(
    results: pd.DataFrame,
    tuned: list[str],
    n_boot: int = N_BOOT,
    not_pooled: str | None = None,
    best_point: bool = False,
) -> dict[int, dict[str, OptimumFit]]:
    """`engine.optima_by_width` for a table that is not a grid: the joint optimum per width (ok
    trials with a finite loss fit it; diverged ones cap it; stopped and failed ones are left out).
    Widths without one finite ok loss are skipped. `not_pooled`: why the pooled fit over widths
    (transfer/joint_pooled.py), when asked for, could not be made; each width's `fallback` says it.
    `best_point`: that reason rules out a quadratic here too (it did not describe the points): each
    width takes its best point."""
    why = not_pooled
    out: dict[int, dict[str, OptimumFit]] = {}
    status = results["status"].astype(str).str.lower()
    loss = results["val_loss"].astype(float)
    ok = (status == "ok") & np.isfinite(loss)
    div = (status == "diverged") | ((status == "ok") & ~np.isfinite(loss))
    for width, g in results.groupby("width"):
        good = g[ok.loc[g.index]]
        if good.empty:
            continue
        out[int(width)] = joint_optimum(
            good, tuned, g[div.loc[g.index]], n_boot=n_boot, seed=int(width), best_point=why if best_point else None
        )
    if why and not best_point:  # the pooled fit was asked for and not made: each width says so, beside its own fallback
        for per in out.values():
            j = next(iter(per.values())).joint
            note = f"not pooled over widths ({why}); fitted per width" + (f": {j.fallback}" if j.fallback else "")
            jj = replace(j, fallback=note)
            for hp, f in per.items():
                per[hp] = replace(f, joint=jj)
    return out
