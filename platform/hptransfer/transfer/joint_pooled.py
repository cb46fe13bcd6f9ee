"""The joint optimum from a searcher's scattered points, pooled over the widths that µP says share it
(issue 36, item 2; docs/RESEARCH.md, "Optima from scattered points").

Why pool: under µP the optimum of every tuned hyperparameter (in the sweep's own parametrised
coordinates) does not move with width; only the loss level does. A per-width quadratic in k = 4
tunables has 15 coefficients and gets 32 noisy points: at 1% seed noise it is often not convex (a
near-flat direction, e.g. warmup, turns over) and falls back to the best sampled point. Fitting all
widths at once, with a per-width intercept, gives the shared curvature W× the points.

The model, in each tunable's search scale standardised over all ok points (z):

    loss = c_w + bᵀz + ℓ_w·eᵀz + ½ zᵀHz          ℓ_w = log2(w / widest)

`e` is an optional width drift of the vertex (z*(w) = −H⁻¹(b + ℓ_w·e)): µP predicts e = 0, and a
drift the data demand is kept, so the ladder can still show that µP's transfer does not hold. The
candidates (with and without drift, each with a ridge penalty λ on every non-intercept coefficient
from RIDGE) are compared by CV_FOLDS-fold held-out error on the fitted points, and the lowest wins;
the plan says which (`model`, `heldout_rmse`). Fitted points: per width the best POOL_FIT_FRACTION
by loss (the far, steep side of the LR curve toward divergence is not quadratic), with
equal weights (transfer/joint.py's tricube in the loss rank halves the effective sample: on the
synthetic bowl of tests/test_joint_pooled.py it doubled the worst miss).

The vertex is a trust-region one. In the eigenbasis of H, a direction whose curvature moves the loss
by less than the noise σ across the fitted points' spread (½·λ·r² < σ, r² = 3·variance of their
projections: the half-range of a uniform spread) is not resolved: along it the width's best sampled
point (seeds averaged) stays, instead of a vertex the noise placed (a near-flat or negative curvature
would otherwise send it to the box edge); with nothing resolved the estimate is that best point. The resolved ones are solved; a coordinate outside the points'
box is held there (a bound) and the rest re-minimised. A tunable is **undecided** when it lies mostly
along unresolved directions (share ≥ ½) or its bootstrap interval covers UNDECIDED_SPAN of the span
searched: the points do not pin it, and the plan says so instead of quoting a value as an estimate.
The interval: the chosen model refitted on B row-bootstrap resamples (within each width).

Falls back (`joint_optima` then uses the per-width fit of transfer/joint.py and says why) when
there is one width, too few points for the pooled model, or the point nearest the vertex diverged.
Pure: numpy and pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hptransfer.hyperparameters import LOG_SCALE
from hptransfer.transfer.joint import JointFit, joint_optima_by_width
from hptransfer.transfer.optimum import SE_FLOOR_STEPS, OptimumFit

POOL_FIT_FRACTION = 0.75  # per width, the best 3/4 of the ok points are fitted. Assumption (tests/test_joint_pooled.py).
MIN_POINTS_PER_COEF = 2
RIDGE = (0.0, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # λ on standardised coefficients; 0: the plain weighted fit
CV_FOLDS = 5
N_BOOT = 200
UNDECIDED_SPAN = 0.75  # an interval covering ≥ 3/4 of the searched span does not pin the tunable
LACK_OF_FIT = 2.0  # held-out RMSE above 2× the replicates' σ: the quadratic does not describe the points. Assumption.
MISFIT_PREFIX = "the pooled quadratic does not describe the points"
FLAT_SHARE = 0.5  # a tunable whose direction lies ≥ half in unresolved eigendirections is undecided


@dataclass(frozen=True)
class PooledModel:
    drift: bool
    lam: float
    heldout_rmse: float
    candidates: dict[str, float]  # "quadratic, λ=0.01" → held-out RMSE

    def describe(self, widths: list[int]) -> str:
        return (
            f"pooled quadratic over widths {widths} with a loss offset per width"
            + (", a width drift of the optimum" if self.drift else ", no width drift")
            + f", ridge λ={self.lam:g} (lowest {CV_FOLDS}-fold held-out RMSE {self.heldout_rmse:.3g} of "
            f"{len(self.candidates)} candidates)"
        )


def _search_scale(df: pd.DataFrame, tuned: list[str]) -> np.ndarray:
    log = np.array([hp in LOG_SCALE for hp in tuned])
    raw = df[tuned].to_numpy(float)
    return np.where(log, np.log(np.where(log, raw, 1.0)), raw)


def _select(y: np.ndarray, wi: np.ndarray, n_widths: int) -> tuple[np.ndarray, np.ndarray]:
    sel, wts = [], []
    for i in range(n_widths):
        idx = np.flatnonzero(wi == i)
        m = max(math.ceil(POOL_FIT_FRACTION * len(idx)), 1)
        sel.append(idx[np.argsort(y[idx], kind="stable")[:m]])
        wts.append(np.ones(m))
    return np.concatenate(sel), np.concatenate(wts)


def _design(z: np.ndarray, ell: np.ndarray, wi: np.ndarray, n_widths: int, drift: bool) -> np.ndarray:
    k = z.shape[1]
    cols = [(wi == i).astype(float) for i in range(n_widths)] + [z[:, j] for j in range(k)]
    if drift:
        cols += [ell * z[:, j] for j in range(k)]
    cols += [z[:, i] * z[:, j] for i in range(k) for j in range(i, k)]
    return np.column_stack(cols)


def n_coef(k: int, n_widths: int, drift: bool) -> int:
    return n_widths + k * (2 if drift else 1) + k * (k + 1) // 2


def _solve(X: np.ndarray, y: np.ndarray, w: np.ndarray, lam: float, n_widths: int) -> np.ndarray:
    sw = np.sqrt(w)
    Xw, yw = X * sw[:, None], y * sw
    pen = np.r_[np.zeros(n_widths), np.full(X.shape[1] - n_widths, lam * w.sum() / len(w))]
    return np.linalg.lstsq(Xw.T @ Xw + np.diag(pen), Xw.T @ yw, rcond=None)[0]


def _unpack(coef: np.ndarray, k: int, n_widths: int, drift: bool):
    """(c per width, b, e, H) of loss = c_w + bᵀz + ℓ·eᵀz + ½zᵀHz."""
    t = n_widths
    b = coef[t : t + k]
    t += k
    e = np.zeros(k)
    if drift:
        e, t = coef[t : t + k], t + k
    H = np.zeros((k, k))
    for i in range(k):
        for j in range(i, k):
            H[i, j] = H[j, i] = 2 * coef[t] if i == j else coef[t]
            t += 1
    return coef[:n_widths], b, e, H


def choose_model(z, y, wi, ell, n_widths: int, seed: int = 0) -> PooledModel | None:
    """The candidate (drift or not, λ) with the lowest weighted K-fold held-out error; None: too few points."""
    k = z.shape[1]
    sel, w = _select(y, wi, n_widths)
    rng = np.random.default_rng(seed)
    fold = rng.permutation(len(sel)) % CV_FOLDS
    cands: dict[tuple[bool, float], float] = {}
    for drift in (False, True) if n_widths >= 3 else (False,):
        if len(sel) < MIN_POINTS_PER_COEF * n_coef(k, n_widths, drift):
            continue
        X = _design(z[sel], ell[sel], wi[sel], n_widths, drift)
        for lam in RIDGE:
            err = 0.0
            for f in range(CV_FOLDS):
                tr = fold != f
                coef = _solve(X[tr], y[sel][tr], w[tr], lam, n_widths)
                err += float((w[~tr] * (y[sel][~tr] - X[~tr] @ coef) ** 2).sum())
            cands[(drift, lam)] = math.sqrt(err / w.sum())
    if not cands:
        return None
    best = min(cands, key=lambda c: (cands[c], c[0], c[1]))  # ties: no drift, less ridge
    named = {f"{'drift' if d else 'quadratic'}, λ={lam:g}": v for (d, lam), v in cands.items()}
    return PooledModel(drift=best[0], lam=best[1], heldout_rmse=cands[best], candidates=named)


@dataclass(frozen=True)
class _Fit:
    c: np.ndarray
    b: np.ndarray
    e: np.ndarray
    H: np.ndarray
    sigma: float  # weighted residual RMS (dof-corrected)
    centre: np.ndarray  # weighted centre of the fitted points
    spread: np.ndarray  # 3 × their weighted covariance: qᵀ·spread·q is r² along a direction q


def _fit(z, y, wi, ell, n_widths: int, model: PooledModel) -> _Fit:
    k = z.shape[1]
    sel, w = _select(y, wi, n_widths)
    X = _design(z[sel], ell[sel], wi[sel], n_widths, model.drift)
    coef = _solve(X, y[sel], w, model.lam, n_widths)
    c, b, e, H = _unpack(coef, k, n_widths, model.drift)
    resid = y[sel] - X @ coef
    dof = max(len(sel) - X.shape[1], 1)
    sigma = math.sqrt(float((w * resid**2).sum() / w.sum()) * len(sel) / dof)
    centre = (z[sel] * w[:, None]).sum(axis=0) / w.sum()
    d = z[sel] - centre
    spread = 3 * (d * w[:, None]).T @ d / w.sum()
    return _Fit(c, b, e, H, sigma, centre, spread)


def _anchors(z: np.ndarray, y: np.ndarray, wi: np.ndarray, n_widths: int, keys: list) -> list[np.ndarray]:
    """Each width's best point in z (the lowest mean loss over a point's seeds)."""
    out = []
    for i in range(n_widths):
        groups: dict = {}
        for j in np.flatnonzero(wi == i):
            groups.setdefault(keys[j], []).append(j)
        best = min(groups.values(), key=lambda g: float(y[g].mean()))
        out.append(z[best[0]].copy())
    return out


def _trust_vertex(f: _Fit, ell: float, lo: np.ndarray, hi: np.ndarray, anchor: np.ndarray):
    """argmin of (b + ℓe)ᵀz + ½zᵀHz over the resolved eigendirections (along the others the anchor,
    the width's best point, stays), coordinates leaving [lo, hi] held there and the rest re-minimised.
    Returns (z, held, flat share)."""
    k = len(f.b)
    g = f.b + ell * f.e
    held: dict[int, str] = {}
    z = anchor.copy()
    share = np.zeros(k)
    for _ in range(k + 1):
        free = np.array([j for j in range(k) if j not in held], int)
        fixed = np.array(sorted(held), int)
        z = z.copy()
        z[fixed] = [lo[j] if held[j] == "low" else hi[j] for j in fixed]
        if len(free):
            Hs = f.H[np.ix_(free, free)]
            gs = g[free] + (f.H[np.ix_(free, fixed)] @ z[fixed] if len(fixed) else 0.0)
            lam, Q = np.linalg.eigh(Hs)
            r2 = np.einsum("ia,ij,ja->a", Q, f.spread[np.ix_(free, free)], Q)  # the points' reach along each direction
            resolved = 0.5 * lam * r2 >= f.sigma
            y = Q.T @ anchor[free]
            a = Q.T @ gs
            y = np.where(resolved, -a / np.where(resolved, lam, 1.0), y)
            z[free] = Q @ y
            share[free] = (Q[:, ~resolved] ** 2).sum(axis=1)
        out = {j: ("low" if z[j] < lo[j] else "high") for j in free if not lo[j] <= z[j] <= hi[j]}
        if not out:
            break
        held.update(out)
    return z, held, share


def joint_optima(
    results: pd.DataFrame, tuned: list[str], pool: bool = True, n_boot: int = N_BOOT
) -> dict[int, dict[str, OptimumFit]]:
    """Scattered points' optima per width: pooled over the widths when `pool` (µP) and possible, else
    transfer/joint.py's per-width fit (each width then says why it was not pooled)."""
    why, misfit = None, False
    if pool:
        pooled, why = pooled_optima(results, tuned, n_boot=n_boot)
        if pooled is not None:
            return pooled
        misfit = why.startswith(MISFIT_PREFIX)
    return joint_optima_by_width(results, tuned, n_boot=n_boot, not_pooled=why, best_point=misfit)


def _replicate_noise(ok: pd.DataFrame, tuned: list[str], y: np.ndarray) -> float | None:
    """σ per trial from seed replicates (the same point at the same width); None without any."""
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(ok["width"].astype(int), *(ok[hp].astype(float) for hp in tuned))):
        groups.setdefault(key, []).append(i)
    dof = sum(len(g) - 1 for g in groups.values())
    if dof == 0:
        return None
    return math.sqrt(sum(float(((y[g] - y[g].mean()) ** 2).sum()) for g in groups.values()) / dof)


