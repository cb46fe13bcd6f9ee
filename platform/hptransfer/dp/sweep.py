"""`hpt dp-sweep`: DP fine-tuning trials over (ε, B, C, LR) as Ray Tune trials, on the offline
digits transfer task (pre-train on the public classes, DP-fine-tune on the private ones).

For each ε the candidate B are the feasible ones of that ε's σ√T table (T ≥ min_steps) and the C
grid is that ε's plan grid (extended upward as ε falls), so the sweep tests exactly the choices
`hpt dp-plan` reasons about. The backbone is pre-trained once in the driver and shared with the
trials through Ray's object store. It runs on the same machinery as the main sweep
(`sweep.runner.run_sweep_task`: resume, resource check, progress) and logs through the same
parent/child logger. Results: the study's dp-sweep table (one row per trial), its plot, an MLflow
parent run with one child per trial.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from hptransfer.errors import DPError
from hptransfer.io import save_figure
from hptransfer.spec import StudySpec
from hptransfer.study import DP_SWEEP_EXPERIMENT
from hptransfer.tracking import log_sweep_runs

if TYPE_CHECKING:
    from hptransfer.study import Study

POINT_KEYS = ("epsilon", "batch_size", "clip", "sigma", "steps", "chosen_b")


def sweep_points(spec: StudySpec, epsilons: list[float], dataset_size: int) -> list[dict]:
    """(ε, B, C) points: B feasible under ε's budget, C from ε's plan grid; σ and T precomputed."""
    from hptransfer.dp.plan import dp_plan_for

    base = spec.dp.with_dataset_size(dataset_size) if spec.dp.dataset_size is None else spec.dp
    points = []
    for eps in epsilons:
        plan = dp_plan_for(base.model_copy(update={"epsilon": eps}))
        for row in (r for r in plan.table if r.feasible):
            points += [
                {
                    "epsilon": eps,
                    "batch_size": row.batch_size,
                    "clip": c,
                    "sigma": row.sigma,
                    "steps": row.steps,
                    "chosen_b": row.batch_size == plan.batch_size,
                }
                for c in plan.clip_grid
            ]
    return points


def _trainable(config: dict, task=None, body=None) -> None:
    import torch
    from ray import tune

    from hptransfer.dp.task import run_dp_finetune

    torch.set_num_threads(1)
    p = config["point"]
    m = run_dp_finetune(
        task,
        body,
        epsilon=p["epsilon"],
        delta=config["delta"],
        epochs=config["epochs"],
        batch_size=p["batch_size"],
        clip=p["clip"],
        lr=config["lr"],
        accountant=config["accountant"],
        seed=config["seed"],
    )
    ok = math.isfinite(m["test/accuracy"]) and m["dp/epsilon"] <= p["epsilon"] + 1e-9
    tune.report({"test_accuracy": m["test/accuracy"], "epsilon_spent": m["dp/epsilon"], "status": "ok" if ok else "failed"})


def plot_dp_sweep(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib.pyplot as plt

    eps = sorted(df.epsilon.unique())
    fig, axes = plt.subplots(1, len(eps), figsize=(5 * len(eps), 4), squeeze=False, sharey=True)
    for ax, e in zip(axes[0], eps):
        g = df[(df.epsilon == e) & (df.status == "ok")]
        best_lr = g.groupby(["batch_size", "clip"]).test_accuracy.max().reset_index()
        for b, gb in best_lr.groupby("batch_size"):
            chosen = bool(df[(df.epsilon == e) & (df.batch_size == b)].chosen_b.any())
            ax.plot(
                gb["clip"], gb["test_accuracy"], "o-", lw=2.5 if chosen else 1, label=f"B={b}" + (" (dp-plan)" if chosen else "")
            )
        ax.set_xscale("log")
        ax.set_title(f"ε = {e:g}")
        ax.set_xlabel("clipping bound C")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("test accuracy (best LR)")
    fig.suptitle("DP fine-tuning: accuracy against C per batch size")
    return save_figure(fig, path)


def run_dp_sweep(
    study: Study,
    *,
    epsilons: list[float] | None = None,
    lrs: list[float] | None = None,
    seeds: list[int] | None = None,
    pretrain_width: int = 64,
    restart: bool = False,
    log=print,
) -> pd.DataFrame:
    from ray import tune

    from hptransfer.dp.task import load_task, pretrain
    from hptransfer.sweep.runner import SweepTask, run_sweep_task

    spec = study.require_spec()
    if spec.dp is None:
        raise DPError(f"spec {spec.name!r} has no `dp:` block; add one (see search_spaces/dp-finetune.yaml)")
    task_data = load_task()
    epsilons = epsilons or [spec.dp.epsilon]
    lrs = lrs or [spec.dp.lr or 3e-3]
    seeds = seeds or list(spec.sweep.seeds)
    points = sweep_points(spec, epsilons, task_data.private_size)
    log(
        f"dp-sweep: {len(points) * len(lrs) * len(seeds)} trials over ε {epsilons}, "
        f"B {sorted({p['batch_size'] for p in points})}, {len(lrs)} LR(s), {len(seeds)} seed(s)"
    )
    body = pretrain(task_data, width=pretrain_width, seed=spec.seed)

    def row(r) -> dict:
        c, m = r.config, r.metrics or {}
        return {
            **{k: c["point"][k] for k in POINT_KEYS},
            "lr": c["lr"],
            "seed": c["seed"],
            "test_accuracy": m.get("test_accuracy", math.nan),
            "epsilon_spent": m.get("epsilon_spent", math.nan),
            "status": "failed" if r.error else m.get("status", "failed"),
            "trial_id": Path(r.path).name,
        }

    fingerprint = hashlib.sha256(
        json.dumps([study.spec_hash, points, lrs, seeds], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    task = SweepTask(
        experiment=DP_SWEEP_EXPERIMENT,
        trainable=tune.with_parameters(_trainable, task=task_data, body=body),
        axes={"point": points, "lr": lrs, "seed": seeds},
        resources={"cpu": 1},
        constants={"delta": spec.dp.delta, "epochs": spec.dp.epochs, "accountant": spec.dp.accountant},
        metric="test_accuracy",
        mode="max",
        row=row,
        results_path=study.paths.dp_sweep_results,
        fingerprint=fingerprint,
        sort_by=["epsilon", "batch_size", "clip", "lr", "seed"],
        reuse_actors=False,
        describe=lambda c: (
            f"ε={c['point']['epsilon']:g} B={c['point']['batch_size']} C={c['point']['clip']:.3g} "
            f"lr={c['lr']:.3g} seed={c['seed']}"
        ),
    )
    df, _ = run_sweep_task(study, task, restart=restart, log=log)
    plot = plot_dp_sweep(df, study.paths.dp_sweep_png)
    best = {}
    for e, g in df[df.status == "ok"].groupby("epsilon"):
        b = g.loc[g.test_accuracy.idxmax()]
        best.update(
            {f"best_accuracy_eps{e:g}": b.test_accuracy, f"best_clip_eps{e:g}": b["clip"], f"best_batch_eps{e:g}": b.batch_size}
        )
    log_sweep_runs(
        study,
        df,
        kind="dp-sweep",
        child_kind="dp-trial",
        run_name=f"{spec.name}-dp-sweep",
        parent_params={
            "epsilons": epsilons,
            "lrs": lrs,
            "seeds": seeds,
            "delta": spec.dp.delta,
            "epochs": spec.dp.epochs,
            "accountant": spec.dp.accountant,
        },
        child_name=lambda r: f"eps{r['epsilon']:g}-B{r['batch_size']}-C{r['clip']:.3g}-lr{r['lr']:.3g}-s{r['seed']}",
        child_params=lambda r: {k: r[k] for k in ("epsilon", "batch_size", "clip", "lr", "seed", "sigma", "steps")},
        child_metrics=lambda r: {"test_accuracy": r["test_accuracy"], "epsilon_spent": r["epsilon_spent"]},
        parent_metrics=best,
        artifacts=[study.paths.dp_sweep_results, plot],
    )
    return df
