"""Transfer across training length, batch size and depth: per-axis laws of the optimum LR, composed
with the width rule (issue 23; docs/RESEARCH.md, "Beyond width").

The ladder varies width at one (steps, batch_size, depth), its *base point*. Arms of the sweep vary
one of those at one width, the others at the base point, each with the LR grid. Per axis a, the
optima ν*(v) at its values v give a log-log law

    log ν*(v) = c + b_a·log v        (fitting.fit_log_linear_censored: grid-edge optima as bounds)

and the target's LR is the width rule's (at the base point) times each axis's move from the base
value to the target's:  η*(target) = η_width · Π_a (v_target / v_base)^b_a.
Assumption: the axes act independently (no interaction terms), as Bjorck et al.'s
LR*(N, D) = C·N^−α·D^−β (arXiv 2409.19913) and the √B rule assume.

What an axis gets, by how many of its values the table has:
- 1 (the base alone): "cannot tell": the documented prior exponent (PRIORS, with its source) and a
  warning when the target differs from the base;
- 2: the two-point slope, "undecided" (no residual freedom to check the law: as the width verdicts);
- 3 or more: "fitted", with the slope's 95% interval; a fit whose interval is wider than the prior's
  range says less than the prior and is replaced by it (kept on record as exponent_fitted), said as such.
Pure: numpy, pandas and the fitting helpers.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hptransfer.transfer.fitting import fit_log_linear_censored, interval_quantile, normal_quantile
from hptransfer.transfer.priors import PRIORS, Prior  # noqa: F401  (Prior: re-exported)

AXES = ("steps", "batch_size", "depth")
LABEL = {"steps": "horizon (steps)", "batch_size": "batch size", "depth": "depth"}


# The prior exponents (partials at fixed N and the arm's held quantity: transfer/priors.py, with
# their derivations), used when the ladder has one value of an axis and as the reference a fit is
# shown against.
# Baselines' exponents along each axis at fixed everything else (transfer/baselines.py):
# DeepSeek η ∝ (6ND)^−0.125; Step Law η ∝ N^−0.713·D^0.307; D = steps·batch·seq_len, N ∝ depth.
BASELINE_EXPONENTS = {
    "steps": {"deepseek": -0.125, "step_law": 0.307},
    "batch_size": {"deepseek": -0.125, "step_law": 0.307},
    "depth": {"deepseek": -0.125, "step_law": -0.713},
}

# An axis factor whose 95% interval at the target is wider than ×/÷ this is not trusted: the value in
# the interval nearest the prior's factor is used, with a warning (as power-law's bound). Assumption.
MAX_FACTOR_SPREAD = 2.0


def axis_columns(results: pd.DataFrame, base: dict[str, int]) -> pd.DataFrame:
    """`results` with every axis column present: a table without one ran every trial at the base."""
    df = results.copy()
    for a in AXES:
        if a not in df.columns:
            df[a] = base[a]
        else:
            df[a] = pd.to_numeric(df[a], errors="coerce").fillna(base[a]).astype(int)
    return df


def at_base(df: pd.DataFrame, base: dict[str, int], but: str | None = None) -> pd.Series:
    """Rows at the base point on every axis except `but`."""
    keep = pd.Series(True, index=df.index)
    for a in AXES:
        if a != but:
            keep &= df[a] == base[a]
    return keep


def base_point(results: pd.DataFrame, defaults: dict[str, int]) -> dict[str, int]:
    """The ladder's (steps, batch_size, depth): for each axis column, the value the most widths were
    run at (ties: the most rows, then the smaller value); `defaults` where the column is absent."""
    out = dict(defaults)
    for a in AXES:
        if a in results.columns:
            col = pd.to_numeric(results[a], errors="coerce")
            if col.notna().any():
                g = results.assign(_v=col).dropna(subset=["_v"]).groupby("_v")
                score = {v: (grp["width"].nunique(), len(grp), -v) for v, grp in g}
                out[a] = int(max(score, key=score.get))
    return out


def axis_arms(df: pd.DataFrame, base: dict[str, int]) -> dict[str, tuple[int, pd.DataFrame]]:
    """Axis → (the width its arm ran at, its rows, base value included) for every axis with a value
    off the base at the base point of the other axes. The arm's width is the one with the most
    values of that axis (ties: the narrowest)."""
    out = {}
    for a in AXES:
        rows = df[at_base(df, base, but=a)]
        off = rows[rows[a] != base[a]]
        if off.empty:
            continue
        counts = rows.groupby("width")[a].nunique()
        width = int(max(counts.index, key=lambda w: (counts[w], -w)))
        out[a] = (width, rows[rows["width"] == width])
    return out


def axis_law(axis: str, values, x, se, censored, base_value: int, target_value: int) -> dict:
    """The law along one axis, its factor at the target and its verdict (see the module docstring).
    values: the axis values with an optimum; x: log ν* there; se, censored: as optimum.py gives."""
    prior = PRIORS[axis]
    out = {
        "axis": axis,
        "base": base_value,
        "target": target_value,
        "values": [int(v) for v in values],
        "prior_exponent": prior.exponent,
        "prior_held": prior.held,
        "prior_range": list(prior.range),
        "prior_source": prior.source,
    }
    n_points = sum(c is None for c in censored)
    shift = math.log(target_value / base_value)
    if len(values) < 2 or n_points < 2:
        out.update(
            verdict="cannot tell",
            exponent=prior.exponent,
            exponent_ci=None,
            basis="prior",
            reason=f"{len(values)} value(s) of {axis} swept ({n_points} with an uncensored optimum): the ladder "
            f"cannot tell how the LR moves with {LABEL[axis]}; the prior exponent {prior.exponent:+g} ({prior.source}) is used",
        )
    else:
        f = fit_log_linear_censored(values, x, se, censored)
        b_se = f.b_se
        if b_se is None:  # two points: the slope's error from theirs
            s = [v for v in se if v is not None]
            b_se = math.sqrt(sum(v * v for v in s)) / abs(math.log(values[-1] / values[0])) if len(s) == 2 else None
        # Two points: the slope's error is from their own se (normal); else the fit's one quantile.
        q = interval_quantile(f) if f.b_se is not None else normal_quantile()
        ci = [f.b - q * b_se, f.b + q * b_se] if b_se is not None else None
        two = len(values) == 2
        out.update(
            verdict="undecided" if two else "fitted",
            exponent=f.b,
            exponent_se=b_se,
            exponent_ci=ci,
            quantile=q,
            intercept=f.a,
            basis="fit",
            n_bounds=f.n_censored,
            reason=(
                f"two values of {axis}: the slope {f.b:+.3g} interpolates them with no residual freedom to "
                "check the law (undecided); sweep a third value"
                if two
                else f"log-log fit over {axis} {list(map(int, values))}: exponent {f.b:+.3g}"
                + (f", 95% interval [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")
            ),
        )
    b = out["exponent"]
    out["factor"] = math.exp(b * shift)
    se_b = out.get("exponent_se")
    if se_b is not None:  # the exponent's interval carried to the target: the same quantile as exponent_ci
        half = out["quantile"] * se_b * abs(shift)
        out["factor_interval"] = [math.exp(b * shift - half), math.exp(b * shift + half)]
    else:
        out["factor_interval"] = None
    fi = out["factor_interval"]
    ci, (p_lo, p_hi) = out.get("exponent_ci"), prior.range
    if out["basis"] == "fit" and ci and p_hi > p_lo and ci[1] - ci[0] > p_hi - p_lo:
        # The fit says less than the prior already does (issue 37 item 4): its 95% interval is wider
        # than the range the sources allow. The prior is used, said as such; the fit stays on record.
        # (A point prior — depth's — has no range to compare with: the factor guard below governs.)
        out.update(
            basis="prior",
            wider_than_prior=True,
            exponent_fitted=out["exponent"],
            factor_fitted=out["factor"],
            exponent=prior.exponent,
            factor=math.exp(prior.exponent * shift),
        )
    elif out["basis"] == "fit" and fi and fi[1] / fi[0] > MAX_FACTOR_SPREAD**2:
        # Too uncertain to trust its midpoint: the value in the interval nearest the prior's move
        # (the prior itself when inside) — the least the evidence demands, as power-law's bound.
        prior_factor = math.exp(prior.exponent * shift)
        out.update(factor_fitted=out["factor"], factor=min(max(prior_factor, fi[0]), fi[1]), bounded=True)
    out["baselines"] = {name: {"exponent": e, "factor": math.exp(e * shift)} for name, e in BASELINE_EXPONENTS[axis].items()}
    return out


def axis_warnings(law: dict) -> list[str]:
    """What to do next about one axis's law."""
    a, t, base = law["axis"], law["target"], law["base"]
    if t == base:
        return []
    ratio = t / base
    out = []
    if law["verdict"] == "cannot tell":
        out.append(
            f"the target's {a}={t} is {ratio:.3g}× the ladder's {base}, but only one {a} was swept: the LR was "
            f"not transferred across {LABEL[a]} from evidence; applied the prior (LR × {law['factor']:.3g}, "
            f"exponent {law['exponent']:+g}: {law['prior_source']}). Sweep sweep.axes.{a} to measure it"
        )
    elif law["verdict"] == "undecided":
        out.append(f"{LABEL[a]} law undecided: {law['reason']}")
    fi = law.get("factor_interval")
    if law.get("wider_than_prior"):
        lo, hi = law["exponent_ci"]
        out.append(
            f"the {LABEL[a]} fit (exponent {law['exponent_fitted']:+.3g}, 95% interval [{lo:+.3g}, {hi:+.3g}]) is wider than "
            f"the prior's range [{law['prior_range'][0]:+g}, {law['prior_range'][1]:+g}]: it says less than the prior, so the "
            f"prior was used (LR × {law['factor']:.3g}, exponent {law['exponent']:+g}); add seeds or values of {a} to measure it"
        )
    if law.get("bounded"):
        out.append(
            f"the {LABEL[a]} law is uncertain at {a}={t}: its factor's 95% interval ×{fi[0]:.3g}–×{fi[1]:.3g} (fit ×"
            f"{law['factor_fitted']:.3g}) is wider than ×/÷{MAX_FACTOR_SPREAD:g}; used ×{law['factor']:.3g}, the value in "
            f"it nearest the prior's (exponent {law['prior_exponent']:+g}); add seeds or values of {a} nearer the target"
        )
    if law.get("basis") == "fit" and law["values"] and not (min(law["values"]) <= t <= max(law["values"])):
        far = t / max(law["values"]) if t > max(law["values"]) else min(law["values"]) / t
        if far > 32:
            out.append(f"extrapolating the {LABEL[a]} law {far:.0f}× beyond the swept {a} values; sweep a larger {a}")
    return out


