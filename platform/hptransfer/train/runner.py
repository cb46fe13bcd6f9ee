"""`hpt train PLAN`: a Ray Train TorchTrainer (gloo on CPU, NCCL on GPU) running `loop.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hptransfer import logs
from hptransfer.errors import PlanError
from hptransfer.io import write_json
from hptransfer.plan import TransferPlan, save_plan

if TYPE_CHECKING:
    from hptransfer.study import Study


def run_train(
    study: Study, plan: TransferPlan, *, resume: bool = False, restart: bool = False, log=print, mlflow_every: int | None = None
) -> dict:
    """Run (or, with resume=True, continue from its latest checkpoint) the large run into the
    study's train/ folder. Rank 0's progress lines are printed (`hptransfer.logs.progress`) as they
    come; MLflow gets every step's metrics, written at most every 10 s of training (every
    `mlflow_every` steps if set)."""
    from hptransfer.train.dsconfig import deepspeed_config
    from hptransfer.train.loop import train_loop_per_worker

    paths = study.paths.train
    prepare_train_dir(study, plan, resume=resume, restart=restart, log=log)
    # Fail here, before any worker starts; the workers build the same config (train/loop.py).
    ds_cfg = deepspeed_config(plan, plan.train.workers, bf16=plan.train.precision == "bf16")
    tracker = study.tracker(f"{plan.study}-train", kind="train", tags={"rule": plan.rule})
    tracker.log_params(
        {
            "width": plan.target.width,
            "steps": plan.target.steps,
            "batch_size": plan.target.batch_size,
            "rule": plan.rule,
            "parametrization": plan.model.parametrization,
            "family": plan.model.family,
            "depth": plan.model.depth,
            "workers": plan.train.workers,
            "zero_stage": plan.train.zero_stage,
            "precision": plan.train.precision,
            **{f"hp.{k}": v for k, v in plan.hps.as_dict().items()},
        }
    )
    write_json(paths.deepspeed_config, ds_cfg)
    save_plan(plan, paths.plan)  # the plan this run trains (a resume checks it)
    log(
        f"train: width {plan.target.width}, {plan.target.steps} steps, global batch {plan.target.batch_size}, "
        f"{plan.train.workers} workers, ZeRO-{plan.train.zero_stage}, {plan.train.precision}, lr {plan.hps.lr:.4g}"
    )
    with study.ray_session():
        result = fit_on_ray_train(
            study,
            plan,
            train_loop_per_worker,
            {
                "plan": plan.model_dump(mode="json"),
                "out_dir": str(paths.root),
                "tracking_uri": study.tracking_uri,
                "experiment": study.experiment,
                "run_id": tracker.run_id,
                "mlflow_every": mlflow_every,
            },
            tracker,
        )
    metrics = dict(result.metrics or {})
    for path in (paths.metrics, paths.deepspeed_config, paths.plan, paths.hf_model):
        if path.exists():
            tracker.log_artifact(path)
    tracker.log_metrics({f"final_{k}": v for k, v in metrics.items() if k in ("train_loss", "val_loss", "tokens_per_s")})
    tracker.end("FINISHED" if metrics.get("status") == "ok" else "FAILED")
    metrics["mlflow_run_id"] = tracker.run_id
    metrics["checkpoint"] = result.checkpoint.path if result.checkpoint else None
    return metrics


def prepare_train_dir(study: Study, plan: TransferPlan, *, resume: bool, restart: bool, log=print) -> bool:
    """The train/ folder before a run (large or private): a restart moves the previous run aside, a
    plain rerun over one is refused, a resume must be of the same model. Returns True when a
    previous run of the same model is being continued."""
    paths = study.paths.train
    paths.root.mkdir(parents=True, exist_ok=True)
    logs.attach(study.paths.log_file)
    previous = paths.ray_experiment
    if previous.exists() and restart:
        aside = study.move_aside(paths.ray_storage, paths.metrics, paths.hf_model, paths.progress, paths.progress_log, paths.plan)
        log(f"restart: the previous large run was moved to {aside}")
        return False
    if previous.exists() and not resume:
        raise PlanError(
            f"{paths.root} already holds a training run; pass --resume to continue it from its latest "
            "checkpoint, or --restart to discard it"
        )
    if previous.exists() and paths.plan.is_file():
        _check_same_model(paths.plan, plan)
        return True
    return False


def fit_on_ray_train(study: Study, plan: TransferPlan, loop, loop_config: dict, tracker):
    """One Ray Train run of `loop` at the plan's scale (gloo on CPU, NCCL with GPUs), the large run's
    and the private run's alike; rank 0's progress lines are shown while it runs. Same name and
    storage path every time: Ray Train restores its checkpoint manager and hands the loop the latest
    checkpoint (`get_checkpoint`) — both after a worker dies and on --resume."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from hptransfer.study import TRAIN_EXPERIMENT

    paths, gpus = study.paths.train, plan.train.gpus_per_worker
    trainer = TorchTrainer(
        loop,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=plan.train.workers,
            use_gpu=gpus > 0,
            resources_per_worker={"CPU": plan.train.cpus_per_worker, **({"GPU": gpus} if gpus else {})},
        ),
        torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
        run_config=RunConfig(
            name=TRAIN_EXPERIMENT,
            storage_path=str(paths.ray_storage),
            failure_config=FailureConfig(max_failures=plan.train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=plan.train.keep_checkpoints),
        ),
    )
    try:
        with logs.follow(paths.progress_log):
            return trainer.fit()
    except Exception:
        tracker.end("FAILED")
        raise


def _check_same_model(previous_plan, plan: TransferPlan) -> None:
    """A resume must train the model the checkpoint holds: same family, shape and width."""
    from hptransfer.plan import load_plan

    old = load_plan(previous_plan)
    keys = {
        "model": (old.model.model_dump(), plan.model.model_dump()),
        "target.width": (old.target.width, plan.target.width),
        "base_width": (old.base_width, plan.base_width),
    }
    diff = [f"{k}: checkpoint has {a}, plan has {b}" for k, (a, b) in keys.items() if a != b]
    if diff:
        raise PlanError(
            f"cannot resume: the checkpoint in {previous_plan.parent} is of another model ("
            + "; ".join(diff)
            + "); pass --restart to discard it, or another --study-dir"
        )
