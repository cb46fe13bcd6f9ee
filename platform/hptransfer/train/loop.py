"""The large run's training loop, one per Ray Train worker. Reads top to bottom:
plan → model (µP base shapes set before DeepSpeed sees it) → optimizer with the plan's per-group
LRs → DeepSpeed engine → resume from Ray Train's latest checkpoint, if any → steps over
deterministic batches → eval → periodic checkpoints → final checkpoint, HF model, report.

Device: the engine's (DeepSpeed moves the model to the GPU Ray Train assigned the worker, or keeps it
on the CPU); every batch goes there, and evaluation follows the model. `train.precision: bf16` is
DeepSpeed's bf16 mode (bf16 weights and compute, fp32 master weights in the optimizer), on a GPU and
on DeepSpeed's CPU accelerator alike (ZeRO 0-2 seen to work on CPU); losses are taken in fp32.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import torch

from hptransfer.plan import TransferPlan
from hptransfer.study import TrainPaths

CKPT_TAG = "state"
MLFLOW_FLUSH_S = 10.0  # rank 0 writes its buffered metrics to MLflow at most this often (and at checkpoints, at the end)


def build_engine(plan: TransferPlan, world: int):
    """The plan's model, optimizer, schedule and clipping (`training_setup`, as in sweep trials)
    wrapped in a DeepSpeed engine in `train.precision`, on the worker's device (with GPUs: the one
    Ray Train assigned, which DeepSpeed would otherwise guess from LOCAL_RANK). Returns
    (engine, ds_config, lr_factor)."""
    from types import SimpleNamespace

    import deepspeed

    from hptransfer.models import training_setup
    from hptransfer.models.device import worker_device
    from hptransfer.train.dsconfig import deepspeed_config
    from hptransfer.transfer.schedule import warmup_multiplier

    # The base schedule times the rule's multiplicative warmup (1 except for `sp-warmup`).
    run = training_setup(
        plan.model,
        plan.target.width,
        base_width=plan.base_width,
        hps=plan.hps,
        total_steps=plan.target.steps,
        seed=plan.seed,
        extra_lr_factor=lambda s: warmup_multiplier(s, plan),
        rule=plan.rule,
    )
    # gradient_clipping = the plan's grad_clip
    ds_cfg = deepspeed_config(plan, world, bf16=plan.train.precision == "bf16")
    device = worker_device(plan.train.gpus_per_worker)
    args = SimpleNamespace(device_rank=device.index or 0) if device.type == "cuda" else None
    # µP's parameter groups exist before DeepSpeed sees the optimizer.
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=run.model, optimizer=run.optimizer, config=ds_cfg, lr_scheduler=lambda opt: run.scheduler(opt)
    )
    return engine, ds_cfg, run.lr_factor


def train_step(engine, x: torch.Tensor, y: torch.Tensor, micro: int) -> torch.Tensor:
    """One optimizer step of this rank's slice in micro-batches (DeepSpeed accumulates, clips at the
    boundary, steps the optimizer and the LR schedule). The batch moves to the engine's device.
    Returns the last micro-batch's loss."""
    from hptransfer.models import lm_logits
    from hptransfer.models.build import lm_loss

    x, y = x.to(engine.device), y.to(engine.device)
    for i in range(0, len(x), micro):
        loss = lm_loss(lm_logits(engine, x[i : i + micro]), y[i : i + micro])
        engine.backward(loss)
        engine.step()
    return loss


def _full_weights(engine, ds_cfg: dict):
    """ZeRO-3 keeps only this rank's partition of each parameter (the module's tensors are empty
    placeholders): gather the full weights for the hand-off, read-only. Other stages hold them whole."""
    import contextlib

    if ds_cfg["zero_optimization"]["stage"] != 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)