def critical_batch(df: pd.DataFrame, lr_col: str = "lr") -> dict | None:
    """The critical batch from the gradient noise scale B_simple = tr(Σ)/|G|² the trials measured
    (`noise_scale` column, sequences; McCandlish et al., arXiv 1812.06162): the median over each arm's
    best grid point (seed-averaged), with the range. None without the column or a finite value."""
    if "noise_scale" not in df.columns:
        return None
    ok = df[(df["status"] == "ok") & np.isfinite(pd.to_numeric(df["noise_scale"], errors="coerce"))]
    if ok.empty:
        return None
    vals = []
    for _, g in ok.groupby(["width", *AXES]):
        if lr_col in g.columns:
            best = g.groupby(lr_col)["val_loss"].mean().idxmin()
            g = g[g[lr_col] == best]
        vals += [float(v) for v in g["noise_scale"]]
    v = np.asarray(vals, float)
    return {
        "b_simple": float(np.median(v)),
        "range": [float(v.min()), float(v.max())],
        "n_trials": len(v),
        "source": "B_simple = tr(Σ)/|G|² (McCandlish et al., arXiv 1812.06162), measured at the end of the trials",
    }


def tau_weight_decay(wd0: float, lr0: float, steps0: int, lr: float, steps: int) -> float:
    """Weight decay that keeps AdamW's EMA timescale a fixed share of the run (docs/RESEARCH.md,
    "The τ rule"): τ_iter = 1/(η·λ) steps, so τ/T constant means η·λ·T constant:
    λ = λ₀·η₀·T₀/(η·T) (Wang & Aitchison, arXiv 2405.13698: τ_epoch = B/(η·λ·D), D = T·B samples)."""
    return wd0 * lr0 * steps0 / (lr * steps)
