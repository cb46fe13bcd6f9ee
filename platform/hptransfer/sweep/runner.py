"""Sweeps on Ray Tune: one machinery for every kind of trial (the µTransfer sweep, the DP sweep).

A `SweepTask` says what varies (Tune grid axes), which trainable runs a point, and how a finished
trial becomes a row of the results table. `run_sweep_task` runs it with what every sweep gets:
a resource check before any trial starts, progress lines that count trials kept from an
interrupted run, resume from Tune's experiment state (finished trials are not run again;
`restart=True` starts over), a failed trial recorded as `failed` without sinking the sweep, and
an atomically written table.

The main sweep's table `sweep_results.csv` has one row per trial: `width`, one column per tuned
hyperparameter (named as in the spec), `seed`, `val_loss`, `status` (ok | diverged | failed |
stopped), then `train_loss`, `steps_done`, `wall_s`, `train_s`, `trial_id`, `error`.
"""

from __future__ import annotations

import math
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from hptransfer.errors import SweepError
from hptransfer.io import write_atomic, write_checked
from hptransfer.layout import SWEEP_EXPERIMENT
from hptransfer.spec import PACKAGE_DEFAULTS_HINT, StudySpec, package_defaults_sweep_hash

if TYPE_CHECKING:
    from hptransfer.context import StudyContext


@dataclass
class SweepTask:
    experiment: str  # Tune experiment name: its folder under the study's ray_results/
    trainable: Callable  # a Tune function trainable (parameters bound with tune.with_parameters)
    axes: dict[str, list]  # grid axes; the trial set is their product (unless `searcher` hands out the trials)
    resources: dict[str, float]  # per trial, e.g. {"cpu": 1, "gpu": 0}
    metric: str
    mode: str  # "min" | "max"
    row: Callable[[Any], dict]  # a Tune Result → one row of the results table
    results_path: Path
    fingerprint: str  # what the sweep is of; a resume with another fingerprint is refused
    describe: Callable[[dict], str]  # a trial config → "width=32 lr=0.01 seed=0", for progress lines
    sort_by: list[str] = field(default_factory=list)
    status: Callable[[dict, dict], str] = lambda config, result: result.get("status", "ok")
    constants: dict[str, Any] = field(default_factory=dict)  # config entries that do not vary
    scheduler: Any = None
    reuse_actors: bool = True
    time_budget_s: float | None = None
    restart_also: tuple[Path, ...] = ()  # more state a restart moves aside (e.g. finished-trial markers)
    # A Tune Searcher that hands out the trials instead of a grid over `axes` (which then only
    # describe the sweep), and the number of trials it plans (for progress lines).
    searcher: Any = None
    planned: int | None = None
    note: str = ""  # appended to the "sweep: N trials (...)" line

    @property
    def total(self) -> int:
        return self.planned if self.planned is not None else math.prod(len(v) for v in self.axes.values())


def check_resources(need: dict[str, float], cluster: dict, fields: dict[str, str]) -> None:
    """Refuse before any trial starts if one trial cannot fit on the cluster (Tune would wait forever)."""
    over = [
        f"{fields.get(k, k)}={v:g} exceeds the cluster's {cluster.get(k.upper(), 0):g} {k.upper()}s"
        for k, v in need.items()
        if v > cluster.get(k.upper(), 0)
    ]
    if over:
        raise SweepError("; ".join(over) + "; lower the request, add nodes, or pass --address of a larger cluster")


# Experiments whose progress callback has begun in this driver: Tune calls no callback at all when it
# restores a sweep that had already finished, so run_sweep_task says "kept" itself then.
_ANNOUNCED: set[str] = set()


