"""`hpt train PLAN` for a `dp` plan: the large run, trained privately on Ray Train workers with
Opacus' distributed DP (DPDDP, gloo on CPU), DP-Adam in the normalized clipping form
(`dp.train.make_private_normalized`, as the digits runs). DeepSpeed and Opacus do not combine, so
this path is plain torch.distributed; `pipeline.train_stage` sends `dp` plans here.

What the plan fixes, and where each number comes from:
- the examples: N fixed-length sequences of `seq_len + 1` tokens cut from the training split of the
  plan's corpus (`dp.lm`): the first `dp.config.dataset_size` of them, which is the N the accountant
  assumed (set by the spec, or derived from the data when the plan was made);
- B = `target.batch_size`, T = `target.steps` (the DP plan's choice, `transfer.rules.dp_rule`);
  Poisson sampling at q = B/N: every rank holds the examples i ≡ rank (mod W) and keeps each with
  probability q at every step, so each example is in a step's batch independently with probability
  q and the expected global batch is B;
- σ = `dp.noise_multiplier` (from the plan's accountant for exactly (ε, δ, q, T)), C = `dp.clip`;
  rank 0 alone adds N(0, σ²C²) to the clipped sum before the all-reduce (DPDDP), and the update is
  (Σ clip_C(g_i) + noise) / (B·C): the lr does not depend on C;
- the model, optimizer and schedule: `models.training_setup` with the plan's hyperparameters, as in
  the non-private run (per-example clipping replaces `grad_clip`, which is unused here); the model
  starts fresh, or from the handed-off model `dp.init_from` (an earlier study's `train/hf_model/`,
  checked against the plan's shapes by the driver; `dp.lm.load_init_from`).

Privacy bookkeeping: the driver refuses a plan whose (σ, q, T) would spend more than ε before any
worker starts; rank 0 logs ε spent (the plan's accountant, Opacus' default precision) to MLflow after
every expected epoch (1/q steps) and at the end, and the final block of `train_metrics.json` carries
`epsilon_spent` and `delta`. Before every step the loop checks the steps the accountant has recorded
against T and stops (status `budget_exhausted`) rather than spend more. A checkpoint holds the
accountant's history with the model, optimizer and schedule, so a run restarted after a worker dies,
or continued with `--resume`, accounts the steps before the checkpoint once and goes on from there.

Randomness: the sample of step t on rank r and rank 0's noise at step t are drawn from generators
seeded by (run seed, t, r), so a step replayed after a restart redraws the same sample and noise
(it releases nothing new) and a resumed run equals an uninterrupted one. The run seed is drawn
secretly at the start (never from the plan, which is shared) and kept in the checkpoints; pass
`dp_seed` only for reproducible research runs. Opacus' secure RNG is not used.

`train_loss` and `val_loss` are computed from the private data (the validation split is held-out
private data) and are NOT covered by ε; only the weights are.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hptransfer.errors import DPError, PlanError, Problem
from hptransfer.io import write_json
from hptransfer.plan import TransferPlan, save_plan
from hptransfer.study import TrainPaths

if TYPE_CHECKING:
    from hptransfer.study import Study

MLFLOW_WRITES = 50  # rank 0's per-step metrics go to MLflow in at most ~50 batches per run
NOT_PRIVATE = "train_loss and val_loss are computed on private data and are not covered by epsilon"


@dataclass(frozen=True)
class PrivateRun:
    """The DP settings of a large run, checked against the data (`check_private_plan`)."""

    dataset_size: int  # N
    batch_size: int  # B (expected, global)
    steps: int  # T
    sample_rate: float  # q = B/N
    noise_multiplier: float  # σ
    clip: float  # C
    epsilon: float  # target ε
    delta: float
    accountant: str
    planned_epsilon: float  # ε of (σ, q, T) from the accountant: ≤ epsilon
    init_from: str | None = None  # a handed-off model to fine-tune (None: a fresh model)

    @property
    def epochs(self) -> float:
        return self.steps * self.sample_rate


def check_private_plan(plan: TransferPlan, available: int) -> PrivateRun:
    """The plan's DP settings, or a DPError listing every problem with its fix: bad budget (ε ≤ 0,
    δ ≥ 1/N), N larger than the `available` sequences, B > N, T below `min_steps` (a dataset too
    small for the epoch budget), or (σ, q, T) spending more than ε."""
    from pydantic import ValidationError

    from hptransfer.errors import problems_from_validation
    from hptransfer.privacy import DPConfig

    if plan.dp is None:
        raise PlanError(
            "plan",
            [
                Problem(
                    "dp",
                    "rule `dp` needs the plan's `dp` block (the DP plan)",
                    fix="make the plan with `hpt transfer` from a spec with a `dp:` block",
                )
            ],
        )
    source = "plan's dp block"
    try:
        cfg = DPConfig.model_validate(plan.dp.get("config") or {})
    except ValidationError as e:
        raise DPError(source, problems_from_validation(e, prefix="dp.config")) from None
    problems = []
    n = cfg.dataset_size
    b, t = plan.target.batch_size, plan.target.steps
    sigma, clip = plan.dp.get("noise_multiplier"), plan.dp.get("clip")
    if n is None:
        problems.append(
            Problem(
                "dp.config.dataset_size",
                "is not set: the accountant needs N",
                fix=f"remake the plan (`hpt transfer` derives N from the data: {available} sequences)",
            )
        )
    elif n > available:
        problems.append(
            Problem(
                "dp.config.dataset_size",
                f"N={n} exceeds the {available} private sequences of {plan.target.seq_len + 1} tokens in the corpus",
                n,
                f"set dp.dataset_size ≤ {available} (or null: all of them) and remake the plan, or add data",
            )
        )
    if n is not None and b > n:
        problems.append(
            Problem(
                "target.batch_size",
                f"B={b} exceeds N={n}: q = B/N must be ≤ 1",
                b,
                "remake the plan (`hpt transfer` takes B from the DP plan) or lower it",
            )
        )
    if t < cfg.min_steps:
        problems.append(
            Problem(
                "target.steps",
                f"T={t} is below dp.min_steps={cfg.min_steps}: the dataset (N={n}) is too small for the epoch budget at B={b}",
                t,
                "add data, raise dp.epochs, use a smaller batch, or lower dp.min_steps",
            )
        )
    if not isinstance(sigma, (int, float)) or sigma <= 0:
        problems.append(Problem("dp.noise_multiplier", "must be a number > 0", sigma, "remake the plan"))
    if not isinstance(clip, (int, float)) or clip <= 0:
        problems.append(Problem("dp.clip", "must be a number > 0", clip, "pick C from dp.clip_grid"))
    if cfg.init_from:
        problems += [
            Problem(
                "dp.config.init_from",
                why,
                cfg.init_from,
                "hand off a model of the plan's family, width, "
                "depth and vocabulary (an earlier study's train/hf_model), or set dp.init_from: null",
            )
            for why in _init_from_problems(plan, cfg.init_from)
        ]
    if problems:
        raise DPError(source, problems)
    from hptransfer.dp.accounting import epsilon_spent

    q = b / n
    planned = epsilon_spent(float(sigma), q, t, cfg.delta, cfg.accountant)
    if planned > cfg.epsilon:
        raise DPError(
            source,
            [
                Problem(
                    "",
                    f"(σ={sigma:.4g}, q=B/N={b}/{n}, T={t}) spends ε={planned:.4g} > the "
                    f"target {cfg.epsilon:g} (δ={cfg.delta:g}, {cfg.accountant})",
                    fix="the run would exceed its budget: remake the plan with `hpt transfer` "
                    "instead of editing target.batch_size, target.steps or dp.noise_multiplier",
                )
            ],
        )
    return PrivateRun(
        dataset_size=n,
        batch_size=b,
        steps=t,
        sample_rate=q,
        noise_multiplier=float(sigma),
        clip=float(clip),
        epsilon=cfg.epsilon,
        delta=cfg.delta,
        accountant=cfg.accountant,
        planned_epsilon=planned,
        init_from=cfg.init_from,
    )


def _init_from_problems(plan: TransferPlan, folder: str) -> list[str]:
    """`dp.lm.check_init_from` against the plan's model, built on the meta device (no memory)."""
    import torch

    from hptransfer.dp.lm import check_init_from
    from hptransfer.models import build_model

    with torch.device("meta"):
        model = build_model(plan.model, plan.target.width, base_width=plan.base_width, hps=plan.hps)
    return check_init_from(folder, model)


