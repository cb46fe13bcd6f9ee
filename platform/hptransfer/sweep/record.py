"""Sweep records: MLflow parent/child runs and the µTransfer plot.

MLflow: one parent run per sweep (spec, grid, best per width, results table, plot) and one child
run per trial (tag `mlflow.parentRunId`) with its hyperparameters, width, seed, per-report
training and validation loss, status and wall time. Written from the driver after Tune returns, so
trials never contend for a SQLite store, and idempotent: a resumed sweep reuses its parent run and
skips children already logged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from hptransfer.spec import StudySpec
from hptransfer.tracking import TAG_TRIAL, find_study_run

if TYPE_CHECKING:
    from hptransfer.context import StudyContext


def plot_sweep(df: pd.DataFrame, spec: StudySpec, path: str | Path, hp: str | None = None, marks: dict | None = None) -> Path:
    """Validation loss against `hp` (log axis), one curve per width, each width's optimum marked,
    diverged/failed trials drawn as crosses at the top of the axes."""
    import matplotlib.pyplot as plt

    from hptransfer.io import save_figure

    hp = hp or next(iter(spec.sweep.grid))
    if spec.sweep.axes is not None:  # the width ladder only: sweep.axes arms have the report's axes figure
        from hptransfer.transfer.axes import at_base, axis_columns

        base = {"steps": spec.sweep.steps, "batch_size": spec.sweep.batch_size, "depth": spec.model.depth}
        df = df[at_base(axis_columns(df, base), base)]
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


def log_sweep(study: StudyContext, df: pd.DataFrame, grid, plot: Path | None = None) -> str:
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
            # `grid` is then each tunable's box [low, high]
            **({"search": "optuna", **spec.sweep.optuna_settings.model_dump()} if spec.sweep.search == "optuna" else {}),
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


def log_sweep_runs(
    study: StudyContext,
    df: pd.DataFrame,
    *,
    kind: str,
    child_kind: str,
    run_name: str,
    parent_params: dict[str, Any],
    child_name: Callable[[dict], str],
    child_params: Callable[[dict], dict],
    child_metrics: Callable[[dict], dict],
    parent_metrics: dict[str, float],
    artifacts: list[Path],
    history: Callable[[dict], list[dict]] | None = None,
) -> str:
    """One parent run per sweep and one child per row of its table (tag `mlflow.parentRunId`); the
    one logger of every sweep (the µTransfer sweep, the DP sweep).

    Written from the driver after Tune returns, so trials never contend for a SQLite store, and
    idempotent: a resumed sweep reuses its parent run (found by study folder and kind) and skips
    children already logged (by `trial_id`). Returns the parent run id."""
    parent_id = find_study_run(study.tracking_uri, study.experiment, study.root, kind)
    if parent_id:
        parent = study.tracker(run_id=parent_id)
    else:
        parent = study.tracker(run_name, kind=kind, tags={"hpt.spec_hash": study.spec_hash})
        parent.log_params(parent_params)
    client = parent.client
    done = {
        r.data.tags.get(TAG_TRIAL)
        for r in client.search_runs(
            [client.get_run(parent.run_id).info.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{parent.run_id}'",
            max_results=10000,
        )
    }
    for row in df.to_dict(orient="records"):
        if row["trial_id"] in done:
            continue
        child = study.tracker(
            child_name(row),
            kind=child_kind,
            parent_run_id=parent.run_id,
            tags={TAG_TRIAL: row["trial_id"], "status": row["status"]},
        )
        child.log_params(child_params(row))
        for h in history(row) if history else []:
            child.log_metrics({k: v for k, v in h.items() if k != "step"}, step=int(h.get("step", 0)))
        child.log_metrics(child_metrics(row))
        child.end("FINISHED" if row["status"] == "ok" else "FAILED")
    parent.log_metrics(parent_metrics)
    for path in artifacts:
        if Path(path).exists():
            parent.log_artifact(path)
    parent.end()
    return parent.run_id
