"""`hpt train PLAN`: a Ray Train TorchTrainer (gloo on CPU, NCCL on GPU) running `loop.py`."""

from __future__ import annotations

from pathlib import Path

from hptransfer.io import write_json
from hptransfer.train.dsconfig import PlanError
from hptransfer.transfer.plan import TransferPlan, load_plan, save_plan


def run_train(plan: TransferPlan | str | Path, out_dir: str | Path, *, tracking_uri: str | None = None,
              experiment: str | None = None, address: str | None = None,
              resume: bool = False, restart: bool = False, log=print) -> dict:
    """Run (or, with resume=True, continue from its latest checkpoint) the large run into out_dir."""
    import shutil

    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from hptransfer.spec import RaySpec
    from hptransfer.sweep.ray_session import ray_session
    from hptransfer.tracking import TAG_KIND, TAG_STUDY, MlflowTracker, NullTracker
    from hptransfer.train.dsconfig import deepspeed_config
    from hptransfer.train.loop import train_loop_per_worker

    plan = plan if isinstance(plan, TransferPlan) else load_plan(plan)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "ray_results" / "train"
    if previous.exists() and restart:
        shutil.rmtree(previous)
    elif previous.exists() and not resume:
        raise PlanError(f"{out} already holds a training run; pass --resume to continue it from its latest "
                        "checkpoint, or --restart to discard it")
    gpus = plan.train.gpus_per_worker
    ds_cfg = deepspeed_config(plan, plan.train.workers, bf16=gpus > 0)  # fail here, before any worker starts
    tracker = (MlflowTracker(tracking_uri, experiment or plan.study, run_name=f"{plan.study}-train",
                             tags={TAG_KIND: "train", TAG_STUDY: str(out.parent), "rule": plan.rule})
               if tracking_uri else NullTracker())
    tracker.log_params({"width": plan.target.width, "steps": plan.target.steps, "batch_size": plan.target.batch_size,
                        "rule": plan.rule, "parametrization": plan.model.parametrization, "family": plan.model.family,
                        "depth": plan.model.depth, "workers": plan.train.workers, "zero_stage": plan.train.zero_stage,
                        **{f"hp.{k}": v for k, v in plan.hyperparameters.items()}})
    write_json(out / "deepspeed_config.json", ds_cfg)
    log(f"train: width {plan.target.width}, {plan.target.steps} steps, global batch {plan.target.batch_size}, "
        f"{plan.train.workers} workers, ZeRO-{plan.train.zero_stage}, lr {plan.hyperparameters['lr']:.4g}")
    with ray_session(RaySpec(), address):
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"plan": plan.model_dump(mode="json"), "out_dir": str(out),
                               "tracking_uri": tracking_uri, "run_id": tracker.run_id, "bf16": gpus > 0},
            scaling_config=ScalingConfig(num_workers=plan.train.workers, use_gpu=gpus > 0,
                                         resources_per_worker={"CPU": plan.train.cpus_per_worker,
                                                               **({"GPU": gpus} if gpus else {})}),
            torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
            # Same name + storage path: Ray Train restores its checkpoint manager and hands the
            # loop the latest checkpoint (get_checkpoint) — both after a worker dies and on --resume.
            run_config=RunConfig(name="train", storage_path=str(out / "ray_results"),
                                 failure_config=FailureConfig(max_failures=plan.train.max_failures),
                                 checkpoint_config=CheckpointConfig(num_to_keep=plan.train.keep_checkpoints)),
        )
        try:
            result = trainer.fit()
        except Exception:
            tracker.end("FAILED")
            raise
    metrics = dict(result.metrics or {})
    save_plan(plan, out / "transfer_plan.yaml")
    for name in ("train_metrics.json", "deepspeed_config.json", "transfer_plan.yaml", "hf_model"):
        if (out / name).exists():
            tracker.log_artifact(out / name)
    tracker.log_metrics({f"final_{k}": v for k, v in metrics.items() if k in ("train_loss", "val_loss", "tokens_per_s")})
    tracker.end("FINISHED" if metrics.get("status") == "ok" else "FAILED")
    metrics["mlflow_run_id"] = tracker.run_id
    metrics["checkpoint"] = result.checkpoint.path if result.checkpoint else None
    return metrics