def run_private_train(
    study: Study,
    plan: TransferPlan,
    *,
    resume: bool = False,
    restart: bool = False,
    log=print,
    dp_seed: int | None = None,
    mlflow_every: int | None = None,
) -> dict:
    """Run (or, with resume=True, continue from its latest checkpoint) the private large run into
    the study's train/ folder; returns rank 0's final metrics (with `epsilon_spent`, `delta`)."""
    from hptransfer.dp.lm import sequence_count
    from hptransfer.train.runner import fit_on_ray_train, prepare_train_dir

    paths = study.paths.train
    run = check_private_plan(plan, sequence_count(plan.data, plan.target.seq_len))  # before anything is written
    if prepare_train_dir(study, plan, resume=resume, restart=restart, log=log):
        _check_same_privacy(paths.plan, run)
    tracker = study.tracker(f"{plan.study}-train", kind="train", tags={"rule": plan.rule, "private": "true"})
    tracker.log_params(
        {
            "width": plan.target.width,
            "steps": run.steps,
            "batch_size": run.batch_size,
            "rule": plan.rule,
            "parametrization": plan.model.parametrization,
            "family": plan.model.family,
            "depth": plan.model.depth,
            "workers": plan.train.workers,
            "dp.dataset_size": run.dataset_size,
            "dp.sample_rate": run.sample_rate,
            "dp.noise_multiplier": run.noise_multiplier,
            "dp.clip": run.clip,
            "dp.epsilon": run.epsilon,
            "dp.delta": run.delta,
            "dp.accountant": run.accountant,
            "dp.lr_source": plan.dp.get("lr_source", "?"),
            "dp.init_from": run.init_from or "fresh",
            **{f"hp.{k}": v for k, v in plan.hps.as_dict().items()},
        }
    )
    save_plan(plan, paths.plan)  # the plan this run trains (a resume checks it)
    log(
        f"train (DP): width {plan.target.width}, N={run.dataset_size} sequences of {plan.target.seq_len + 1} tokens, "
        f"B={run.batch_size} (q={run.sample_rate:.4g}), T={run.steps} steps ({run.epochs:.3g} epochs), "
        f"σ={run.noise_multiplier:.4g}, C={run.clip:g}, ε={run.epsilon:g} (planned {run.planned_epsilon:.4g}), "
        f"δ={run.delta:g}, {plan.train.workers} workers, lr {plan.hps.lr:.4g}, "
        f"from {run.init_from or 'a fresh model'}"
    )
    with study.ray_session():
        result = fit_on_ray_train(
            study,
            plan,
            private_loop_per_worker,
            {
                "plan": plan.model_dump(mode="json"),
                "run": asdict(run),
                "out_dir": str(paths.root),
                "tracking_uri": study.tracking_uri,
                "experiment": study.experiment,
                "run_id": tracker.run_id,
                "mlflow_every": mlflow_every,
                "seed": dp_seed if dp_seed is not None else secrets.randbits(62),
            },
            tracker,
        )
    metrics = dict(result.metrics or {})
    for path in (paths.metrics, paths.plan, paths.hf_model):
        if path.exists():
            tracker.log_artifact(path)
    tracker.log_metrics(
        {
            f"final_{k}": v
            for k, v in metrics.items()
            if k in ("train_loss", "val_loss", "initial_val_loss", "tokens_per_s", "epsilon_spent")
        }
    )
    tracker.end("FINISHED" if metrics.get("status") == "ok" else "FAILED")
    log(
        f"train (DP): ε spent {metrics.get('epsilon_spent', float('nan')):.4g} of {run.epsilon:g} "
        f"(δ={run.delta:g}), status {metrics.get('status')}"
    )
    metrics["mlflow_run_id"] = tracker.run_id
    metrics["checkpoint"] = result.checkpoint.path if result.checkpoint else None
    return metrics