def _progress_callback(task: SweepTask):
    from ray.tune import Callback

    total, describe, status_of = task.total, task.describe, task.status

    class Progress(Callback):
        """One plain line per finished trial (readable in a TTY and in a CI log alike); a resumed
        sweep counts the trials it kept, so its ETA is about the trials still to run."""

        def __init__(self):
            self.done, self.kept, self.t0, self.started = 0, 0, time.time(), False

        def on_step_begin(self, iteration, trials, **info):
            if not self.started:
                self.started = True
                _ANNOUNCED.add(task.experiment)
                self.kept = self.done = sum(t.status == "TERMINATED" for t in trials)
                if self.kept:
                    from hptransfer.logs import progress

                    progress(f"[sweep] {self.kept}/{total} trials kept from the interrupted run")

        def _line(self, trial, status, value):
            self.done += 1
            elapsed = time.time() - self.t0
            ran = max(1, self.done - self.kept)
            planned = max(total, self.done)  # sweep.axes.bracket may add trials beyond the plan
            eta = elapsed / ran * (planned - self.done)
            # a module function, not a passed-in logger: Tune pickles its callbacks with the experiment state.
            from hptransfer.logs import progress

            progress(
                f"[sweep {self.done}/{planned}] {describe(trial.config)} -> {status} {task.metric}={value:.4f} | "
                f"{elapsed:.0f}s elapsed, ~{eta:.0f}s left"
            )

        def on_trial_complete(self, iteration, trials, trial, **info):
            r = trial.last_result or {}
            status = status_of(trial.config, r)
            if r.get("cached"):
                status += " (finished before a restart: not run again)"
            self._line(trial, status, float(r.get(task.metric, math.nan)))

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trial, "failed", math.nan)

    return Progress()


def _error_line(r) -> str:
    """The exception's own message (type: message and its detail lines), not the traceback's frames."""
    if not r.error:
        return ""
    lines = [
        ln.strip()
        for ln in str(r.error).strip().splitlines()
        if ln.strip() and not ln.strip().startswith("For further information")
    ]
    starts = [i for i, ln in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception|Exit)\b.*:", ln)]
    i = starts[-1] if starts else len(lines) - 1
    return " | ".join(lines[i : i + 4])[:300]


def _old_defaults_hint(study: StudyContext, stamp: str) -> str:
    """ "; <why>" when the stamped sweep is this spec's as an earlier version ran it (issue 36 item 1)."""
    spec = getattr(study, "spec", None)
    old = package_defaults_sweep_hash(spec) if isinstance(spec, StudySpec) else None
    return f"; {PACKAGE_DEFAULTS_HINT}" if old is not None and stamp.startswith(old) else ""


