"""`hpt dp-sweep`: DP fine-tuning trials over (ε, B, C, LR) as Ray Tune trials, on one of two tasks:

- `lm` (the default): the spec's language model at its base width (or `--width`), DP-fine-tuned on
  the private sequences of the spec's corpus in one process per trial (`dp.lm_task`: Opacus, Poisson
  sampling at q = B/N, normalized clipping, as the private large run); scored by validation loss;
- `digits`: the offline digits transfer task (`dp.task`: pre-train on the public classes, DP-fine-tune
  on the private ones); the backbone is pre-trained once in the driver. Scored by test accuracy.

For each ε the candidate B are the feasible ones of that ε's σ√T table (T ≥ min_steps) and the C
grid is that ε's plan grid (extended upward as ε falls), so the sweep tests exactly the choices
`hpt dp-plan` reasons about; N is the task's (the LM task: `dp.dataset_size`, or every private
sequence of the corpus when null). Every trial's ε spent is checked against its target. Task data
reach the trials once, through Ray's object store. It runs on the same machinery as the main sweep
(`sweep.runner.run_sweep_task`: resume, resource check, progress) and logs through the same
parent/child logger. Results: the study's dp-sweep table (one row per trial), its plot, an MLflow
parent run with one child per trial.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from hptransfer.errors import DPError
from hptransfer.io import save_figure
from hptransfer.layout import DP_SWEEP_EXPERIMENT
from hptransfer.spec import StudySpec
from hptransfer.sweep.record import log_sweep_runs
from hptransfer.sweep.runner import SweepTask, run_sweep_task

if TYPE_CHECKING:
    from hptransfer.context import StudyContext

POINT_KEYS = ("epsilon", "batch_size", "clip", "sigma", "steps", "chosen_b")
TASKS = ("lm", "digits")


@dataclass(frozen=True)
class TaskKind:
    """How a task's trials are scored."""

    metric: str  # the results column the sweep ranks by
    mode: str  # "min" | "max"
    label: str  # for the plot's y axis
    extra: tuple[str, ...] = ()  # more reported metrics kept as columns


KINDS = {
    "lm": TaskKind("val_loss", "min", "validation loss", ("initial_val_loss", "train_loss")),
    "digits": TaskKind("test_accuracy", "max", "test accuracy"),
}


def dp_config_for(spec: StudySpec, dataset_size: int):
    """The spec's dp block with N filled in when it is null (re-validated: δ < 1/N, B ≤ N), errors
    reported as DP errors naming the field."""
    from pydantic import ValidationError

    from hptransfer.errors import problems_from_validation

    if spec.dp.dataset_size is not None:
        return spec.dp
    try:
        return spec.dp.with_dataset_size(dataset_size)
    except ValidationError as e:
        raise DPError(
            f"dp (dataset_size derived from the data: N = {dataset_size})", problems_from_validation(e, prefix="dp")
        ) from None


def sweep_points(spec: StudySpec, epsilons: list[float], dataset_size: int) -> list[dict]:
    """(ε, B, C) points: B feasible under ε's budget, C from ε's plan grid; σ and T precomputed.
    ε = inf: the noise-free arm (σ = 0) at every candidate B and the unshifted C grid, whose loss
    against T is the step curve of the predicted-loss batch rule (`dp.steps`)."""
    from hptransfer.dp import rule
    from hptransfer.dp.accounting import steps_for
    from hptransfer.dp.plan import dp_plan_for

    base = dp_config_for(spec, dataset_size)
    points = []
    for eps in epsilons:
        if math.isinf(eps) and eps > 0:
            grid = rule.clip_grid(base.clip_shift_reference_epsilon, base.clip_reference, base.clip_factors)
            points += [
                {
                    "epsilon": math.inf,
                    "batch_size": b,
                    "clip": c,
                    "sigma": 0.0,
                    "steps": steps_for(dataset_size, base.epochs, b),
                    "chosen_b": False,
                }
                for b in base.resolved_batch_sizes()
                for c in grid
            ]
            continue
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


def _trial_kwargs(config: dict) -> dict:
    """A trial's privacy and optimizer settings: its (ε, B, C) point and the sweep-wide rest."""
    p = config["point"]
    keys = ("delta", "epochs", "lr", "accountant", "seed")
    return {"epsilon": p["epsilon"], "batch_size": p["batch_size"], "clip": p["clip"], **{k: config[k] for k in keys}}


def _lm_trainable(config: dict, task=None) -> None:
    import torch
    from ray import tune

    from hptransfer.dp.lm_task import run_dp_lm_finetune

    torch.set_num_threads(1)
    p = config["point"]
    m = run_dp_lm_finetune(
        task,
        **_trial_kwargs(config),
    )
    within = m["dp/epsilon"] <= p["epsilon"] + 1e-9
    status = "failed" if not within else ("ok" if math.isfinite(m["val_loss"]) else "diverged")
    tune.report(
        {
            "val_loss": m["val_loss"],
            "initial_val_loss": m["initial_val_loss"],
            "train_loss": m["train_loss"],
            "epsilon_spent": m["dp/epsilon"],
            "status": status,
        }
    )


