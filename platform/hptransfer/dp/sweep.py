"""`hpt dp-sweep`: DP fine-tuning trials over (ε, B, C, LR) as Ray Tune trials, on the offline
digits transfer task (pre-train on the public classes, DP-fine-tune on the private ones).

For each ε the candidate B are the feasible ones of that ε's σ√T table (T ≥ min_steps) and the C
grid is that ε's plan grid (extended upward as ε falls), so the sweep tests exactly the choices
`hpt dp-plan` reasons about. The backbone is pre-trained once in the driver and shared with the
trials through Ray's object store. Results: `dp_sweep_results.csv` (one row per trial),
`dp_sweep.png`, an MLflow parent run with one child per trial.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from hptransfer.io import save_figure, write_atomic
from hptransfer.spec import StudySpec
from hptransfer.tracking import TAG_KIND, TAG_STUDY, MlflowTracker

RESULTS = "dp_sweep_results.csv"
POINT_KEYS = ("epsilon", "batch_size", "clip", "sigma", "steps", "chosen_b")


def sweep_points(spec: StudySpec, epsilons: list[float], dataset_size: int) -> list[dict]:
    """(ε, B, C) points: B feasible under ε's budget, C from ε's plan grid; σ and T precomputed."""
    from hptransfer.dp.plan import dp_plan_for

    base = spec.dp.with_dataset_size(dataset_size) if spec.dp.dataset_size is None else spec.dp
    points = []
    for eps in epsilons:
        plan = dp_plan_for(base.model_copy(update={"epsilon": eps}))
        for row in (r for r in plan.table if r.feasible):
            points += [{"epsilon": eps, "batch_size": row.batch_size, "clip": c, "sigma": row.sigma,
                        "steps": row.steps, "chosen_b": row.batch_size == plan.batch_size} for c in plan.clip_grid]
    return points


def _trainable(config: dict, task=None, body=None) -> None:
    import torch
    from ray import tune

    from hptransfer.dp.task import run_dp_finetune

    torch.set_num_threads(1)
    p = config["point"]
    m = run_dp_finetune(task, body, epsilon=p["epsilon"], delta=config["delta"], epochs=config["epochs"],
                        batch_size=p["batch_size"], clip=p["clip"], lr=config["lr"],
                        accountant=config["accountant"], seed=config["seed"])
    ok = math.isfinite(m["test/accuracy"]) and m["dp/epsilon"] <= p["epsilon"] + 1e-9
    tune.report({"test_accuracy": m["test/accuracy"], "epsilon_spent": m["dp/epsilon"],
                 "status": "ok" if ok else "failed"})


def plot_dp_sweep(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = sorted(df.epsilon.unique())
    fig, axes = plt.subplots(1, len(eps), figsize=(5 * len(eps), 4), squeeze=False, sharey=True)
    for ax, e in zip(axes[0], eps):
        g = df[(df.epsilon == e) & (df.status == "ok")]
        best_lr = g.groupby(["batch_size", "clip"]).test_accuracy.max().reset_index()
        for b, gb in best_lr.groupby("batch_size"):
            chosen = bool(df[(df.epsilon == e) & (df.batch_size == b)].chosen_b.any())
            ax.plot(gb["clip"], gb["test_accuracy"], "o-", lw=2.5 if chosen else 1,
                    label=f"B={b}" + (" (dp-plan)" if chosen else ""))
        ax.set_xscale("log")
        ax.set_title(f"ε = {e:g}")
        ax.set_xlabel("clipping bound C")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("test accuracy (best LR)")
    fig.suptitle("DP fine-tuning: accuracy against C per batch size")
    return save_figure(fig, path)


def run_dp_sweep(spec: StudySpec, study_dir: str | Path, *, epsilons: list[float] | None = None,
                 lrs: list[float] | None = None, seeds: list[int] | None = None, tracking_uri: str | None = None,
                 address: str | None = None, pretrain_width: int = 64, log=print) -> pd.DataFrame:
    from ray import tune

    from hptransfer.dp.task import load_task, pretrain
    from hptransfer.sweep.ray_session import ray_session
    from hptransfer.tracking import resolve_tracking_uri

    if spec.dp is None:
        raise ValueError(f"spec {spec.name!r} has no `dp:` block; add one (see search_spaces/dp-finetune.yaml)")
    study_dir = Path(study_dir).resolve()
    task = load_task()
    epsilons = epsilons or [spec.dp.epsilon]
    lrs = lrs or [spec.dp.lr or 3e-3]
    seeds = seeds or list(spec.sweep.seeds)
    points = sweep_points(spec, epsilons, task.private_size)
    log(f"dp-sweep: {len(points) * len(lrs) * len(seeds)} trials over ε {epsilons}, "
        f"B {sorted({p['batch_size'] for p in points})}, {len(lrs)} LR(s), {len(seeds)} seed(s)")
    body = pretrain(task, width=pretrain_width, seed=spec.seed)
    with ray_session(spec.ray, address):
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(_trainable, task=task, body=body), {"cpu": 1}),
            param_space={"point": tune.grid_search(points), "lr": tune.grid_search(lrs),
                         "seed": tune.grid_search(seeds), "delta": spec.dp.delta, "epochs": spec.dp.epochs,
                         "accountant": spec.dp.accountant},
            tune_config=tune.TuneConfig(metric="test_accuracy", mode="max"),
            run_config=tune.RunConfig(name="dp_sweep", storage_path=str(study_dir / "ray_results"), verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=0)),
        )
        grid = tuner.fit()
    rows = []
    for r in grid:
        c, m = r.config, r.metrics or {}
        rows.append({**{k: c["point"][k] for k in POINT_KEYS}, "lr": c["lr"], "seed": c["seed"],
                     "test_accuracy": m.get("test_accuracy", math.nan), "epsilon_spent": m.get("epsilon_spent", math.nan),
                     "status": "failed" if r.error else m.get("status", "failed")})
    df = pd.DataFrame(rows).sort_values(["epsilon", "batch_size", "clip", "lr", "seed"]).reset_index(drop=True)
    write_atomic(study_dir / RESULTS, df.to_csv(index=False))
    plot = plot_dp_sweep(df, study_dir / "dp_sweep.png")

    uri = resolve_tracking_uri(study_dir, spec.tracking.uri, tracking_uri)
    exp = spec.tracking.experiment or spec.name
    parent = MlflowTracker(uri, exp, run_name=f"{spec.name}-dp-sweep", tags={TAG_KIND: "dp-sweep", TAG_STUDY: study_dir})
    parent.log_params({"epsilons": epsilons, "lrs": lrs, "seeds": seeds, "delta": spec.dp.delta,
                       "epochs": spec.dp.epochs, "accountant": spec.dp.accountant})
    for row in df.to_dict(orient="records"):
        child = MlflowTracker(uri, exp, run_name=f"eps{row['epsilon']:g}-B{row['batch_size']}-C{row['clip']:.3g}-lr{row['lr']:.3g}",
                              parent_run_id=parent.run_id, tags={TAG_KIND: "dp-trial", "status": row["status"]})
        child.log_params({k: row[k] for k in ("epsilon", "batch_size", "clip", "lr", "seed", "sigma", "steps")})
        child.log_metrics({"test_accuracy": row["test_accuracy"], "epsilon_spent": row["epsilon_spent"]})
        child.end("FINISHED" if row["status"] == "ok" else "FAILED")
    for e, g in df[df.status == "ok"].groupby("epsilon"):
        best = g.loc[g.test_accuracy.idxmax()]
        parent.log_metrics({f"best_accuracy_eps{e:g}": best.test_accuracy, f"best_clip_eps{e:g}": best["clip"],
                            f"best_batch_eps{e:g}": best.batch_size})
    parent.log_artifact(study_dir / RESULTS)
    parent.log_artifact(plot)
    parent.end()
    return df
