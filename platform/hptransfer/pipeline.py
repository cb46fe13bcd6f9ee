"""The pipeline as plain functions (each CLI verb calls one): validate → coord-check → sweep →
transfer → train. Each stage reads and writes files in the study folder, so a user can stop,
inspect, edit and resume anywhere.

study_dir/
  spec.yaml               the validated spec (the study's own copy)
  coord_check.{png,json}  activation size against width
  sweep_results.csv       one row per trial;   sweep.png  the µTransfer plot
  transfer_plan.yaml      the target's hyperparameters and the evidence behind them
  train/                  train_metrics.json, deepspeed_config.json, hf_model/, ray_results/ (checkpoints)
  report/index.html       the study as one page a user can open or attach
  mlflow.db               the MLflow store (unless a tracking URI is given)
"""

from __future__ import annotations

import time
from pathlib import Path

from hptransfer.io import write_yaml
from hptransfer.spec import StudySpec, load_spec
from hptransfer.tracking import resolve_tracking_uri


def default_study_dir(spec: StudySpec) -> Path:
    return Path("studies") / spec.name


def _spec(spec: StudySpec | str | Path) -> StudySpec:
    return spec if isinstance(spec, StudySpec) else load_spec(spec)


def coord_check_stage(spec, study_dir=None):
    from hptransfer.coordcheck import coord_check

    spec = _spec(spec)
    return coord_check(spec, Path(study_dir or default_study_dir(spec)))


def sweep_stage(spec, study_dir=None, *, tracking_uri=None, address=None, restart=False, log=print):
    from hptransfer.sweep.record import log_sweep, plot_sweep
    from hptransfer.sweep.runner import run_sweep

    spec = _spec(spec)
    study_dir = Path(study_dir or default_study_dir(spec)).resolve()
    df, grid = run_sweep(spec, study_dir, address=address, restart=restart, log=log)
    plot = plot_sweep(df, spec, study_dir / "sweep.png")
    uri = resolve_tracking_uri(study_dir, spec.tracking.uri, tracking_uri)
    run_id = log_sweep(spec, study_dir, df, grid, uri, plot=plot)
    return df, run_id


def transfer_stage(spec, study_dir=None, *, sweep_run_id: str | None = None):
    import pandas as pd

    from hptransfer.transfer.engine import file_hash, make_plan
    from hptransfer.transfer.plan import save_plan

    spec = _spec(spec)
    study_dir = Path(study_dir or default_study_dir(spec)).resolve()
    results = study_dir / "sweep_results.csv"
    if not results.exists():
        raise FileNotFoundError(f"{results} not found: run `hpt sweep` first")
    plan = make_plan(spec, pd.read_csv(results), provenance={
        "results_hash": file_hash(results), **({"mlflow_sweep_run_id": sweep_run_id} if sweep_run_id else {})})
    return save_plan(plan, study_dir / "transfer_plan.yaml"), plan


def train_stage(plan_path, study_dir=None, *, tracking_uri=None, address=None, workers=None, gpus_per_worker=None,
                cpus_per_worker=None, resume=False, restart=False, log=print):
    from hptransfer.train.runner import run_train
    from hptransfer.transfer.plan import load_plan

    plan = load_plan(plan_path)
    knobs = {k: v for k, v in (("workers", workers), ("gpus_per_worker", gpus_per_worker),
                               ("cpus_per_worker", cpus_per_worker)) if v is not None}
    if knobs:  # command-line scale knobs override the plan's train settings
        plan = plan.model_copy(update={"train": plan.train.model_copy(update=knobs)})
    study_dir = Path(study_dir or Path(plan_path).parent).resolve()
    uri = resolve_tracking_uri(study_dir, None, tracking_uri)
    return run_train(plan, study_dir / "train", tracking_uri=uri, address=address,
                     resume=resume, restart=restart, log=log)


def run_study(spec, study_dir=None, *, tracking_uri=None, address=None, restart=False, skip_coord_check=False, log=print) -> dict:
    """Everything, end to end. Returns where things are."""
    from hptransfer.coordcheck import describe

    spec = _spec(spec)
    study_dir = Path(study_dir or default_study_dir(spec)).resolve()
    study_dir.mkdir(parents=True, exist_ok=True)
    write_yaml(study_dir / "spec.yaml", spec.model_dump(mode="json"))
    t0, times = time.time(), {}
    if not skip_coord_check:
        r = coord_check_stage(spec, study_dir)
        log(describe(r))
        times["coord_check_s"] = time.time() - t0
    t = time.time()
    df, sweep_run = sweep_stage(spec, study_dir, tracking_uri=tracking_uri, address=address, restart=restart, log=log)
    times["sweep_s"] = time.time() - t
    plan_path, plan = transfer_stage(spec, study_dir, sweep_run_id=sweep_run)
    log(f"transfer ({plan.rule}): target width {plan.target.width} gets lr={plan.hyperparameters['lr']:.4g}"
        + "".join(f"\n  warning: {w}" for w in plan.diagnostics.get("warnings", [])))
    t = time.time()
    # A re-run continues an interrupted large run (or finds it finished) instead of refusing.
    metrics = train_stage(plan_path, study_dir, tracking_uri=tracking_uri, address=address, resume=not restart,
                          restart=restart, log=log)
    times["train_s"] = time.time() - t
    from hptransfer.report.html import write_report

    uri = resolve_tracking_uri(study_dir, spec.tracking.uri, tracking_uri)
    report = write_report(study_dir, tracking_uri=uri, log=log)
    times["total_s"] = time.time() - t0
    return {"study_dir": str(study_dir), "plan": str(plan_path), "results": str(study_dir / "sweep_results.csv"),
            "train_metrics": str(study_dir / "train" / "train_metrics.json"), "report": str(report),
            "tracking_uri": uri,
            "final": {k: metrics.get(k) for k in ("train_loss", "val_loss", "tokens_per_s")}, "times": times}