def _save(engine, paths: TrainPaths, step: int, history: list, rank: int):
    """DeepSpeed checkpoint (a collective into one directory shared by all ranks), handed to Ray
    Train by rank 0 after a barrier; every rank reports, as Ray Train requires."""
    import ray.train
    import torch.distributed as dist

    d = paths.checkpoints_local / f"step{step:07d}"
    engine.save_checkpoint(str(d), tag=CKPT_TAG, client_state={"step": step, "history": history})
    dist.barrier()
    return d, (ray.train.Checkpoint.from_directory(str(d)) if rank == 0 else None)


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import torch.distributed as dist

    from hptransfer.data import open_corpus
    from hptransfer.io import write_json
    from hptransfer.models import evaluate
    from hptransfer.models.handoff import save_handoff
    from hptransfer.tracking import BatchedMetrics, MlflowTracker, NullTracker
    from hptransfer.train.progress import Progress

    plan = TransferPlan.model_validate(config["plan"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(plan.train.cpus_per_worker)))
    paths = TrainPaths(Path(config["out_dir"]))
    paths.pids.mkdir(parents=True, exist_ok=True)
    (paths.pids / f"rank{rank}").write_text(str(os.getpid()))  # lets an operator (or a test) find a worker
    steps, B, T = plan.target.steps, plan.target.batch_size, plan.target.seq_len
    engine, ds_cfg, lr_factor = build_engine(plan, world)  # on the worker's device, in train.precision

    if rank == 0:
        # What the running engine actually applies per parameter group (a test compares it with the plan).
        write_json(
            paths.engine_param_groups,
            [
                {
                    "lr": g.get("initial_lr", g["lr"]),
                    "weight_decay": g["weight_decay"],
                    "numel": sum(p.numel() for p in g["params"]),
                }
                for g in engine.optimizer.param_groups
            ],
        )
    start, history = 0, []
    restored = ray.train.get_checkpoint()
    if restored:
        with restored.as_directory() as d:
            _, client = engine.load_checkpoint(d, tag=CKPT_TAG)
        start, history = client["step"], client["history"]
    # Rank 0 logs every step's metrics; they reach MLflow in one write at most every MLFLOW_FLUSH_S
    # seconds, at checkpoints and at the end (or every `mlflow_every` steps when set): a blocking
    # write per step (~30-40 ms on SQLite) cost 12% of the loop at width 64, 2.4% at width 256
    # (benchmarks/train_throughput.py --mlflow; results/train_mlflow_batching*.json).
    every_steps = config.get("mlflow_every")
    tracker = BatchedMetrics(
        MlflowTracker(config["tracking_uri"], config["experiment"], run_id=config["run_id"])
        if rank == 0 and config.get("run_id")
        else NullTracker(),
        every_steps=every_steps,
        every_s=None if every_steps else MLFLOW_FLUSH_S,
    )
    if restored:
        tracker.set_tags({"resumed_from_step": start})
    corpus = open_corpus(plan.data, seq_len=T, steps=steps, batch_size=B)
    val = corpus.val_batches(plan.data.eval_batches, min(B, 16), T)
    micro = ds_cfg["train_micro_batch_size_per_gpu"]
    every = plan.train.checkpoint_every
    progress = Progress(paths, steps, start, enabled=rank == 0)  # lines the driver prints; progress.json
    # A run resumed at its last step trains no more; its final metrics are those of that step.
    t0, tokens, metrics = time.perf_counter(), 0, dict(history[-1]) if history else {"step": start}
    for step in range(start + 1, steps + 1):
        # The global batch of a step is a function of the step alone: every rank takes its slice,
        # so any worker count, and a resumed run, sees the same data.
        x, y = corpus.batch("train", step, B, T, seed=plan.seed)
        x, y = x[rank::world], y[rank::world]
        loss = train_step(engine, x, y, micro)
        tokens += B * T
        loss_t = loss.detach().clone()
        dist.all_reduce(loss_t)
        metrics = {
            "step": step,
            "train_loss": loss_t.item() / world,
            "lr": plan.hps.lr * lr_factor(step - 1),
            "tokens_per_s": tokens / (time.perf_counter() - t0),
        }
        if step % plan.train.eval_every == 0 or step == steps:
            metrics["val_loss"] = evaluate(engine.module, val)  # on the model's device, in its dtype
        if not math.isfinite(metrics["train_loss"]):
            metrics["status"] = "diverged"
        history.append(metrics)
        tracker.log_metrics({k: v for k, v in metrics.items() if k != "step"}, step=step)
        progress.step(metrics)
        if metrics.get("status") == "diverged":
            break
        if every and step % every == 0 and step < steps:
            tracker.flush()  # MLflow holds every step up to the checkpoint
            d, ckpt = _save(engine, paths, step, history, rank)
            ray.train.report(metrics, checkpoint=ckpt)
            if rank == 0:
                shutil.rmtree(d, ignore_errors=True)  # Ray Train has persisted its own copy
            progress.checkpoint(step)

    tracker.flush()
    metrics = {
        **metrics,
        "wall_s": time.perf_counter() - t0,
        "resumed_from_step": start,
        "mlflow_log_s": tracker.seconds,
        "mlflow_writes": tracker.writes,
        "mlflow_first_write_s": tracker.first_s,
    }
    metrics.setdefault("status", "ok")
    d, ckpt = _save(engine, paths, metrics["step"], history, rank)
    if rank == 0:
        write_json(paths.metrics, {"final": metrics, "history": history, "deepspeed_config": ds_cfg})
    with _full_weights(engine, ds_cfg):  # every rank enters: under ZeRO-3 the gather is a collective
        if rank == 0:
            # Weights plain `from_pretrained` reads correctly (µP's readout multiplier folded in), with
            # the base shapes and plan beside them so hptransfer can continue µP training.
            save_handoff(
                engine.module,
                paths.hf_model,
                spec_model=plan.model,
                width=plan.target.width,
                base_width=plan.base_width,
                plan_dict=plan.model_dump(mode="json"),
            )
    progress.finish(metrics)
    ray.train.report(metrics, checkpoint=ckpt)
    if rank == 0:
        shutil.rmtree(d, ignore_errors=True)
