"""Sweep records: MLflow parent/child runs and the µTransfer plot.

MLflow: one parent run per sweep (spec, grid, best per width, results table, plot) and one child
run per trial (tag `mlflow.parentRunId`) with its hyperparameters, width, seed, per-report
training and validation loss, status and wall time. Written from the driver after Tune returns, so
trials never contend for a SQLite store, and idempotent: a resumed sweep reuses its parent run and
skips children already logged.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hptransfer.spec import StudySpec, spec_hash
from hptransfer.tracking import TAG_KIND, TAG_STUDY, TAG_TRIAL, MlflowTracker


def plot_sweep(df: pd.DataFrame, spec: StudySpec, path: str | Path, hp: str | None = None, marks: dict | None = None) -> Path:
    """Validation loss against `hp` (log axis), one curve per width, each width's optimum marked,
    diverged/failed trials drawn as crosses at the top of the axes."""
    import matplotlib

    matplotlib.use("Agg")
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


def _find_parent(tracker_client, exp_name: str, study_dir: str) -> str | None:
    exp = tracker_client.get_experiment_by_name(exp_name)
    if not exp:
        return None
    runs = tracker_client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{study_dir}' and tags.`{TAG_KIND}` = 'sweep'")
    return runs[0].info.run_id if runs else None


def log_sweep(spec: StudySpec, study_dir: str | Path, df: pd.DataFrame, grid, tracking_uri: str,
              plot: Path | None = None) -> str:
    from mlflow import MlflowClient

    study_dir = str(Path(study_dir).resolve())
    exp = spec.tracking.experiment or spec.name
    client = MlflowClient(tracking_uri)
    parent_id = _find_parent(client, exp, study_dir)
    if parent_id:
        parent = MlflowTracker(tracking_uri, exp, run_id=parent_id)
    else:
        parent = MlflowTracker(tracking_uri, exp, run_name=f"{spec.name}-sweep",
                               tags={TAG_STUDY: study_dir, TAG_KIND: "sweep", "hpt.spec_hash": spec_hash(spec)})
        parent.log_params({"widths": spec.sweep.widths, "grid": spec.sweep.grid, "seeds": spec.sweep.seeds,
                           "steps": spec.sweep.steps, "batch_size": spec.sweep.batch_size,
                           "family": spec.model.family, "parametrization": spec.model.parametrization,
                           "depth": spec.model.depth, "rule": spec.transfer.rule})
    done = {r.data.tags.get(TAG_TRIAL) for r in client.search_runs(
        [client.get_run(parent.run_id).info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.run_id}'", max_results=10000)}
    by_id = {(r.metrics or {}).get("trial_id") or Path(r.path).name: r for r in grid} if grid is not None else {}
    for row in df.itertuples(index=False):
        row = row._asdict()
        if row["trial_id"] in done:
            continue
        child = MlflowTracker(tracking_uri, exp, run_name=f"w{row['width']}-" + "-".join(
            f"{hp}{row[hp]:.3g}" for hp in spec.sweep.grid) + f"-s{row['seed']}", parent_run_id=parent.run_id,
            tags={TAG_TRIAL: row["trial_id"], TAG_KIND: "trial", "status": row["status"]})
        child.log_params({"width": row["width"], "seed": row["seed"], **{hp: row[hp] for hp in spec.sweep.grid},
                          **spec.sweep.fixed})
        r = by_id.get(row["trial_id"])
        hist = r.metrics_dataframe if r is not None else None
        if hist is not None and len(hist):
            for h in hist.to_dict(orient="records"):
                child.log_metrics({k: h[k] for k in ("train_loss", "val_loss") if k in h}, step=int(h.get("step", 0)))
        child.log_metrics({"final_val_loss": row["val_loss"], "wall_s": row["wall_s"]})
        child.end("FINISHED" if row["status"] == "ok" else "FAILED")
    best = {}
    for w, g in df[df.status == "ok"].groupby("width"):
        b = g.loc[g.val_loss.idxmin()]
        best[f"best_val_loss_w{w}"] = b.val_loss
        for hp in spec.sweep.grid:
            best[f"best_{hp}_w{w}"] = b[hp]
    parent.log_metrics(best)
    parent.log_metrics({"trials_ok": int((df.status == "ok").sum()), "trials_diverged": int((df.status == "diverged").sum()),
                        "trials_failed": int((df.status == "failed").sum())})
    parent.log_artifact(Path(study_dir) / "sweep_results.csv")
    parent.log_artifact(Path(study_dir) / "spec.yaml")
    if plot:
        parent.log_artifact(plot)
    parent.end()
    return parent.run_id
