"""Sweep records: MLflow parent/child runs and the µTransfer plot.

MLflow: one parent run per sweep (spec, grid, best per width, results table, plot) and one child
run per trial (tag `mlflow.parentRunId`) with its hyperparameters, width, seed, per-report
training and validation loss, status and wall time. Written from the driver after Tune returns, so
trials never contend for a SQLite store, and idempotent: a resumed sweep reuses its parent run and
skips children already logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from hptransfer.spec import StudySpec
from hptransfer.tracking import log_sweep_runs

if TYPE_CHECKING:
    from hptransfer.study import Study


def plot_sweep(df: pd.DataFrame, spec: StudySpec, path: str | Path, hp: str | None = None, marks: dict | None = None) -> Path:
    """Validation loss against `hp` (log axis), one curve per width, each width's optimum marked,
    diverged/failed trials drawn as crosses at the top of the axes."""
    import matplotlib.pyplot as plt

    from hptransfer.io import save_figure

    hp = hp or next(iter(spec.sweep.grid))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = df[df.status == "ok"]
    cmap = plt.get_cmap("viridis", max(2, df.width.nunique()))
    ymax = ok.val_loss.max() if len(ok) else 1.0
    for i, (w, g) in enumerate(df.groupby("width")):
        gk = g[g.status == "ok"].groupby(hp)["val_loss"].mean()
        ax.plot(gk.index, gk.values, "o-", color=cmap(i), label=f"width {w}")
        if len(gk):
            ax.plot([gk.idxmin()], [gk.min()], "*", ms=16, color=cmap(i), mec="k")
        bad = g[g.status != "ok"]
        if len(bad):
            ax.plot(bad[hp], [ymax] * len(bad), "x", color=cmap(i), ms=9, mew=2)
    for label, (x, y) in (marks or {}).items():
        ax.plot([x], [y], "D", ms=10, color="crimson", label=label)
    ax.set_xscale("log")
    ax.set_xlabel(hp)
    ax.set_ylabel("validation loss")
    ax.set_title(f"{spec.name}: {spec.model.family}/{spec.model.parametrization} — ★ optimum per width, × diverged/failed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def log_sweep(study: Study, df: pd.DataFrame, grid, plot: Path | None = None) -> str:
    """The sweep's MLflow parent run (spec, grid, best per width, table, plot) and one child per trial
    with its hyperparameters, width, seed, per-report losses, status and wall time."""
    spec = study.require_spec()
    tuned = list(spec.sweep.grid)
    by_id = {(r.metrics or {}).get("trial_id") or Path(r.path).name: r for r in grid} if grid is not None else {}

    def history(row: dict) -> list[dict]:
        r = by_id.get(row["trial_id"])
        hist = r.metrics_dataframe if r is not None else None
        if hist is None or not len(hist):
            return []
        return [
            {"step": h.get("step", 0), **{k: h[k] for k in ("train_loss", "val_loss") if k in h}}
            for h in hist.to_dict(orient="records")
        ]

    best = {}
    for w, g in df[df.status == "ok"].groupby("width"):
        b = g.loc[g.val_loss.idxmin()]
        best[f"best_val_loss_w{w}"] = b.val_loss
        for hp in tuned:
            best[f"best_{hp}_w{w}"] = b[hp]
    counts = {f"trials_{s}": int((df.status == s).sum()) for s in ("ok", "diverged", "failed")}
    return log_sweep_runs(
        study,
        df,
        kind="sweep",
        child_kind="trial",
        run_name=f"{spec.name}-sweep",
        parent_params={
            "widths": spec.sweep.widths,
            "grid": spec.sweep.grid,
            "seeds": spec.sweep.seeds,
            "steps": spec.sweep.steps,
            "batch_size": spec.sweep.batch_size,
            "family": spec.model.family,
            "parametrization": spec.model.parametrization,
            "depth": spec.model.depth,
            "rule": spec.transfer.rule,
        },
        child_name=lambda row: f"w{row['width']}-" + "-".join(f"{hp}{row[hp]:.3g}" for hp in tuned) + f"-s{row['seed']}",
        child_params=lambda row: {
            "width": row["width"],
            "seed": row["seed"],
            **{hp: row[hp] for hp in tuned},
            **spec.sweep.fixed,
        },
        child_metrics=lambda row: {"final_val_loss": row["val_loss"], "wall_s": row["wall_s"]},
        history=history,
        parent_metrics={**best, **counts},
        artifacts=[study.paths.sweep_results, study.paths.spec, *([plot] if plot else [])],
    )