def run_sweep_task(study: StudyContext, task: SweepTask, *, restart: bool = False, log=print) -> tuple[pd.DataFrame, Any]:
    """Run (or resume) a sweep; returns its results table (also written to `task.results_path`) and
    Tune's ResultGrid."""
    from ray import tune

    exp_dir = study.paths.experiment_dir(task.experiment)
    stamp = study.paths.fingerprint(task.experiment)
    if restart:
        aside = study.move_aside(exp_dir, stamp, task.results_path, *task.restart_also)
        if aside:
            log(f"restart: the previous sweep was moved to {aside}")
    trainable = tune.with_resources(task.trainable, task.resources)
    from hptransfer import preempt

    # the watch after Ray is up: ray.init installs its own SIGTERM handler in the driver (exit 15)
    with study.ray_session(), preempt.watch("sweep", log=log) as sigterm:
        import ray

        check_resources(task.resources, ray.cluster_resources(), {"cpu": "cpus_per_trial", "gpu": "gpus_per_trial"})
        # Tune writes tuner.pkl before any trial and experiment_state-*.json once trials run; a
        # crash between the two leaves nothing worth resuming.
        resumable = exp_dir.exists() and tune.Tuner.can_restore(str(exp_dir)) and any(exp_dir.glob("experiment_state-*.json"))
        if exp_dir.exists() and not resumable:
            shutil.rmtree(exp_dir)
        if resumable:
            if stamp.exists() and stamp.read_text().strip() != task.fingerprint:
                raise SweepError(
                    f"{exp_dir} holds a sweep of a different spec; rerun with --restart to start over, or use another --study-dir"
                    + _old_defaults_hint(study, stamp.read_text().strip())
                )
            log(f"resuming the sweep in {exp_dir} (finished trials are kept; --restart starts over)")
            try:
                tuner = tune.Tuner.restore(str(exp_dir), trainable, resume_errored=False, restart_errored=False)
            except Exception as e:  # a corrupt state must not hide behind a bare traceback
                raise SweepError(
                    f"cannot resume the sweep in {exp_dir}: {type(e).__name__}: {e}; rerun with --restart to start over"
                ) from e
        else:
            write_atomic(stamp, task.fingerprint)
            grid = {} if task.searcher is not None else {k: tune.grid_search(list(v)) for k, v in task.axes.items()}
            tuner = tune.Tuner(
                trainable,
                param_space={**task.constants, **grid},
                # Reusing trial processes skips ~5 s of imports, corpus reading and first model build
                # per trial (benchmarks/sweep_overhead.py: 24 trials 302 s → 133 s).
                tune_config=tune.TuneConfig(
                    metric=task.metric,
                    mode=task.mode,
                    reuse_actors=task.reuse_actors,
                    scheduler=task.scheduler,
                    time_budget_s=task.time_budget_s,
                    search_alg=task.searcher,
                    num_samples=-1 if task.searcher is not None else 1,  # a searcher says when it is finished
                ),
                run_config=tune.RunConfig(
                    name=task.experiment,
                    storage_path=str(exp_dir.parent),
                    verbose=0,
                    callbacks=[_progress_callback(task), preempt.tune_forwarder()],
                    failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
                ),
            )
        log(f"sweep: {task.total} trials (" + " × ".join(f"{len(v)} {k}" for k, v in task.axes.items()) + task.note + ")")
        _ANNOUNCED.discard(task.experiment)
        grid = tuner.fit()
        if sigterm.requested:  # Tune stopped its trials and wrote its state: no table from a part of the sweep
            sigterm.settle()
            raise preempt.StagePreempted(
                f"the sweep stopped on SIGTERM; Tune's state is saved in {exp_dir} (finished trials are kept, the "
                "interrupted ones run again): run the same command again to continue"
            )
        if resumable and task.experiment not in _ANNOUNCED:
            from hptransfer.logs import progress  # plain text, as the callback's lines (no Rich markup)

            progress(f"[sweep] {len(grid)}/{task.total} trials kept from the earlier run: nothing left to train")
    rows = [{**task.row(r), "error": _error_line(r)} for r in grid]
    df = pd.DataFrame(rows)
    if task.sort_by and len(df):
        df = df.sort_values(task.sort_by).reset_index(drop=True)
    write_checked(task.results_path, df.to_csv(index=False))  # a sidecar tells a table cut short (io.torn)
    return df, grid


# --- the µTransfer sweep: widths × grid × seeds --------------------------------------------------

# Trial order. Tune starts trials in grid order, and the longest trials started last leave cores
# idle at the end of the sweep, so "widest-first" (longest-processing-time-first scheduling) is the
# default; "ascending" is the what-if `benchmarks/sweep_overhead.py --ascending-widths` measures.
TRIAL_ORDERS = ("widest-first", "ascending")


def ordered_widths(widths: list[int] | set[int], order: str = "widest-first") -> list[int]:
    """`widths` in the order their trials start."""
    if order not in TRIAL_ORDERS:
        raise ValueError(f"order must be one of {', '.join(TRIAL_ORDERS)}, got {order!r}")
    return sorted(widths, reverse=order == "widest-first")


def _scheduler(spec: StudySpec):
    from ray.tune.schedulers import ASHAScheduler

    if spec.sweep.scheduler == "asha":
        return ASHAScheduler(
            time_attr="step",
            max_t=spec.sweep.steps,
            grace_period=max(1, int(spec.sweep.steps * spec.sweep.asha_grace_fraction)),
            reduction_factor=spec.sweep.asha_reduction_factor,
        )
    return None


