"""The large run's training loop, one per Ray Train worker. Reads top to bottom:
plan → model (µP base shapes set before DeepSpeed sees it) → optimizer with the plan's per-group
LRs → DeepSpeed engine → resume from Ray Train's latest checkpoint, if any → steps over
deterministic batches → eval → periodic checkpoints → final checkpoint, HF model, report.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import torch

CKPT_TAG = "state"


def _save(engine, out: Path, step: int, history: list, rank: int):
    """DeepSpeed checkpoint (a collective into one directory shared by all ranks), handed to Ray
    Train by rank 0 after a barrier; every rank reports, as Ray Train requires."""
    import ray.train
    import torch.distributed as dist

    d = out / "checkpoints_local" / f"step{step:07d}"
    engine.save_checkpoint(str(d), tag=CKPT_TAG, client_state={"step": step, "history": history})
    dist.barrier()
    return d, (ray.train.Checkpoint.from_directory(str(d)) if rank == 0 else None)


def train_loop_per_worker(config: dict) -> None:
    import deepspeed
    import ray.train
    import torch.distributed as dist

    from hptransfer.data import load_corpus
    from hptransfer.io import write_json
    from hptransfer.models import build_model, build_optimizer, lm_logits, lr_schedule
    from hptransfer.sweep.trial import evaluate
    from hptransfer.tracking import MlflowTracker, NullTracker
    from hptransfer.train.dsconfig import deepspeed_config
    from hptransfer.transfer.plan import TransferPlan
    from hptransfer.transfer.schedule import warmup_multiplier

    plan = TransferPlan.model_validate(config["plan"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(plan.train.cpus_per_worker)))
    out = Path(config["out_dir"])
    (out / "pids").mkdir(parents=True, exist_ok=True)
    (out / "pids" / f"rank{rank}").write_text(str(os.getpid()))  # lets an operator (or a test) find a worker
    hps = plan.hyperparameters
    steps, B, T = plan.target.steps, plan.target.batch_size, plan.target.seq_len

    def lr_factor(s: int) -> float:
        # The base schedule times the rule's multiplicative warmup (1 except for `sp-warmup`).
        return lr_schedule(s, steps, hps.get("warmup_steps", 0)) * warmup_multiplier(s, plan)

    model = build_model(plan.model, plan.target.width, base_width=plan.base_width, seed=plan.seed)
    optimizer = build_optimizer(model, plan.model.parametrization, hps)  # µP groups exist before DeepSpeed
    ds_cfg = deepspeed_config(plan, world, bf16=config.get("bf16", False))
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ds_cfg,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_factor))

    if rank == 0:
        # What the running engine actually applies per parameter group (a test compares it with the plan).
        write_json(out / "engine_param_groups.json", [
            {"lr": g.get("initial_lr", g["lr"]), "weight_decay": g["weight_decay"],
             "numel": sum(p.numel() for p in g["params"])} for g in engine.optimizer.param_groups])
    start, history = 0, []
    restored = ray.train.get_checkpoint()
    if restored:
        with restored.as_directory() as d:
            _, client = engine.load_checkpoint(d, tag=CKPT_TAG)
        start, history = client["step"], client["history"]
    tracker = (MlflowTracker(config["tracking_uri"], "", run_id=config["run_id"])
               if rank == 0 and config.get("run_id") else NullTracker())
    if restored:
        tracker.set_tags({"resumed_from_step": start})
    corpus = load_corpus(plan.data.val_fraction, plan.data.max_files)
    val = corpus.val_batches(plan.data.eval_batches, min(B, 16), T)
    micro = ds_cfg["train_micro_batch_size_per_gpu"]
    every = plan.train.checkpoint_every
    t0, tokens, metrics = time.perf_counter(), 0, {"step": start}
    for step in range(start + 1, steps + 1):
        # The global batch of a step is a function of the step alone: every rank takes its slice,
        # so any worker count, and a resumed run, sees the same data.
        x, y = corpus.batch("train", step, B, T, seed=plan.seed)
        x, y = x[rank::world], y[rank::world]
        for i in range(0, len(x), micro):
            logits = lm_logits(engine, x[i:i + micro])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + micro].reshape(-1))
            engine.backward(loss)
            engine.step()
        tokens += B * T
        loss_t = loss.detach().clone()
        dist.all_reduce(loss_t)
        metrics = {"step": step, "train_loss": loss_t.item() / world, "lr": hps["lr"] * lr_factor(step - 1),
                   "tokens_per_s": tokens / (time.perf_counter() - t0)}
        if step % plan.train.eval_every == 0 or step == steps:
            metrics["val_loss"] = evaluate(engine.module, val)
        if not math.isfinite(metrics["train_loss"]):
            metrics["status"] = "diverged"
        history.append(metrics)
        tracker.log_metrics({k: v for k, v in metrics.items() if k != "step"}, step=step)
        if metrics.get("status") == "diverged":
            break
        if every and step % every == 0 and step < steps:
            d, ckpt = _save(engine, out, step, history, rank)
            ray.train.report(metrics, checkpoint=ckpt)
            if rank == 0:
                shutil.rmtree(d, ignore_errors=True)  # Ray Train has persisted its own copy
                write_json(out / "progress.json", {"step": step, "checkpoint_step": step})

    metrics = {**metrics, "wall_s": time.perf_counter() - t0, "resumed_from_step": start}
    metrics.setdefault("status", "ok")
    d, ckpt = _save(engine, out, metrics["step"], history, rank)
    if rank == 0:
        write_json(out / "train_metrics.json", {"final": metrics, "history": history, "deepspeed_config": ds_cfg})
        if hasattr(engine.module, "save_pretrained"):
            engine.module.save_pretrained(str(out / "hf_model"))  # MuReadout saves as a plain Linear
    ray.train.report(metrics, checkpoint=ckpt)
    if rank == 0:
        shutil.rmtree(d, ignore_errors=True)