def _check_same_privacy(previous_plan: Path, run: PrivateRun) -> None:
    """A resume continues the accountant's history: it must be for the same (N, B, σ, C, ε, δ)."""
    from hptransfer.dp.lm import sequence_count
    from hptransfer.plan import load_plan

    old_plan = load_plan(previous_plan)
    old = check_private_plan(old_plan, sequence_count(old_plan.data, old_plan.target.seq_len))
    keys = ("dataset_size", "batch_size", "steps", "noise_multiplier", "clip", "epsilon", "delta", "accountant", "init_from")
    diff = [
        f"{k}: checkpoint has {getattr(old, k)}, plan has {getattr(run, k)}" for k in keys if getattr(old, k) != getattr(run, k)
    ]
    if diff:
        raise PlanError(
            f"cannot resume: the checkpoint in {previous_plan.parent} was trained under other DP settings ("
            + "; ".join(diff)
            + "); its privacy spent does not carry over. Pass --restart to discard it"
        )


# --- one Ray Train worker -----------------------------------------------------------------------


def _seed(base: int, step: int, stream: str) -> int:
    """A 63-bit seed for one stream of one step: a pure function, so a replayed step redraws it."""
    h = hashlib.sha256(f"{base}:{step}:{stream}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def recorded_steps(accountant) -> int:
    """Steps the accountant has recorded (its history is (σ, q, steps) runs)."""
    return sum(int(k) for _, _, k in accountant.history)


def private_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from torch.utils.data import TensorDataset

    from hptransfer.data import open_corpus
    from hptransfer.dp.lm import load_init_from, private_sequences, register_mu_readout
    from hptransfer.dp.train import make_private_normalized
    from hptransfer.models import evaluate, lm_logits, training_setup
    from hptransfer.models.device import worker_device
    from hptransfer.models.handoff import save_handoff
    from hptransfer.tracking import BatchedMetrics, MlflowTracker, NullTracker
    from hptransfer.train.progress import Progress
    from hptransfer.transfer.schedule import warmup_multiplier

    plan = TransferPlan.model_validate(config["plan"])
    run = PrivateRun(**config["run"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(plan.train.cpus_per_worker)))
    # Batches go to the worker's device; evaluation follows the model. Always fp32: the private run
    # has no bf16 mode (train.precision applies to the DeepSpeed large run).
    device = worker_device(plan.train.gpus_per_worker)
    paths = TrainPaths(Path(config["out_dir"]))
    paths.pids.mkdir(parents=True, exist_ok=True)
    (paths.pids / f"rank{rank}").write_text(str(os.getpid()))  # lets an operator (or a test) find a worker
    register_mu_readout()

    setup = training_setup(
        plan.model,
        plan.target.width,
        base_width=plan.base_width,
        hps=plan.hps,
        total_steps=run.steps,
        seed=plan.seed,
        extra_lr_factor=lambda s: warmup_multiplier(s, plan),
        rule=plan.rule,
    )
    model, opt = setup.model.to(device), setup.optimizer
    sched = setup.scheduler(opt)
    state = None
    restored = ray.train.get_checkpoint()
    if restored:
        with restored.as_directory() as d:
            state = torch.load(TrainPaths.dp_state(Path(d)), map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    elif run.init_from:  # fine-tune a handed-off model (checked against the plan by the driver)
        load_init_from(model, run.init_from)
    seqs = private_sequences(plan.data, plan.target.seq_len, run.dataset_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus' "secure RNG turned off" and hook warnings
        engine, gsm, dp_opt, _ = make_private_normalized(
            DPDDP(model),
            opt,
            TensorDataset(seqs),
            batch_size=run.batch_size,
            noise_multiplier=run.noise_multiplier,
            clip=run.clip,
            accountant=run.accountant,
            distributed=True,
        )  # its loader is unused: we sample below
    start, history, seed = 0, [], config["seed"]
    if state:
        engine.accountant.load_state_dict(state["accountant"])
        start, history, seed = state["step"], state["history"], state["seed"]
    params = dp_opt.params  # what the DP optimizer clips and noises
    shard = torch.arange(rank, run.dataset_size, world)  # this rank's examples
    tracker = BatchedMetrics(
        MlflowTracker(config["tracking_uri"], config["experiment"], run_id=config["run_id"])
        if rank == 0 and config.get("run_id")
        else NullTracker(),
        config.get("mlflow_every") or math.ceil(run.steps / MLFLOW_WRITES),
    )  # steps per write
    if restored:
        tracker.set_tags({"resumed_from_step": start})
    val = (
        open_corpus(plan.data).val_batches(plan.data.eval_batches, min(run.batch_size, 16), plan.target.seq_len)
        if rank == 0
        else []
    )
    progress = Progress(paths, run.steps, start, enabled=rank == 0)
    # The starting model's validation loss (a fine-tune is judged against where it started).
    initial_val = state.get("initial_val_loss") if state else (evaluate(model, val) if rank == 0 else None)
    t0, tokens, status = time.perf_counter(), 0, "ok"
    metrics: dict[str, Any] = dict(history[-1]) if history else {"step": start}
    for step in range(start + 1, run.steps + 1):
        if recorded_steps(engine.accountant) >= run.steps:  # never account more steps than the budget's T
            status = "budget_exhausted"
            break
        g = torch.Generator().manual_seed(_seed(seed, step, f"sample/{rank}"))
        idx = shard[torch.rand(len(shard), generator=g) < run.sample_rate]
        x, y = seqs[idx, :-1].to(device), seqs[idx, 1:].to(device)
        if rank == 0:  # the noise of this step (only rank 0 adds noise)
            dp_opt.generator = torch.Generator(device=device).manual_seed(_seed(seed, step, "noise"))
        dp_opt.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
            if len(idx):
                logits = lm_logits(gsm, x)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                loss.backward()
                loss_sum = float(loss.detach()) * len(idx)
            else:  # an empty Poisson sample on this rank: no gradient, but it joins the step (and its noise)
                for p in params:
                    p.grad_sample = p.new_zeros((0, *p.shape))
                loss_sum = 0.0
            dp_opt.step()  # clip, noise (rank 0), 1/B, ÷C, all-reduce, Adam; the accountant records (σ, q)
        sched.step()
        stats = torch.tensor([loss_sum, float(len(idx))], device=device)  # NCCL reduces device tensors only
        dist.all_reduce(stats)
        loss_total, sampled = stats.tolist()
        tokens += int(sampled) * plan.target.seq_len
        metrics = {
            "step": step,
            "train_loss": loss_total / max(sampled, 1.0),
            "sampled_batch": int(sampled),
            "lr": plan.hps.lr * setup.lr_factor(step - 1),
            "tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9),
        }
        if math.floor(step * run.sample_rate) > math.floor((step - 1) * run.sample_rate) or step == run.steps:
            metrics["epoch"] = step * run.sample_rate  # an expected epoch ended: ε spent so far
            if rank == 0:
                metrics["epsilon_spent"] = float(engine.get_epsilon(run.delta))
        if rank == 0 and (step % plan.train.eval_every == 0 or step == run.steps):
            metrics["val_loss"] = evaluate(model, val)
        if not math.isfinite(metrics["train_loss"]):
            status = "diverged"
        history.append(metrics)
        tracker.log_metrics({k: v for k, v in metrics.items() if k != "step"}, step=step)
        if "epsilon_spent" in metrics:
            tracker.flush()  # ε reaches MLflow at every epoch
        progress.step(metrics)
        if status != "ok":
            break
        every = plan.train.checkpoint_every
        if every and step % every == 0 and step < run.steps:
            tracker.flush()
            ckpt_dir, ckpt = _save(paths, step, rank, model, opt, sched, engine, history, seed, initial_val)
            ray.train.report(dict(metrics), checkpoint=ckpt)
            if rank == 0:
                shutil.rmtree(ckpt_dir, ignore_errors=True)  # Ray Train has persisted its own copy
            progress.checkpoint(step)

    tracker.flush()
    eps = float(engine.get_epsilon(run.delta))  # the plan's accountant at its default precision
    hist = [(float(s), float(r), int(k)) for s, r, k in engine.accountant.history]
    final = {
        **metrics,
        "status": status,
        "epsilon_spent": eps,
        "delta": run.delta,
        "target_epsilon": run.epsilon,
        "accountant": run.accountant,
        "noise_multiplier": run.noise_multiplier,
        "sample_rate": run.sample_rate,
        "clip": run.clip,
        "dataset_size": run.dataset_size,
        "batch_size": run.batch_size,
        "steps": run.steps,
        "accounted_steps": recorded_steps(engine.accountant),
        "resumed_from_step": start,
        "initial_val_loss": initial_val,
        "init_from": run.init_from,
        "wall_s": time.perf_counter() - t0,
    }
    if eps > run.epsilon:  # cannot happen when the driver's check passed; never report it as ok
        final["status"] = "budget_exceeded"
    if status == "ok" and final["accounted_steps"] != run.steps:
        final["status"] = "budget_exhausted"
    ckpt_dir, ckpt = _save(paths, final["step"], rank, model, opt, sched, engine, history, seed, initial_val)
    if rank == 0:
        sizes = [h["sampled_batch"] for h in history]
        write_json(
            paths.metrics,
            {
                "final": {**final, "mean_sampled_batch": sum(sizes) / max(len(sizes), 1)},
                "history": history,
                "dp": {**asdict(run), "accountant_history": hist, "note": NOT_PRIVATE},
            },
        )
        save_handoff(
            model,
            paths.hf_model,
            spec_model=plan.model,
            width=plan.target.width,
            base_width=plan.base_width,
            plan_dict=plan.model_dump(mode="json"),
        )
    progress.finish(final)
    ray.train.report(final, checkpoint=ckpt)
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    if final["status"] == "budget_exceeded":
        from hptransfer.dp.train import PrivacyBudgetExceeded

        raise PrivacyBudgetExceeded(f"accountant reports ε={eps:.4g} > target {run.epsilon:g}")


def _save(
    paths: TrainPaths, step: int, rank: int, model, opt, sched, engine, history: list, seed: int, initial_val: float | None
):
    """Rank 0 writes the checkpoint (the ranks hold identical states); every rank reports."""
    import ray.train
    import torch

    d = paths.checkpoints_local / f"dp_step{step:07d}"
    if rank != 0:
        return d, None
    d.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "accountant": engine.accountant.state_dict(),
            "step": step,
            "history": history,
            "seed": seed,
            "initial_val_loss": initial_val,
        },
        TrainPaths.dp_state(d),
    )
    return d, ray.train.Checkpoint.from_directory(str(d))