def pooled_optima(results: pd.DataFrame, tuned: list[str], n_boot: int = N_BOOT, seed: int = 0):
    """Per width, per tuned hyperparameter, an `OptimumFit` from the pooled fit; (None, why) when it
    cannot be made (the caller falls back to the per-width fit)."""
    status = results["status"].astype(str).str.lower()
    loss = results["val_loss"].astype(float)
    ok_mask = (status == "ok") & np.isfinite(loss)
    div_mask = (status == "diverged") | ((status == "ok") & ~np.isfinite(loss))
    ok = results[ok_mask].reset_index(drop=True)
    widths = sorted(int(w) for w in ok["width"].unique())
    if len(widths) < 2:
        return None, "one width with ok trials: nothing to pool"
    k = len(tuned)
    log = np.array([hp in LOG_SCALE for hp in tuned])
    x = _search_scale(ok, tuned)
    centre_x, scale = x.mean(axis=0), x.std(axis=0)
    if not (scale > 0).all():
        return None, "a tuned hyperparameter took one value: a joint fit needs every one to vary"
    z = (x - centre_x) / scale
    y = ok["val_loss"].to_numpy(float)
    wi = np.searchsorted(widths, ok["width"].to_numpy(int))
    ell_w = np.log2(np.array(widths, float) / max(widths))
    ell = ell_w[wi]
    model = choose_model(z, y, wi, ell, len(widths), seed=seed)
    if model is None:
        return None, (
            f"too few points to pool: {len(y)} ok trials over {len(widths)} widths, the pooled quadratic in {k} "
            f"hyperparameters has {n_coef(k, len(widths), False)} coefficients and needs ≥ "
            f"{MIN_POINTS_PER_COEF * n_coef(k, len(widths), False)} fitted points"
        )
    sigma_rep = _replicate_noise(ok, tuned, y)
    if sigma_rep is not None and model.heldout_rmse > LACK_OF_FIT * sigma_rep:
        return None, (
            f"{MISFIT_PREFIX}: its held-out error {model.heldout_rmse:.3g} is {model.heldout_rmse / sigma_rep:.1f}× the seed "
            f"noise {sigma_rep:.3g} (replicates), more than {LACK_OF_FIT:g}×, so its vertex is not an estimate; the best "
            "sampled point (seeds averaged) is used"
        )
    fit = _fit(z, y, wi, ell, len(widths), model)
    lo, hi = z.min(axis=0), z.max(axis=0)
    keys = [(int(wv), *r) for wv, r in zip(ok["width"], ok[tuned].to_numpy(float).tolist())]
    anchors = _anchors(z, y, wi, len(widths), keys)
    verts = {w: _trust_vertex(fit, ell_w[i], lo, hi, anchors[i]) for i, w in enumerate(widths)}

    div = results[div_mask]
    if len(div):
        zd = (_search_scale(div, tuned) - centre_x) / scale
        for w, (zv, _, _) in verts.items():
            mine = div["width"].to_numpy(int) == w
            if mine.any():
                d_ok = np.linalg.norm(z[wi == widths.index(w)] - zv, axis=1).min()
                if np.linalg.norm(zd[mine] - zv, axis=1).min() < d_ok:
                    return None, f"width {w}: the point nearest the pooled vertex diverged (the fit reached the unstable region)"

    # Bootstrap: rows resampled within each width, the chosen model refitted.
    rng = np.random.default_rng(seed)
    boots = {w: [] for w in widths}
    by_w = [np.flatnonzero(wi == i) for i in range(len(widths))]
    for _ in range(n_boot):
        idx = np.concatenate([rng.choice(ix, len(ix)) for ix in by_w])
        try:
            fb = _fit(z[idx], y[idx], wi[idx], ell[idx], len(widths), model)
        except np.linalg.LinAlgError:
            continue
        anc = _anchors(z[idx], y[idx], wi[idx], len(widths), [keys[i] for i in idx])
        for i, w in enumerate(widths):
            boots[w].append(_trust_vertex(fb, ell_w[i], lo, hi, anc[i])[0])

    # σ per trial: seed replicates at repeated points, else the pooled residuals.
    if sigma_rep is not None:
        sigma, source = sigma_rep, "seed replicates"
    else:
        sigma, source = fit.sigma, "quadratic residuals"

    x_all = np.vstack([x, _search_scale(div, tuned)]) if len(div) else x
    span = x_all.max(axis=0) - x_all.min(axis=0)
    steps = span / max(len(y) ** (1 / k) - 1, 1.0)
    H_x = fit.H / np.outer(scale, scale)
    # The drift the model found, as the vertex moves per doubling of width (trust region included:
    # an unresolved direction does not move, whatever H⁻¹e says there).
    drift = None
    if model.drift:
        a = anchors[-1]
        step = (_trust_vertex(fit, 0.0, lo, hi, a)[0] - _trust_vertex(fit, -1.0, lo, hi, a)[0]) * scale
        drift = {hp: float(d) for hp, d in zip(tuned, step)}
    coupling = {
        f"{tuned[a]}|{tuned[b]}": float(-H_x[a, b] / math.sqrt(H_x[a, a] * H_x[b, b]))
        for a in range(k)
        for b in range(a + 1, k)
        if H_x[a, a] > 0 and H_x[b, b] > 0
    }
    eig_x = np.linalg.eigvalsh(H_x)
    out, why_none = {}, None
    for i, w in enumerate(widths):
        zv, held, share = verts[w]
        xv = centre_x + zv * scale
        xs = centre_x + np.array(boots[w]).reshape(-1, k) * scale
        mine = np.flatnonzero(wi == i)
        gw: dict[tuple, list[int]] = {}
        for j in mine:
            gw.setdefault(keys[j], []).append(j)
        means = {key: float(y[g].mean()) for key, g in gw.items()}
        best_key = min(means, key=means.get)
        best_idx = gw[best_key][0]
        g_w = fit.b + ell_w[i] * fit.e
        fitted = float(fit.c[i] + g_w @ zv + 0.5 * zv @ fit.H @ zv)
        corr = {}
        for a in range(k):
            for b in range(a + 1, k):
                if len(xs) > 2 and xs[:, a].std() > 0 and xs[:, b].std() > 0:
                    corr[f"{tuned[a]}|{tuned[b]}"] = float(np.corrcoef(xs[:, a], xs[:, b])[0, 1])
        undecided = []
        per = {}
        for j, hp in enumerate(tuned):
            to_value = math.exp if log[j] else float
            q = np.quantile(xs[:, j], [0.025, 0.975]) if len(xs) else np.array([xv[j], xv[j]])
            floor = SE_FLOOR_STEPS * float(steps[j])
            if share[j] >= FLAT_SHARE or (q[1] - q[0]) >= UNDECIDED_SPAN * span[j]:
                undecided.append(hp)
            side = held.get(j)
            censored = {"low": "upper", "high": "lower"}.get(side)
            value = to_value(float(xv[j]))
            ci_low, ci_high = to_value(min(q[0], xv[j] - 1.96 * floor)), to_value(max(q[1], xv[j] + 1.96 * floor))
            if censored == "upper":
                ci_low = 0.0 if log[j] else -math.inf
            elif censored == "lower":
                ci_high = math.inf
            per[hp] = dict(
                value=value,
                best_grid_value=float(ok[hp].iloc[best_idx]),
                on_edge=side is not None,
                censored=censored,
                ci_low=ci_low,
                ci_high=ci_high,
                log_se=max(float(xs[:, j].std(ddof=1)) if len(xs) > 1 else 0.0, floor),
                se_floor=floor,
                curvature=0.5 * float(H_x[j, j]),
            )
        joint = JointFit(
            hyperparameters=tuple(tuned),
            value={hp: per[hp]["value"] for hp in tuned},
            fitted_loss=fitted,
            best_loss=means[best_key],
            hessian=H_x.tolist() if eig_x.min() > 0 else None,
            coupling=coupling,
            optimum_correlation=corr,
            n_points=len(mine),
            n_fit=int(math.ceil(POOL_FIT_FRACTION * len(mine))),
            n_diverged=int((div["width"].to_numpy(int) == w).sum()) if len(div) else 0,
            n_boot=len(xs),
            n_boot_convex=len(xs),
            convex=True,
            fallback=None,
            held={tuned[j]: s for j, s in held.items()},
            noise=sigma,
            noise_source=source,
            model=model.describe(widths),
            heldout_rmse=model.heldout_rmse,
            pooled_widths=list(widths),
            undecided=undecided or None,
            drift=drift,
        )
        out[w] = {
            hp: OptimumFit(
                best_loss=means[best_key],
                fitted_loss=fitted,
                convex=True,
                n_points=len(mine),
                n_diverged=joint.n_diverged,
                noise=sigma,
                noise_source=source,
                n_seeds=len(gw[best_key]),
                loss_se=sigma / math.sqrt(len(gw[best_key])),
                bound_low=p["value"] if p["censored"] == "lower" else None,
                bound_high=p["value"] if p["censored"] == "upper" else None,
                undecided=hp in undecided,
                joint=joint,
                **p,
            )
            for hp, p in per.items()
        }
    return out, why_none
