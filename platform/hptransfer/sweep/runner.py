"""`hpt sweep`: widths × hyperparameter grid × seeds as Ray Tune trials; a tidy results table.

The table `sweep_results.csv` has one row per trial: `width`, one column per tuned hyperparameter
(named as in the spec), `seed`, `val_loss`, `status` (ok | diverged | failed), then `train_loss`,
`steps_done`, `wall_s`, `trial_id`. Re-running the same command resumes an interrupted sweep from
Tune's experiment state (finished trials are not run again); `restart=True` starts over.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import pandas as pd

from hptransfer.io import write_atomic, write_yaml
from hptransfer.spec import StudySpec, spec_hash

RESULTS = "sweep_results.csv"
EXPERIMENT = "sweep"


class SweepError(RuntimeError):
    pass


def _param_space(spec: StudySpec, done_dir: Path) -> dict:
    from ray import tune

    space = {"spec": spec.model_dump(mode="json"), "done_dir": str(done_dir),
             "width": tune.grid_search(list(spec.sweep.widths)),
             "seed": tune.grid_search(list(spec.sweep.seeds))}
    space.update({hp: tune.grid_search(list(vals)) for hp, vals in spec.sweep.grid.items()})
    return space


def check_resources(spec: StudySpec, cluster: dict) -> None:
    """Refuse before any trial starts if one trial cannot fit on the cluster (Tune would wait forever)."""
    problems = [f"sweep.{field}={need:g} exceeds the cluster's {cluster.get(key, 0):g} {key}s"
                for field, key, need in (("cpus_per_trial", "CPU", spec.sweep.cpus_per_trial),
                                         ("gpus_per_trial", "GPU", spec.sweep.gpus_per_trial))
                if need > cluster.get(key, 0)]
    if problems:
        raise SweepError("; ".join(problems) + "; lower the request, add nodes, or pass --address of a larger cluster")


def _scheduler(spec: StudySpec):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if spec.sweep.scheduler == "asha":
        return ASHAScheduler(time_attr="step", max_t=spec.sweep.steps,
                             grace_period=max(1, int(spec.sweep.steps * spec.sweep.asha_grace_fraction)),
                             reduction_factor=spec.sweep.asha_reduction_factor)
    return FIFOScheduler()


def _progress_callback(total: int):
    from ray.tune import Callback

    class Progress(Callback):
        """One plain line per finished trial: readable in a TTY and in a CI log alike."""

        def __init__(self):
            self.done, self.t0, self.best = 0, time.time(), {}

        def _line(self, trial, status, loss):
            self.done += 1
            c = trial.config
            w = c["width"]
            if status.startswith("ok") and math.isfinite(loss):
                self.best[w] = min(self.best.get(w, math.inf), loss)
            hp = " ".join(f"{k}={c[k]:.3g}" for k in c["spec"]["sweep"]["grid"])
            elapsed = time.time() - self.t0
            eta = elapsed / self.done * (total - self.done)
            best = " ".join(f"{k}:{v:.3f}" for k, v in sorted(self.best.items()))
            # print, not a passed-in logger: Tune pickles its callbacks with the experiment state.
            print(f"[sweep {self.done}/{total}] width={w} {hp} seed={c['seed']} -> {status} "
                f"val_loss={loss:.4f} | best by width {best} | {elapsed:.0f}s elapsed, ~{eta:.0f}s left", flush=True)

        def on_trial_complete(self, iteration, trials, trial, **info):
            r = trial.last_result or {}
            status = r.get("status", "ok")
            if status == "ok" and r.get("step", 0) < trial.config["spec"]["sweep"]["steps"]:
                status = "stopped"
            if r.get("cached"):
                status += " (finished before a restart: not run again)"
            self._line(trial, status, float(r.get("val_loss", math.nan)))

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trial, "failed", math.nan)

    return Progress()


def results_table(result_grid, spec: StudySpec) -> pd.DataFrame:
    rows = []
    for r in result_grid:
        c, m = r.config, r.metrics or {}
        status = "failed" if r.error else m.get("status", "failed")
        if status == "ok" and int(m.get("step", 0)) < spec.sweep.steps:
            status = "stopped"  # ended early by the scheduler (ASHA): its loss is from fewer steps
        rows.append({
            "width": c["width"], **{hp: c[hp] for hp in spec.sweep.grid}, "seed": c["seed"],
            "val_loss": float(m.get("val_loss", math.nan)) if status in ("ok", "stopped") else math.nan,
            "status": status, "train_loss": float(m.get("train_loss", math.nan)),
            "steps_done": int(m.get("step", 0)), "wall_s": float(m.get("wall_s", math.nan)),
            "train_s": float(m.get("train_s", math.nan)), "trial_id": m.get("trial_id") or Path(r.path).name,
            "error": (str(r.error).strip().splitlines() or [""])[-1][:300] if r.error else "",
        })
    df = pd.DataFrame(rows)
    return df.sort_values(["width", *spec.sweep.grid, "seed"]).reset_index(drop=True)


def run_sweep(spec: StudySpec, study_dir: str | Path, *, address: str | None = None, restart: bool = False,
              log=print) -> tuple[pd.DataFrame, object]:
    """Run (or resume) the sweep; returns the results table and Tune's ResultGrid."""
    from ray import tune

    from hptransfer.sweep.ray_session import ray_session
    from hptransfer.sweep.trial import tune_trainable

    study_dir = Path(study_dir).resolve()
    storage = study_dir / "ray_results"
    exp_dir = storage / EXPERIMENT
    stamp = study_dir / ".sweep_spec_hash"
    if restart:
        for d in (exp_dir, study_dir / "trials_done"):
            shutil.rmtree(d, ignore_errors=True)
    total = len(spec.sweep.widths) * len(spec.sweep.seeds) * math.prod(len(v) for v in spec.sweep.grid.values())
    trainable = tune.with_resources(tune_trainable, {"cpu": spec.sweep.cpus_per_trial, "gpu": spec.sweep.gpus_per_trial})
    with ray_session(spec.ray, address):
        import ray

        check_resources(spec, ray.cluster_resources())
        # Tune writes tuner.pkl before any trial and experiment_state-*.json once trials run; a
        # crash between the two leaves nothing worth resuming.
        resumable = exp_dir.exists() and tune.Tuner.can_restore(str(exp_dir)) and any(exp_dir.glob("experiment_state-*.json"))
        if exp_dir.exists() and not resumable:
            shutil.rmtree(exp_dir)
        if resumable:
            if stamp.exists() and stamp.read_text().strip() != spec_hash(spec):
                raise SweepError(f"{exp_dir} holds a sweep of a different spec; rerun with --restart "
                                 "to start over, or use another --study-dir")
            log(f"resuming the sweep in {exp_dir} (finished trials are kept; --restart starts over)")
            try:
                tuner = tune.Tuner.restore(str(exp_dir), trainable, resume_errored=False, restart_errored=False)
            except Exception as e:  # a corrupt state must not hide behind a bare traceback
                raise SweepError(f"cannot resume the sweep in {exp_dir}: {type(e).__name__}: {e}; "
                                 "rerun with --restart to start over") from e
        else:
            write_atomic(stamp, spec_hash(spec))
            tuner = tune.Tuner(
                trainable,
                param_space=_param_space(spec, study_dir / "trials_done"),
                # Reusing trial processes skips ~5 s of imports, corpus reading and first model build
                # per trial (benchmarks/sweep_overhead.py: 24 trials 302 s → 133 s).
                tune_config=tune.TuneConfig(metric="val_loss", mode="min", reuse_actors=True,
                                            scheduler=_scheduler(spec)),
                run_config=tune.RunConfig(
                    name=EXPERIMENT, storage_path=str(storage), verbose=0,
                    callbacks=[_progress_callback(total)],
                    failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
                ),
            )
        log(f"sweep: {total} trials ({len(spec.sweep.widths)} widths × grid × {len(spec.sweep.seeds)} seeds)")
        grid = tuner.fit()
    df = results_table(grid, spec)
    write_atomic(study_dir / RESULTS, df.to_csv(index=False))
    write_yaml(study_dir / "spec.yaml", spec.model_dump(mode="json"))
    return df, grid