def lm_sweep_task(study: StudyContext, *, order: str = "widest-first", reuse_actors: bool = True) -> SweepTask:
    """The ladder as one Tune run: widths × seeds × grid, then `noise_seeds` replicates of each
    width's best point, handed out by `LadderSearcher` as soon as that width's grid is done."""
    import itertools

    from ray import tune

    from hptransfer.sweep.ladder import LadderSearcher
    from hptransfer.sweep.trial import tune_trainable

    spec = study.require_spec()
    grid, steps = list(spec.sweep.grid), spec.sweep.steps

    def status(config: dict, m: dict, error: bool = False) -> str:
        s = "failed" if error else m.get("status", "failed" if not m else "ok")
        # ended early by the scheduler (ASHA): its loss is from fewer steps (than its arm's own horizon)
        return "stopped" if s == "ok" and int(m.get("step", 0)) < int(m.get("steps_planned", steps)) else s

    def row(r) -> dict:
        c, m = r.config, r.metrics or {}
        s = status(c, m, bool(r.error))
        axes_cols = {}
        if spec.sweep.axes is not None:  # the arm's horizon, batch and depth, and the critical batch measured
            axes_cols = {
                "steps": int(c.get("steps", steps)),
                "batch_size": int(c.get("batch_size", spec.sweep.batch_size)),
                "depth": int(c.get("depth", spec.model.depth)),
                "noise_scale": float(m.get("noise_scale", math.nan)),
            }
        return {
            "width": c["width"],
            **{hp: c[hp] for hp in grid},
            "seed": c["seed"],
            **axes_cols,
            "val_loss": float(m.get("val_loss", math.nan)) if s in ("ok", "stopped") else math.nan,
            "status": s,
            "train_loss": float(m.get("train_loss", math.nan)),
            "steps_done": int(m.get("step", 0)),
            "wall_s": float(m.get("wall_s", math.nan)),
            "train_s": float(m.get("train_s", math.nan)),
            "trial_id": m.get("trial_id") or Path(r.path).name,
            "spec_hash": study.sweep_hash,
            "replicate": bool(c.get("replicate", False)),
        }

    widths = ordered_widths(spec.sweep.widths, order)
    axes = {"width": widths, "seed": list(spec.sweep.seeds), **{hp: list(v) for hp, v in spec.sweep.grid.items()}}
    points = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    if spec.sweep.axes is not None:
        # The ladder's points at its own (steps, batch_size), then each axis value's arm at one width.
        base = {"steps": steps, "batch_size": spec.sweep.batch_size}
        points = [{**p, **base} for p in points]
        for axis in ("steps", "batch_size", "depth"):
            for v in spec.sweep.axes_values(axis):
                arm = {**base, axis: v, "width": spec.axes_width}
                points += [
                    {**arm, "seed": s, **dict(zip(grid, g))}
                    for s in spec.sweep.seeds
                    for g in itertools.product(*spec.sweep.grid.values())
                ]
    replicate_seeds = [max(spec.sweep.seeds) + 1 + i for i in range(spec.sweep.noise_seeds)]
    searcher = LadderSearcher(
        points,
        grid,
        replicate_seeds,
        {w: i for i, w in enumerate(widths)},
        metric="val_loss",
        mode="min",
        ok=lambda result: status({}, result) == "ok",
        bracket=spec.sweep.axes.bracket if spec.sweep.axes is not None else 0,
        ladder_base={"steps": steps, "batch_size": spec.sweep.batch_size},
    )
    planned = len(points) + spec.sweep.n_arms * len(replicate_seeds)
    note = (f" + {len(replicate_seeds)} replicate seeds at each width's best point" if replicate_seeds else "") + (
        f"; plus {spec.sweep.n_arms - len(widths)} sweep.axes arms at width {spec.axes_width}, each with the grid and its own replicates"
        + (
            f", and up to {spec.sweep.n_bracket} more where an arm's best lr is an edge of what it tried (sweep.axes.bracket)"
            if spec.sweep.n_bracket
            else ""
        )
        if spec.sweep.axes
        else ""
    )
    if spec.sweep.search == "optuna":  # the same Tune run, Optuna handing out each width's points (sweep/search.py)
        from hptransfer.hyperparameters import LOG_SCALE
        from hptransfer.sweep.search import OptunaLadderSearcher

        # Narrowest first whatever `order` says: each width starts from what the narrower one found.
        o, ascending = spec.sweep.optuna_settings, sorted(spec.sweep.widths)
        budgets = o.budgets(len(ascending))
        searcher = OptunaLadderSearcher(
            [{"width": w} for w in ascending],
            spec.sweep.grid,
            LOG_SCALE,
            budgets,
            spec.sweep.seeds[0],
            replicate_seeds,
            {w: i for i, w in enumerate(ascending)},
            max_concurrent=o.max_concurrent,
            sampler_seed=o.sampler_seed,
            startup_trials=o.startup_trials,
            warm_start=o.warm_start_points,
            ok=lambda result: status({}, result) == "ok",
            status=lambda result: status({}, result),
        )
        axes = {"width": ascending}
        planned = sum(budgets) + len(ascending) * len(replicate_seeds)
        box = ", ".join(
            f"{hp} in [{lo:.3g}, {hi:.3g}]{' (log)' if hp in LOG_SCALE else ''}" for hp, (lo, hi) in spec.sweep.grid.items()
        )
        warm = f", each wider width from the narrower one's best {o.warm_start_points}" if o.warm_start_points else ""
        note = f" × {'/'.join(map(str, budgets))} Optuna TPE trials over {box}{warm}, {o.max_concurrent} at once" + note
    return SweepTask(
        experiment=SWEEP_EXPERIMENT,
        trainable=tune.with_parameters(tune_trainable, spec=spec, done_dir=str(study.paths.trials_done)),
        axes=axes,
        resources={"cpu": spec.sweep.cpus_per_trial, "gpu": spec.sweep.gpus_per_trial},
        metric="val_loss",
        mode="min",
        row=row,
        results_path=study.paths.sweep_results,
        # "/ladder": the grid and its replicates in one Tune run (an older two-run sweep is not resumed)
        fingerprint=f"{study.sweep_hash or ''}/ladder",
        sort_by=["width", *(["steps", "batch_size", "depth"] if spec.sweep.axes else []), *grid, "seed"],
        restart_also=(study.paths.trials_done,),
        describe=lambda c: (
            ("replicate " if c.get("replicate") else "")
            + f"width={c['width']} "
            + "".join(f"{a}={c[a]} " for a in ("steps", "batch_size", "depth") if a in c)
            + " ".join(f"{k}={c[k]:.3g}" for k in grid)
            + f" seed={c['seed']}"
        ),
        status=lambda c, m: status(c, m),
        scheduler=_scheduler(spec),
        reuse_actors=reuse_actors,
        time_budget_s=spec.sweep.wall_clock_budget_s,
        searcher=searcher,
        planned=planned,
        note=note,
    )


