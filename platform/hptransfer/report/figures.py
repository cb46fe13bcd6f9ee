"""The report's figures, each a function of files already in the study folder (no training).

- `plot_transfer`: the µTransfer plot (sweep/record.py's `plot_sweep`) plus the transferred point,
  drawn at the target run's validation loss when the target was trained.
- `plot_optimum`: ν*(n) against width with the two fits the diagnostics made (transfer/fitting.py):
  the log-linear trend log ν* = a + b·log n, and paper 2's drift law log ν*(n) = x_∞ + K·n^−β
  (arXiv 2512.22768), extended to the target width where the transferred value is marked.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from hptransfer.plan import TransferPlan
from hptransfer.plan_diagnostics import DriftFit
from hptransfer.spec import LOG_SCALE, StudySpec


def _tex(x: object) -> str:
    """A value from a spec, plan or table as literal text in a label: matplotlib reads `$...$` as
    math (mathtext), and an unknown command there fails the whole figure."""
    return str(x).replace("$", r"\$")


def plot_transfer(
    df: pd.DataFrame, spec: StudySpec, plan: TransferPlan | None, target_loss: float | None, path: str | Path
) -> Path:
    from hptransfer.sweep.record import plot_sweep

    hp = (plan.diagnostics.primary if plan else None) or next(iter(spec.sweep.grid))
    marks = {}
    if plan is not None and hp in plan.hyperparameters:
        x = plan.hyperparameters[hp]
        if target_loss is not None and math.isfinite(target_loss):
            marks[f"target width {plan.target.width} at transferred {_tex(hp)}={x:.3g}: val loss {target_loss:.3f}"] = (
                x,
                target_loss,
            )
        else:
            # Not trained yet: draw the point at the widest width's fitted loss, and say so.
            per = plan.diagnostics.optimum_by_width.get(str(plan.diagnostics.source_width), {})
            y = getattr(per.get(hp), "fitted_loss", None)
            if y is not None:
                marks[f"transferred {_tex(hp)}={x:.3g} (target not trained yet)"] = (x, y)
    return plot_sweep(df, spec, path, hp=hp, marks=marks)


def drift_curve(drift: DriftFit | None, widths: list[int], log_opt: list[float], n: np.ndarray) -> np.ndarray | None:
    """log ν*(n) = x_∞ + K·n^−β from the plan's `drift_fit`. The plan stores B = |K|; the sign of K
    is the side the swept optima lie on relative to x_∞."""
    if drift is None or drift.drift != "fitted" or None in (drift.beta, drift.x_inf, drift.B):
        return None
    sign = 1.0 if np.mean(log_opt) >= drift.x_inf else -1.0
    return drift.x_inf + sign * drift.B * n**-drift.beta


def plot_optimum(plan: TransferPlan, path: str | Path) -> Path | None:
    """None when the plan has no per-width optima (nothing to draw)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hptransfer.io import save_figure
    from hptransfer.transfer.fitting import fit_log_linear

    d = plan.diagnostics
    hp = d.primary
    pts = sorted((int(w), per[hp]) for w, per in d.optimum_by_width.items() if hp in per and per[hp].value is not None)
    if not pts:
        return None
    log = hp in LOG_SCALE
    widths = [w for w, _ in pts]
    vals = np.array([f.value for _, f in pts], float)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lo = np.array([(f.ci or [v, v])[0] for (_, f), v in zip(pts, vals)], float)
    hi = np.array([(f.ci or [v, v])[1] for (_, f), v in zip(pts, vals)], float)
    ax.errorbar(
        widths,
        vals,
        yerr=[vals - lo, hi - vals],
        fmt="o",
        color="k",
        capsize=4,
        label=f"{_tex(hp)}* per swept width (fit; bars: bootstrap CI when seeds allow)",
    )
    edge = [w for w, f in pts if f.on_edge]
    if edge:
        ax.plot(
            edge, [f.value for w, f in pts if w in edge], "s", mfc="none", mec="orange", ms=12, mew=2, label="on the grid edge"
        )
    n = np.geomspace(min(widths), max(plan.target.width, max(widths)), 100)
    x = np.log(vals) if log else vals
    if len(widths) >= 2:
        f = fit_log_linear(widths, x)
        y = np.array([f.predict(v) for v in n])
        ax.plot(n, np.exp(y) if log else y, "--", color="tab:blue", label=f"trend: slope {f.b:+.3f} per log width")
    dc = drift_curve(d.drift_fit, widths, list(x), n)
    if dc is not None:
        ax.plot(
            n,
            np.exp(dc) if log else dc,
            ":",
            color="tab:green",
            lw=2,
            label=f"drift law x∞ + K·n^-β (β={d.drift_fit.beta:.2g})",
        )
    if hp in plan.hyperparameters:
        ax.plot(
            [plan.target.width],
            [plan.hyperparameters[hp]],
            "D",
            ms=10,
            color="crimson",
            label=f"plan ({_tex(plan.rule)}) at target width {plan.target.width}",
        )
    ax.axvline(plan.target.width, color="crimson", alpha=0.25)
    ax.set_xscale("log", base=2)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("width")
    ax.set_ylabel(f"optimal {_tex(hp)}" + (" (base-width value)" if plan.model.parametrization == "mup" else ""))
    ax.set_title(f"{_tex(plan.study)}: optimum against width")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_axes(plan: TransferPlan, path: str | Path) -> Path | None:
    """Per axis of `plan.axes` (steps, batch size, depth: transfer/axes.py): the optimal LR at each
    swept value (bars: ±1.96 se), the law (fitted, or the prior through the base point), and the
    plan's move to the target value. None when the plan has no axis laws."""
    laws = ((plan.axes or {}).get("laws")) or {}
    if not laws:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hptransfer.io import save_figure

    fig, axs = plt.subplots(1, len(laws), figsize=(4.8 * len(laws), 4.2), squeeze=False)
    for ax, (axis, law) in zip(axs[0], laws.items()):
        opt = {int(k): v for k, v in (law.get("optimum") or {}).items()}
        se = {int(k): v for k, v in (law.get("optimum_se") or {}).items()}
        base, target, b = law["base"], law["target"], law["exponent"]
        if opt:
            vs = sorted(opt)
            ys = np.array([opt[v] for v in vs])
            err = np.array([1.96 * (se.get(v) or 0.0) for v in vs])
            ax.errorbar(
                vs, ys, yerr=[ys - ys * np.exp(-err), ys * np.exp(err) - ys], fmt="o", color="k", capsize=4, label="lr* per value"
            )
            cens = [int(k) for k in (law.get("censored") or {})]
            if cens:
                ax.plot(
                    cens, [opt[v] for v in cens], "s", mfc="none", mec="orange", ms=12, mew=2, label="on the grid edge (a bound)"
                )
            ref = opt.get(base, math.exp(law.get("intercept", 0.0) + b * math.log(base)) if "intercept" in law else ys[0])
        else:
            vs, ref = [base], plan.axes.get("width_rule_lr", 1.0)
        grid = np.geomspace(min(*vs, target), max(*vs, target), 100)
        if law["basis"] == "fit":
            line = np.exp(law["intercept"] + b * np.log(grid))
            ci = law.get("exponent_ci")
            label = f"fit: exponent {b:+.3g}" + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "") + f" ({law['verdict']})"
        else:
            line = ref * (grid / base) ** b
            label = f"prior: exponent {b:+g} (not measured)"
        ax.plot(grid, line, "--", color="tab:blue", label=label)
        anchor = math.exp(law["intercept"] + b * math.log(base)) if law["basis"] == "fit" else ref
        ax.plot(
            [target],
            [anchor * law["factor"]],
            "D",
            ms=10,
            color="crimson",
            label=f"target {axis}={target}: lr × {law['factor']:.3g}",
        )
        ax.axvline(target, color="crimson", alpha=0.25)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(_tex(axis))
        ax.set_ylabel("optimal lr" + (f" (width {law['width']})" if law.get("width") else ""))
        ax.set_title(f"{_tex(plan.study)}: optimum against {_tex(axis)}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
