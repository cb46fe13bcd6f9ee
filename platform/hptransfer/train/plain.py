"""The plain large run's recipe: the plan's model, optimizer and schedule in a DeepSpeed engine, one
per Ray Train worker (`train/loop.py` drives it; `train/recipe.py` says when each method runs).

Set-up: plan → model (µP base shapes set before DeepSpeed sees it) → optimizer with the plan's
per-group LRs → DeepSpeed engine → Ray Train's latest checkpoint, if any. A step: the global batch of
the step (a function of the step alone), this rank's slice of it in micro-batches. Checkpoint: a
DeepSpeed checkpoint. Save: train_metrics.json and the HF hand-off (under ZeRO-3 gathered first).

Device: the engine's (DeepSpeed moves the model to the GPU Ray Train assigned the worker, or keeps it
on the CPU); every batch goes there, and evaluation follows the model. `train.precision: bf16` is
DeepSpeed's bf16 mode (bf16 weights and compute, fp32 master weights in the optimizer), on a GPU and
on DeepSpeed's CPU accelerator alike (ZeRO 0-2 seen to work on CPU); losses are taken in fp32.

`training_run` and `deepspeed_engine` are the set-up's two halves, public so a benchmark can time
them (benchmarks/train_throughput.py) rather than copy them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hptransfer.plan import TransferPlan
from hptransfer.train.dsconfig import check_worker_range, deepspeed_config
from hptransfer.train.recipe import Launch, StepResult

if TYPE_CHECKING:
    from hptransfer.models import TrainingSetup
    from hptransfer.train.loop import WorkerKit

CKPT_TAG = "state"


def launch(plan: TransferPlan) -> Launch:
    """The driver's part: the DeepSpeed config is built (and a bad one refused) before any worker
    starts; the workers build the same one."""
    check_worker_range(plan)
    ds_cfg = deepspeed_config(plan, plan.train.workers, bf16=plan.train.precision == "bf16")
    lo, hi = plan.train.worker_range
    return Launch(
        recipe="plain",
        announce=(
            f"train: width {plan.target.width}, {plan.target.steps} steps, global batch {plan.target.batch_size}, "
            + (f"{hi} worker{'s' * (hi > 1)}" if lo == hi else f"{lo}-{hi} workers (elastic)")
            + f", ZeRO-{plan.train.zero_stage}, {plan.train.precision}, lr {plan.hps.lr:.4g}"
        ),
        params={"zero_stage": plan.train.zero_stage, "precision": plan.train.precision},
        files={"deepspeed_config": ds_cfg},
    )


# --- the set-up, in two public halves ---------------------------------------------------------------


def training_run(plan: TransferPlan) -> TrainingSetup:
    """The plan's target as `hpt handoff` hands it to any trainer (one code path for "µP in our
    trainer" and "µP in yours"): the µP (or SP) model at the plan's seed folded into a plain model
    (handoff/fold.py), AdamW with the per-parameter LR / weight-decay / ε groups of optimizer.json,
    and its schedule (the base one times the rule's multiplicative warmup: 1 except for `sp-warmup`).
    Under Adam this trains exactly as the µP model with MuAdamW would, up to float rounding (and
    gradient clipping, which sees the folded gradients). `run.folded` is kept for the hand-off."""
    from hptransfer.handoff.fold import fold_plan_target
    from hptransfer.handoff.groups import build_adamw
    from hptransfer.models import TrainingSetup

    folded, spec = fold_plan_target(plan)
    return TrainingSetup(
        folded.model, build_adamw(folded.model, spec), lambda step: spec.lr_factor(step), plan.hps.grad_clip, plan.hps, folded
    )


def deepspeed_engine(plan: TransferPlan, run: TrainingSetup, world: int, *, load_universal: bool = False):
    """`run` wrapped in a DeepSpeed engine in `train.precision` (gradient_clipping = the plan's
    grad_clip), on the worker's device (with GPUs: the one Ray Train assigned, which DeepSpeed
    would otherwise guess from LOCAL_RANK). Returns (engine, ds_config)."""
    from types import SimpleNamespace

    import deepspeed

    from hptransfer.models.device import worker_device

    ds_cfg = deepspeed_config(plan, world, bf16=plan.train.precision == "bf16", load_universal=load_universal)
    device = worker_device(plan.train.gpus_per_worker)
    args = SimpleNamespace(device_rank=device.index or 0) if device.type == "cuda" else None
    # µP's parameter groups exist before DeepSpeed sees the optimizer.
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=run.model, optimizer=run.optimizer, config=ds_cfg, lr_scheduler=lambda opt: run.scheduler(opt)
    )
    return engine, ds_cfg


def build_engine(plan: TransferPlan, world: int, *, load_universal: bool = False):
    """Both halves: (engine, ds_config, lr_factor). `engine.hpt_folded` is the fold's record."""
    run = training_run(plan)
    names = {id(p): n for n, p in run.model.named_parameters()}
    group_names = [[names[id(p)] for p in g["params"]] for g in run.optimizer.param_groups]
    engine, ds_cfg = deepspeed_engine(plan, run, world, load_universal=load_universal)
    # DeepSpeed's ZeRO optimizer keeps the client's groups in order, holding flat partitions instead of parameters.
    engine.hpt_folded, engine.hpt_group_names = run.folded, group_names
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


# --- another worker count: DeepSpeed's universal checkpoint ------------------------------------------


def checkpoint_world(folder: Path) -> int:
    """How many data-parallel ranks wrote a checkpoint's ZeRO partitions (its zero_pp_rank_<r>_*
    optimizer files; ZeRO-1/2/3); 0 without partitions (ZeRO-0 keeps the whole optimizer state in
    the model file, which any worker count loads)."""
    return len(list((folder / CKPT_TAG).glob("zero_pp_rank_*_optim_states.pt")))


