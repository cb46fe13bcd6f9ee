"""The large run's one training loop, one per Ray Train worker, for the plain run and the private
run alike; the recipe (`train/plain.py`: DeepSpeed, `train/private.py`: Opacus) says how to set up,
step, checkpoint and save (`train/recipe.py`). Reads top to bottom:

worker kit (rank, pid file, threads) → recipe set-up, from Ray Train's latest whole checkpoint if
any (a torn one is skipped for the one before it: train/checkpoints.py) → tracker and progress →
per step: stop? step, eval every `train.eval_every` and at the end, divergence, metrics to MLflow
and progress.json, a checkpoint every `train.checkpoint_every`, a stop request (SIGTERM to the
driver: train/runner.py) → final metrics → final checkpoint, train_metrics.json and the hand-off →
the last report. A stopped run ends after its step with a checkpoint (unless the last one is younger
than `train.stop_checkpoint_after_s`) and reports status `preempted`, writing nothing final.

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
    restored, notes = kit.restorable(ray.train.get_checkpoint())
    client = recipe.setup(restored)
    start, history = client.get("step", 0), client.get("history", [])
    kit.checkpointed(start, restored)
    tracker = kit.tracker(resumed_from=start if restored else None)
    notes += getattr(recipe, "notes", [])  # e.g. a checkpoint of another worker count, converted
    Progress.say(kit.paths, notes, enabled=kit.rank == 0)  # torn checkpoints skipped, before "resumed from"
    progress = Progress(kit.paths, steps, start, enabled=kit.rank == 0)  # lines the driver prints; progress.json

    # A run resumed at its last step trains no more; its final metrics are those of that step.
    t0, tokens, status = time.perf_counter(), 0, "ok"
    metrics: dict[str, Any] = dict(history[-1]) if history else {"step": start}
    for step in range(start + 1, steps + 1):
        if stop := recipe.stop_before(step):
            status = stop
            break
        out = recipe.step(step)
        kit.rss_steps_max_mb = max(kit.rss_steps_max_mb, rss_mb())
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
            kit.report(dict(metrics), kit.save_checkpoint(recipe, step, history, say=progress.line))
            progress.checkpoint(kit.last_step)
        if step < steps and kit.stop_requested():
            status = "preempted"
            break

    tracker.flush()
    if status == "preempted":
        return kit.stop(recipe, metrics, history, progress)
    final = recipe.finish(
        {
            **metrics,
            "status": status,
            "wall_s": time.perf_counter() - t0,
            "resumed_from_step": start,
            "mlflow_log_s": tracker.seconds,
            "mlflow_writes": tracker.writes,
            "mlflow_first_write_s": tracker.first_s,
            "memory_per_rank": kit.memory_per_rank(),
            "placement": kit.placement(),
        }
    )
    folder = kit.save_checkpoint(recipe, final["step"], history, say=progress.line)
    recipe.save(final, history)  # train_metrics.json and the hand-off
    progress.finish(final)
    kit.report(final, folder)
    recipe.check(final)


def rss_mb() -> float:
    """This process's resident set now (MB), from /proc (Linux; 0 where there is none)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class WorkerKit:
    """One Ray Train worker's place in the run: what every recipe's worker needs."""

    config: dict[str, Any]
    plan: TransferPlan
    paths: TrainPaths
    rank: int
    world: int
    last_step: int = 0  # the step of the newest checkpoint (restored or written)
    last_time: float = 0.0  # when it was written (restored: when this session began)
    last_bytes: int | None = None  # its size (the next one's is about the same: the full-disk pre-check)
    rss_start_mb: float = 0.0  # resident memory before the model is built (a recipe sets it after its imports)
    rss_steps_max_mb: float = 0.0  # the largest resident memory seen at a step's end (training, not set-up)

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
        kit.mark_memory_start()
        return kit

    def mark_memory_start(self) -> None:
        """The baseline of `memory_per_rank`: a recipe calls it again after its heavy imports."""
        self.rss_start_mb = rss_mb()

    def memory_per_rank(self) -> list[dict[str, float]]:
        """Every rank's memory, gathered to all (MB): the resident set before the model was built,
        its peak over the whole run (`ru_maxrss`: set-up included, where every rank holds the whole
        model before DeepSpeed partitions it), the largest seen at a step's end (what training holds:
        the figure ZeRO stages and offload change on the host), and on a GPU the peak allocated
        device memory."""
        import resource

        import torch

        mine = [self.rss_start_mb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, self.rss_steps_max_mb]
        mine.append(torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else float("nan"))
        rows = [mine]
        if self.world > 1:
            import torch.distributed as dist

            t = torch.tensor(mine, dtype=torch.float64)
            out = [torch.zeros_like(t) for _ in range(self.world)]
            dist.all_gather(out, t)
            rows = [o.tolist() for o in out]
        keys = ("rss_start_mb", "rss_peak_mb", "rss_steps_max_mb", "device_peak_mb")  # ru_maxrss: KiB on Linux
        return [{k: round(v, 1) for k, v in zip(keys, r) if math.isfinite(v)} for r in rows]

    def placement(self) -> dict[str, Any]:
        """Where every rank ran, gathered to all: its Ray node, host and pid, and how many nodes the
        group spans (a run spread over nodes says so in its record, not only in Ray's dashboard)."""
        import socket

        import ray

        mine = {
            "rank": self.rank,
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        rows = [mine]
        if self.world > 1:
            import torch.distributed as dist

            rows = [None] * self.world
            dist.all_gather_object(rows, mine)
        return {"ranks": rows, "nodes": len({r["node_id"] for r in rows})}

    def tracker(self, resumed_from: int | None):
        """Rank 0 logs every step's metrics; they reach MLflow in one write at most every
        MLFLOW_FLUSH_S seconds, at checkpoints and at the end (or every `mlflow_every` steps when
        set): a blocking write per step (~30-40 ms on SQLite) cost 12% of the loop at width 64, 2.4%
        at width 256 (benchmarks/train_throughput.py --mlflow; results/train_mlflow_batching*.json).
        A write MLflow does not take (server down) is spooled to the study folder, not raised
        (tracking.Spooled). The other ranks get the null tracker."""
        from hptransfer.tracking import BatchedMetrics, MlflowTracker, NullTracker, Spooled, fail_quickly

        c = self.config
        every_steps = c.get("mlflow_every")
        fail_quickly()  # a server that is down costs a step seconds, not minutes of retries
        tracker = BatchedMetrics(
            Spooled(
                MlflowTracker(c["tracking_uri"], c["experiment"], run_id=c["run_id"]), self.paths.mlflow_unsent, c["tracking_uri"]
            )
            if self.rank == 0 and c.get("run_id")
            else NullTracker(),
            every_steps=every_steps,
            every_s=None if every_steps else MLFLOW_FLUSH_S,
        )
        if resumed_from is not None:
            tracker.set_tags({"resumed_from_step": resumed_from})
        return tracker

    def restorable(self, checkpoint) -> tuple[Path | None, list[str]]:
        """The folder of the newest whole checkpoint at or before Ray Train's latest (storage is a
        filesystem every worker sees), and the lines that tell the user about torn ones skipped."""
        from hptransfer.train.checkpoints import newest_good

        if checkpoint is None:
            return None, []
        folder, skipped = newest_good(Path(checkpoint.path))
        notes = [f"train: checkpoint {s}: torn (cut short while written), skipped" for s in skipped]
        if skipped and folder is not None:
            notes.append(f"train: resuming from the previous whole checkpoint, {folder.name}")
        elif skipped:
            notes.append("train: no whole checkpoint is left: the run starts over from step 0")
        return folder, notes

    def checkpointed(self, step: int, folder: Path | None) -> None:
        from hptransfer.train.checkpoints import manifest_bytes

        self.last_step, self.last_time = step, time.time()
        self.last_bytes = manifest_bytes(folder) if folder is not None else None

    def agree(self, flag: bool) -> bool:
        """True on every rank when it is True on any (rank 0 decides what the others cannot see)."""
        if self.world == 1:
            return flag
        import torch
        import torch.distributed as dist

        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def stop_requested(self) -> bool:
        """The driver asked the run to stop (it got SIGTERM): rank 0 sees its file, every rank agrees."""
        return self.agree(self.rank == 0 and self.paths.stop_request.exists())

    def save_checkpoint(self, recipe, step: int, history: list, say=print) -> Path | None:
        """The recipe's checkpoint of `step` (with the history so far) in a local folder, its
        manifest written last (rank 0). None, with a line said, when it would not fit on the disk:
        the previous checkpoint stays the newest. A write that fills the disk anyway removes its
        partial folder and raises CheckpointSpaceError (Ray Train restarts from the previous one)."""
        from hptransfer.train.checkpoints import CheckpointSpaceError, is_full_disk, remove_partial, space_problem, write_manifest

        folder = self.paths.checkpoints_local / f"step{step:07d}"
        short = space_problem(self.last_bytes, folder, self.paths.ray_storage) if self.rank == 0 else None
        if self.agree(short is not None):
            say(
                f"train: checkpoint of step {step} skipped: {short}. The checkpoint of step {self.last_step} "
                "is kept and training goes on; free space for the next one"
            )
            return None
        try:
            recipe.save_checkpoint(folder, {"step": step, "history": history})
            if self.rank == 0:
                self.last_bytes = write_manifest(folder)["bytes"]
        except Exception as e:
            if not is_full_disk(e, folder):
                raise
            remove_partial(folder)
            raise CheckpointSpaceError(
                28,
                f"no space left on the device while writing the checkpoint of step {step} to {folder}: the partial "
                f"checkpoint was removed and the checkpoint of step {self.last_step} is intact; Ray Train restarts from "
                "it (train.max_failures) and skips a checkpoint that does not fit; if the run stops, free space and "
                f"continue with --resume ({type(e).__name__}: {str(e)[:200]})",
            ) from e
        self.last_step, self.last_time = step, time.time()
        return folder

    def report(self, metrics: dict, folder: Path | None) -> None:
        """Rank 0 hands the checkpoint in `folder` (None: none this time) to Ray Train with `metrics`
        (every rank reports, as Ray Train requires); the local copy goes once Ray Train has persisted its own."""
        import ray.train

        checkpoint = ray.train.Checkpoint.from_directory(str(folder)) if self.rank == 0 and folder is not None else None
        ray.train.report(metrics, checkpoint=checkpoint)
        if self.rank == 0 and folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def stop(self, recipe, metrics: dict[str, Any], history: list, progress) -> None:
        """End a run the driver asked to stop, after its last step: a checkpoint of that step unless
        the newest one is younger than `train.stop_checkpoint_after_s` (then those steps are trained
        again on resume), and a last report with status `preempted`; nothing final is written."""
        step, folder = metrics["step"], None
        stale = step > self.last_step and time.time() - self.last_time >= self.plan.train.stop_checkpoint_after_s
        if self.agree(self.rank == 0 and stale):  # rank 0's clock decides for all
            folder = self.save_checkpoint(recipe, step, history, say=progress.line)
        progress.line(
            f"train: stopped at step {step}/{self.plan.target.steps} on the driver's request (SIGTERM); "
            f"the checkpoint of step {self.last_step} is kept"
        )
        progress.checkpoint(self.last_step)
        progress.finish({**metrics, "status": "preempted"})  # what the driver reads (Ray may not return this report)
        self.report({**metrics, "status": "preempted", "checkpoint_step": self.last_step}, folder)

    def write_metrics(self, body: dict[str, Any]) -> None:
        """train_metrics.json (rank 0): the final metrics, the history and the recipe's own blocks."""
        from hptransfer.io import write_json

        if self.rank == 0:
            write_json(self.paths.metrics, body)

    def save_handoff(self, module, folded=None) -> None:
        """Weights plain `from_pretrained` reads correctly (µP's readout multiplier folded in; `folded`:
        the module trained in the folded form, saved as it is), with the base shapes and plan beside
        them so hptransfer can continue µP training (rank 0)."""
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
                folded=folded,
            )
