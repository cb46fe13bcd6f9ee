"""The large run's one training loop, one per Ray Train worker, for the plain run and the private
run alike; the recipe (`train/plain.py`: DeepSpeed, `train/private.py`: Opacus) says how to set up,
step, checkpoint and save (`train/recipe.py`). Reads top to bottom:

worker kit (rank, pid file, threads) → recipe set-up, from Ray Train's latest checkpoint if any →
tracker and progress → per step: stop? step, eval every `train.eval_every` and at the end,
divergence, metrics to MLflow and progress.json, a checkpoint every `train.checkpoint_every` →
final metrics → final checkpoint, train_metrics.json and the hand-off → the last report.

The worker kit (`WorkerKit`) is what every run's worker needs whatever it trains: the pid file, the
batched MLflow tracker, checkpoints handed to Ray Train, train_metrics.json and the hand-off.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hptransfer.layout import TrainPaths
from hptransfer.plan import TransferPlan

MLFLOW_FLUSH_S = 10.0  # rank 0 writes its buffered metrics to MLflow at most this often (and at checkpoints, at the end)


def recipes() -> dict[str, type]:
    """The worker recipes by name (`recipe.Launch.recipe`)."""
    from hptransfer.train.plain import PlainRecipe
    from hptransfer.train.private import PrivateRecipe

    return {"plain": PlainRecipe, "private": PrivateRecipe}


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train

    from hptransfer.train.progress import Progress

    kit = WorkerKit.start(config)
    plan, steps = kit.plan, kit.plan.target.steps
    recipe = recipes()[config["recipe"]](kit)
    restored = ray.train.get_checkpoint()
    if restored:
        with restored.as_directory() as d:
            client = recipe.setup(Path(d))
    else:
        client = recipe.setup(None)
    start, history = client.get("step", 0), client.get("history", [])
    tracker = kit.tracker(resumed_from=start if restored else None)
    progress = Progress(kit.paths, steps, start, enabled=kit.rank == 0)  # lines the driver prints; progress.json

    # A run resumed at its last step trains no more; its final metrics are those of that step.
    t0, tokens, status = time.perf_counter(), 0, "ok"
    metrics: dict[str, Any] = dict(history[-1]) if history else {"step": start}
    for step in range(start + 1, steps + 1):
        if stop := recipe.stop_before(step):
            status = stop
            break
        out = recipe.step(step)
        tokens += out.tokens
        metrics = {
            "step": step,
            "train_loss": out.train_loss,
            **out.extra,
            "lr": plan.hps.lr * recipe.lr_factor(step - 1),
            "tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9),
        }
        if (step % plan.train.eval_every == 0 or step == steps) and (val := recipe.evaluate()) is not None:
            metrics["val_loss"] = val  # (a recipe may evaluate on rank 0 only)
        if not math.isfinite(metrics["train_loss"]):
            status = metrics["status"] = "diverged"
        history.append(metrics)
        tracker.log_metrics({k: v for k, v in metrics.items() if k not in ("step", "status")}, step=step)
        if any(k in metrics for k in recipe.flush_keys):
            tracker.flush()
        progress.step(metrics)
        if status != "ok":
            break
        every = plan.train.checkpoint_every
        if every and step % every == 0 and step < steps:
            tracker.flush()  # MLflow holds every step up to the checkpoint
            kit.report(dict(metrics), kit.save_checkpoint(recipe, step, history))
            progress.checkpoint(step)

    tracker.flush()
    final = recipe.finish(
        {
            **metrics,
            "status": status,
            "wall_s": time.perf_counter() - t0,
            "resumed_from_step": start,
            "mlflow_log_s": tracker.seconds,
            "mlflow_writes": tracker.writes,
            "mlflow_first_write_s": tracker.first_s,
        }
    )
    folder = kit.save_checkpoint(recipe, final["step"], history)
    recipe.save(final, history)  # train_metrics.json and the hand-off
    progress.finish(final)
    kit.report(final, folder)
    recipe.check(final)


@dataclass
class WorkerKit:
    """One Ray Train worker's place in the run: what every recipe's worker needs."""

    config: dict[str, Any]
    plan: TransferPlan
    paths: TrainPaths
    rank: int
    world: int

    @classmethod
    def start(cls, config: dict[str, Any]) -> WorkerKit:
        """Read the plan, find this worker's rank, set its torch threads, leave its pid file."""
        import ray.train
        import torch

        plan = TransferPlan.model_validate(config["plan"])
        ctx = ray.train.get_context()
        kit = cls(config, plan, TrainPaths(Path(config["out_dir"])), ctx.get_world_rank(), ctx.get_world_size())
        torch.set_num_threads(max(1, int(plan.train.cpus_per_worker)))
        kit.paths.pids.mkdir(parents=True, exist_ok=True)
        (kit.paths.pids / f"rank{kit.rank}").write_text(str(os.getpid()))  # lets an operator (or a test) find a worker
        return kit

    def tracker(self, resumed_from: int | None):
        """Rank 0 logs every step's metrics; they reach MLflow in one write at most every
        MLFLOW_FLUSH_S seconds, at checkpoints and at the end (or every `mlflow_every` steps when
        set): a blocking write per step (~30-40 ms on SQLite) cost 12% of the loop at width 64, 2.4%
        at width 256 (benchmarks/train_throughput.py --mlflow; results/train_mlflow_batching*.json).
        The other ranks get the null tracker."""
        from hptransfer.tracking import BatchedMetrics, MlflowTracker, NullTracker

        c = self.config
        every_steps = c.get("mlflow_every")
        tracker = BatchedMetrics(
            MlflowTracker(c["tracking_uri"], c["experiment"], run_id=c["run_id"])
            if self.rank == 0 and c.get("run_id")
            else NullTracker(),
            every_steps=every_steps,
            every_s=None if every_steps else MLFLOW_FLUSH_S,
        )
        if resumed_from is not None:
            tracker.set_tags({"resumed_from_step": resumed_from})
        return tracker

    def save_checkpoint(self, recipe, step: int, history: list) -> Path:
        """The recipe's checkpoint of `step` (with the history so far) in a local folder."""
        folder = self.paths.checkpoints_local / f"step{step:07d}"
        recipe.save_checkpoint(folder, {"step": step, "history": history})
        return folder

    def report(self, metrics: dict, folder: Path) -> None:
        """Rank 0 hands the checkpoint in `folder` to Ray Train with `metrics` (every rank reports,
        as Ray Train requires); the local copy goes once Ray Train has persisted its own."""
        import ray.train

        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(folder)) if self.rank == 0 else None)
        if self.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)

    def write_metrics(self, body: dict[str, Any]) -> None:
        """train_metrics.json (rank 0): the final metrics, the history and the recipe's own blocks."""
        from hptransfer.io import write_json

        if self.rank == 0:
            write_json(self.paths.metrics, body)

    def save_handoff(self, module) -> None:
        """Weights plain `from_pretrained` reads correctly (µP's readout multiplier folded in), with
        the base shapes and plan beside them so hptransfer can continue µP training (rank 0)."""
        from hptransfer.models.handoff import save_handoff

        if self.rank == 0:
            plan = self.plan
            save_handoff(
                module,
                self.paths.hf_model,
                spec_model=plan.model,
                width=plan.target.width,
                base_width=plan.base_width,
                plan_dict=plan.model_dump(mode="json"),
            )