def _digits_trainable(config: dict, task=None, body=None) -> None:
    import torch
    from ray import tune

    from hptransfer.dp.task import run_dp_finetune

    torch.set_num_threads(1)
    p = config["point"]
    m = run_dp_finetune(
        task,
        body,
        **_trial_kwargs(config),
    )
    ok = math.isfinite(m["test/accuracy"]) and m["dp/epsilon"] <= p["epsilon"] + 1e-9
    tune.report({"test_accuracy": m["test/accuracy"], "epsilon_spent": m["dp/epsilon"], "status": "ok" if ok else "failed"})


def plot_dp_sweep(df: pd.DataFrame, path: Path, kind: TaskKind = KINDS["lm"]) -> Path:
    import matplotlib.pyplot as plt

    eps = sorted(df.epsilon.unique())
    fig, axes = plt.subplots(1, len(eps), figsize=(5 * len(eps), 4), squeeze=False, sharey=True)
    for ax, e in zip(axes[0], eps):
        g = df[(df.epsilon == e) & (df.status == "ok")]
        by = g.groupby(["batch_size", "clip"])[kind.metric]
        best_lr = (by.min() if kind.mode == "min" else by.max()).reset_index()
        for b, gb in best_lr.groupby("batch_size"):
            chosen = bool(df[(df.epsilon == e) & (df.batch_size == b)].chosen_b.any())
            ax.plot(gb["clip"], gb[kind.metric], "o-", lw=2.5 if chosen else 1, label=f"B={b}" + (" (dp-plan)" if chosen else ""))
        ax.set_xscale("log")
        ax.set_title(f"ε = {e:g}")
        ax.set_xlabel("clipping bound C")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(f"{kind.label} (best LR)")
    fig.suptitle(f"DP fine-tuning: {kind.label} against C per batch size")
    return save_figure(fig, path)


def best_per_epsilon(df: pd.DataFrame, kind: TaskKind) -> pd.DataFrame:
    """Each ε's best ok trial by the task's metric."""
    ok = df[(df.status == "ok") & df[kind.metric].notna()]
    return ok.sort_values(kind.metric, ascending=kind.mode == "max").groupby("epsilon").tail(1).sort_values("epsilon")


def _task_setup(spec: StudySpec, task: str, width: int | None, pretrain_width: int, log):
    """(trainable with its data bound, N, params for MLflow, the task's data) for `task`."""
    from ray import tune

    if task == "lm":
        from hptransfer.dp.lm_task import load_lm_task

        lm = load_lm_task(spec, width)
        log(
            f"dp-sweep (lm): {spec.model.family}/{spec.model.parametrization} width {lm.width}, N={lm.private_size} "
            f"sequences of {spec.model.seq_len + 1} tokens, {'from ' + lm.init_from if lm.init_from else 'a fresh model'}"
        )
        return (
            tune.with_parameters(_lm_trainable, task=lm),
            lm.private_size,
            {"width": lm.width, "init_from": lm.init_from or "fresh"},
            lm,
        )
    if task == "digits":
        from hptransfer.dp.task import load_task, pretrain

        data = load_task()
        body = pretrain(data, width=pretrain_width, seed=spec.seed)
        return (
            tune.with_parameters(_digits_trainable, task=data, body=body),
            data.private_size,
            {"pretrain_width": pretrain_width},
            data,
        )
    raise DPError("--task", [f"--task must be one of {', '.join(TASKS)}, got {task!r}"])


def _save_grad_norms(study: StudyContext, spec: StudySpec, lm, log) -> None:
    """Per-example gradient norms of the trials' starting model on public sequences (those after the
    N private ones), for the plan's clipping bound C(ε) and re-weighting diagnostic; written
    atomically to the study's dp_grad_norms.json. Skipped, with a line, when the corpus has none."""
    from hptransfer.dp.ledger import corpus_name
    from hptransfer.dp.lm_task import per_example_grad_norms, public_sequences
    from hptransfer.io import write_json

    public = public_sequences(spec)
    if public is None:
        log("dp-sweep (lm): no public sequences beyond the N private ones: the plan keeps C = dp.clip_reference")
        return
    norms = per_example_grad_norms(lm, public, seed=spec.seed)
    write_json(
        study.paths.dp_grad_norms,
        {
            "norms": norms,
            "width": lm.width,
            "init_from": lm.init_from,
            "corpus": corpus_name(spec.data),  # the fine-tuning regime's tuning corpus: public data
            "source": "corpus sequences after the first N",
        },
    )
    log(
        f"dp-sweep (lm): per-example gradient norms of {len(norms)} public sequences, median {sorted(norms)[len(norms) // 2]:.4g}"
    )