def to_universal(folder: Path, out: Path) -> Path:
    """`folder`'s checkpoint as a DeepSpeed universal checkpoint in `out` (DeepSpeed's own converter,
    deepspeed.checkpoint.ds_to_universal: each parameter's fp32 weights and Adam moments whole,
    loadable by any data-parallel size with `checkpoint.load_universal`). Whole or absent: written to a
    sibling and renamed; kept, so a restart of the same resume converts once."""
    import contextlib
    import io
    import shutil
    from types import SimpleNamespace

    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    if (out / CKPT_TAG / "zero").is_dir():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    args = SimpleNamespace(
        input_folder=str(folder / CKPT_TAG),
        output_folder=str(tmp / CKPT_TAG),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # our client state does not carry Megatron's universal_checkpoint_info
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its prints, tqdm bars
        ds_to_universal(args)
    for old in out.parent.glob("*"):  # the conversion of an older checkpoint is spent
        if old != tmp:
            shutil.rmtree(old, ignore_errors=True)
    tmp.rename(out)
    return out


# --- the recipe in a worker -------------------------------------------------------------------------


class PlainRecipe:
    flush_keys: tuple[str, ...] = ()

    def __init__(self, kit: WorkerKit):
        self.kit, self.plan = kit, kit.plan
        self.notes: list[str] = []  # set-up lines for the driver's console (rank 0's are shown)

    def setup(self, restored: Path | None) -> dict[str, Any]:
        from hptransfer.data import open_corpus
        from hptransfer.io import write_json

        plan, kit = self.plan, self.kit
        import deepspeed  # noqa: F401  (imported before the baseline: memory_per_rank counts the model, not imports)
        import transformers  # noqa: F401

        kit.mark_memory_start()
        saved = checkpoint_world(restored) if restored is not None else 0
        universal = saved > 0 and saved != kit.world  # an elastic group resized, or the plan's workers changed
        if universal:
            import torch.distributed as dist

            out = kit.paths.root / "universal_checkpoint" / restored.name  # train/: every rank sees it
            if kit.rank == 0:
                to_universal(restored, out)
            dist.barrier()
            self.notes.append(
                f"train: the checkpoint {restored.name} was written by {saved} worker{'s' * (saved > 1)}, this group "
                f"has {kit.world}: "
                f"resuming from its DeepSpeed universal checkpoint ({out.relative_to(kit.paths.root)})"
            )
            restored = out
        self.engine, self.ds_cfg, self.lr_factor = build_engine(plan, kit.world, load_universal=universal)
        if kit.rank == 0:
            # What the running engine actually applies per parameter group (a test compares it with the plan).
            write_json(
                kit.paths.engine_param_groups,
                [
                    {
                        "lr": g.get("initial_lr", g["lr"]),
                        "weight_decay": g["weight_decay"],
                        "eps": g["eps"],
                        "numel": sum(p.numel() for p in g["params"]),
                        "names": names,
                    }
                    for g, names in zip(self.engine.optimizer.param_groups, self.engine.hpt_group_names, strict=True)
                ],
            )
        B, T = plan.target.batch_size, plan.target.seq_len
        self.corpus = open_corpus(plan.data, seq_len=T, steps=plan.target.steps, batch_size=B)
        self.val = self.corpus.val_batches(plan.data.eval_batches, min(B, 16), T)
        self.micro = self.ds_cfg["train_micro_batch_size_per_gpu"]
        if restored is None:
            return {}
        _, client = self.engine.load_checkpoint(str(restored), tag=CKPT_TAG)
        return client

    def stop_before(self, step: int) -> str | None:
        return None

    def step(self, step: int) -> StepResult:
        import torch.distributed as dist

        plan, rank, world = self.plan, self.kit.rank, self.kit.world
        B, T = plan.target.batch_size, plan.target.seq_len
        # The global batch of a step is a function of the step alone: every rank takes its slice,
        # so any worker count, and a resumed run, sees the same data.
        x, y = self.corpus.batch("train", step, B, T, seed=plan.seed)
        loss = train_step(self.engine, x[rank::world], y[rank::world], self.micro).detach().clone()
        dist.all_reduce(loss)
        return StepResult(loss.item() / world, B * T, {})

    def evaluate(self) -> float | None:
        from hptransfer.models import evaluate

        return evaluate(self.engine.module, self.val)  # on the model's device, in its dtype; every rank

    def save_checkpoint(self, folder: Path, client: dict[str, Any]) -> None:
        import torch.distributed as dist

        # A collective into one directory shared by all ranks; rank 0 hands it over after the barrier.
        self.engine.save_checkpoint(str(folder), tag=CKPT_TAG, client_state=client)
        dist.barrier()

    def finish(self, final: dict[str, Any]) -> dict[str, Any]:
        return final

    def save(self, final: dict[str, Any], history: list[dict]) -> None:
        self.kit.write_metrics({"final": final, "history": history, "deepspeed_config": self.ds_cfg})
        with self._full_weights():  # every rank enters: under ZeRO-3 the gather is a collective
            self.kit.save_handoff(self.engine.module, folded=self.engine.hpt_folded)

    def check(self, final: dict[str, Any]) -> None:
        pass

    def _full_weights(self):
        """ZeRO-3 keeps only this rank's partition of each parameter (the module's tensors are empty
        placeholders): gather the full weights for the hand-off, read-only. Other stages hold them whole."""
        if self.ds_cfg["zero_optimization"]["stage"] != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None)