def replicate_points(spec: StudySpec, df: pd.DataFrame, order: str = "widest-first") -> list[dict]:
    """Each width's best grid point (seed-averaged ok losses) × `noise_seeds` new seeds."""
    from hptransfer.sweep.ladder import best_point

    tuned = list(spec.sweep.grid)
    new_seeds = [max(spec.sweep.seeds) + 1 + i for i in range(spec.sweep.noise_seeds)]
    points = []
    for width, g in df[df.status == "ok"].groupby("width"):
        rows = [{**{k: float(r[k]) for k in tuned}, "val_loss": float(r["val_loss"]), "ok": True} for _, r in g.iterrows()]
        best = best_point(rows, tuned)
        points += [{"width": int(width), **best, "seed": s} for s in new_seeds] if best else []
    rank = {w: i for i, w in enumerate(ordered_widths({p["width"] for p in points}, order))}
    return sorted(points, key=lambda p: rank[p["width"]])  # in the grid's order


def run_sweep(
    study: StudyContext, *, restart: bool = False, log=print, order: str = "widest-first", reuse_actors: bool = True
) -> tuple[pd.DataFrame, Any]:
    """The main sweep (widths × grid × seeds) and `noise_seeds` replicates of each width's best
    point (the sweep's own loss noise), in one Tune run. Returns the table (written to
    sweep_results.csv; replicate rows have `replicate` true) and Tune's ResultGrid. `restart` sets
    aside the sweep and the finished-trial markers. `order`
    (TRIAL_ORDERS) is the order trials start in; `reuse_actors=False` gives every trial a fresh
    process (both only change the sweep's wall time: the what-ifs of benchmarks/sweep_overhead.py)."""
    task = lm_sweep_task(study, order=order, reuse_actors=reuse_actors)
    return run_sweep_task(study, task, restart=restart, log=log)