def run_dp_sweep(
    study: StudyContext,
    *,
    task: str = "lm",
    width: int | None = None,
    epsilons: list[float] | None = None,
    lrs: list[float] | None = None,
    seeds: list[int] | None = None,
    pretrain_width: int = 64,
    restart: bool = False,
    log=print,
) -> pd.DataFrame:
    """Run (or resume) the DP sweep of `task` ("lm" or "digits"); returns its table (also written to
    the study's dp_sweep_results.csv). `width`: the LM's width (default: the spec's base width).
    The caller holds the study's lock (`hptransfer.pipeline.dp_sweep_stage`)."""
    spec = study.require_spec()
    if spec.dp is None:
        raise DPError(f"spec {spec.name!r} has no `dp:` block; add one (see search_spaces/dp-finetune.yaml)")
    if spec.dp.finetunes_pretrained:
        raise DPError(
            "dp.init_from",
            [
                "is `pretrain`: the DP sweeps of the fine-tuning regime start from the study's own pretrained models "
                "and run inside `hpt run SPEC` after the large run (in <study>/private/dp_sweep_w<width>/); run that, "
                "or give dp.init_from a handed-off folder"
            ],
        )
    if task not in KINDS:
        raise DPError("--task", [f"--task must be one of {', '.join(TASKS)}, got {task!r}"])
    kind = KINDS[task]
    epsilons = epsilons or [spec.dp.epsilon]
    if bad := [e for e in epsilons if not (e > 0)] or ([e for e in epsilons if math.isinf(e)] if task != "lm" else []):
        raise DPError(
            "--epsilons",
            [f"--epsilons {bad}: each ε must be > 0; inf (the noise-free arm, for the step curve) is for --task lm only"],
        )
    lrs = lrs or [spec.dp.lr or 3e-3]
    seeds = seeds or list(spec.sweep.seeds)
    trainable, n, task_params, data = _task_setup(spec, task, width, pretrain_width, log)
    if task == "lm":
        _save_grad_norms(study, spec, data, log)
    points = sweep_points(spec, epsilons, n)
    log(
        f"dp-sweep ({task}): {len(points) * len(lrs) * len(seeds)} trials over ε {epsilons}, "
        f"B {sorted({p['batch_size'] for p in points})}, {len(lrs)} LR(s), {len(seeds)} seed(s)"
    )

    def row(r) -> dict:
        c, m = r.config, r.metrics or {}
        return {
            **{k: c["point"][k] for k in POINT_KEYS},
            "lr": c["lr"],
            "seed": c["seed"],
            kind.metric: m.get(kind.metric, math.nan),
            **{k: m.get(k, math.nan) for k in kind.extra},
            "epsilon_spent": m.get("epsilon_spent", math.nan),
            "status": "failed" if r.error else m.get("status", "failed"),
            "trial_id": Path(r.path).name,
        }

    fingerprint = hashlib.sha256(
        json.dumps([study.spec_hash, task, task_params, n, points, lrs, seeds], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    sweep = SweepTask(
        experiment=DP_SWEEP_EXPERIMENT,
        trainable=trainable,
        axes={"point": points, "lr": lrs, "seed": seeds},
        resources={"cpu": 1},
        constants={"delta": spec.dp.delta, "epochs": spec.dp.epochs, "accountant": spec.dp.accountant},
        metric=kind.metric,
        mode=kind.mode,
        row=row,
        results_path=study.paths.dp_sweep_results,
        fingerprint=fingerprint,
        sort_by=["epsilon", "batch_size", "clip", "lr", "seed"],
        describe=lambda c: (
            f"ε={c['point']['epsilon']:g} B={c['point']['batch_size']} C={c['point']['clip']:.3g} "
            f"lr={c['lr']:.3g} seed={c['seed']}"
        ),
    )
    df, _ = run_sweep_task(study, sweep, restart=restart, log=log)
    plot = plot_dp_sweep(df, study.paths.dp_sweep_png, kind)
    best = {}
    for _, b in best_per_epsilon(df, kind).iterrows():
        e = b.epsilon
        best.update(
            {
                f"best_{kind.metric}_eps{e:g}": b[kind.metric],
                f"best_clip_eps{e:g}": b["clip"],
                f"best_batch_eps{e:g}": b.batch_size,
            }
        )
    log_sweep_runs(
        study,
        df,
        kind="dp-sweep",
        child_kind="dp-trial",
        run_name=f"{spec.name}-dp-sweep",
        parent_params={
            "task": task,
            **task_params,
            "dataset_size": n,
            "epsilons": epsilons,
            "lrs": lrs,
            "seeds": seeds,
            "delta": spec.dp.delta,
            "epochs": spec.dp.epochs,
            "accountant": spec.dp.accountant,
        },
        child_name=lambda r: f"eps{r['epsilon']:g}-B{r['batch_size']}-C{r['clip']:.3g}-lr{r['lr']:.3g}-s{r['seed']}",
        child_params=lambda r: {k: r[k] for k in ("epsilon", "batch_size", "clip", "lr", "seed", "sigma", "steps")},
        child_metrics=lambda r: {kind.metric: r[kind.metric], "epsilon_spent": r["epsilon_spent"]},
        parent_metrics=best,
        artifacts=[study.paths.dp_sweep_results, plot],
    )
    return df
