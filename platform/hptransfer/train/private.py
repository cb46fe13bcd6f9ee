"""The private large run's recipe (`hpt train PLAN` for a `dp` plan): the large run, trained
privately on Ray Train workers with Opacus' distributed DP (DPDDP, gloo on CPU), DP-Adam in the
normalized clipping form (`dp.train.make_private_normalized`, as the dp-sweep trials). DeepSpeed and
Opacus do not combine, so this recipe is plain torch.distributed; `train.runner.run_train` picks it
for a `dp` plan, and the one loop of `train/loop.py` drives it. What it brings of its own: the
Poisson sampler (`poisson_sample`), the optimizer wrapper (Opacus' DPOptimizer) and the accountant.

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
import secrets
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hptransfer.errors import DPError, PlanError, Problem
from hptransfer.layout import TrainPaths
from hptransfer.plan import TransferPlan
from hptransfer.train.recipe import Launch, StepResult

if TYPE_CHECKING:
    from hptransfer.train.loop import WorkerKit

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
    small for the epoch budget; not for a B from the predicted-loss rule, which has no such floor),
    or (σ, q, T) spending more than ε."""
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
    # min_steps is the σ√T rule's floor; the predicted-loss rule chose T knowing what few steps cost.
    if t < cfg.min_steps and plan.dp.get("batch_rule", "noise") != "predicted-loss":
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


def launch(plan: TransferPlan, *, dp_seed: int | None = None) -> Launch:
    """The driver's part: the plan's DP settings checked against the data before anything is
    written; the run's seed drawn secretly (`dp_seed` only for reproducible research runs)."""
    from hptransfer.dp.lm import sequence_count

    if plan.train.min_workers is not None and plan.train.min_workers < plan.train.workers:
        raise PlanError(
            f"train.min_workers={plan.train.min_workers}: the private run's group is fixed (its per-rank Poisson "
            "sampling and accountant assume train.workers ranks throughout); leave train.min_workers out for a dp plan"
        )
    run = check_private_plan(plan, sequence_count(plan.data, plan.target.seq_len))
    return Launch(
        recipe="private",
        announce=(
            f"train (DP): width {plan.target.width}, N={run.dataset_size} sequences of {plan.target.seq_len + 1} tokens, "
            f"B={run.batch_size} (q={run.sample_rate:.4g}), T={run.steps} steps ({run.epochs:.3g} epochs), "
            f"σ={run.noise_multiplier:.4g}, C={run.clip:g}, ε={run.epsilon:g} (planned {run.planned_epsilon:.4g}), "
            f"δ={run.delta:g}, {plan.train.workers} workers, lr {plan.hps.lr:.4g}, "
            f"from {run.init_from or 'a fresh model'}"
        ),
        params={
            "dp.dataset_size": run.dataset_size,
            "dp.sample_rate": run.sample_rate,
            "dp.noise_multiplier": run.noise_multiplier,
            "dp.clip": run.clip,
            "dp.epsilon": run.epsilon,
            "dp.delta": run.delta,
            "dp.accountant": run.accountant,
            "dp.lr_source": plan.dp.get("lr_source", "?"),
            "dp.init_from": run.init_from or "fresh",
        },
        tags={"private": "true"},
        loop_config={"run": asdict(run), "seed": dp_seed if dp_seed is not None else secrets.randbits(62)},
        check_resume=lambda previous_plan: _check_same_privacy(previous_plan, run),
        summary=lambda m: (
            f"train (DP): ε spent {m.get('epsilon_spent', float('nan')):.4g} of {run.epsilon:g} "
            f"(δ={run.delta:g}), status {m.get('status')}"
        ),
    )


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


# --- the recipe in a worker: sampler, optimizer wrapper, accountant -----------------------------


def _seed(base: int, step: int, stream: str) -> int:
    """A 63-bit seed for one stream of one step: a pure function, so a replayed step redraws it."""
    h = hashlib.sha256(f"{base}:{step}:{stream}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def poisson_sample(shard, sample_rate: float, seed: int, step: int, rank: int):
    """This rank's examples in the batch of `step`: each of `shard` kept with probability q,
    independently, from a generator seeded by (run seed, step, rank)."""
    import torch

    g = torch.Generator().manual_seed(_seed(seed, step, f"sample/{rank}"))
    return shard[torch.rand(len(shard), generator=g) < sample_rate]


def recorded_steps(accountant) -> int:
    """Steps the accountant has recorded (its history is (σ, q, steps) runs)."""
    return sum(int(k) for _, _, k in accountant.history)


class PrivateRecipe:
    flush_keys = ("epsilon_spent",)  # ε reaches MLflow at every expected epoch

    def __init__(self, kit: WorkerKit):
        self.kit, self.plan = kit, kit.plan
        self.run = PrivateRun(**kit.config["run"])

    def setup(self, restored: Path | None) -> dict[str, Any]:
        import torch
        from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
        from torch.utils.data import TensorDataset

        from hptransfer.data import open_corpus
        from hptransfer.dp.lm import load_init_from, private_sequences, register_mu_readout
        from hptransfer.dp.train import make_private_normalized
        from hptransfer.models import evaluate, training_setup
        from hptransfer.models.device import worker_device
        from hptransfer.transfer.schedule import warmup_multiplier

        plan, run, rank, world = self.plan, self.run, self.kit.rank, self.kit.world
        # Batches go to the worker's device; evaluation follows the model. Always fp32: the private run
        # has no bf16 mode (train.precision applies to the DeepSpeed large run).
        self.device = device = worker_device(plan.train.gpus_per_worker)
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
        self.lr_factor = setup.lr_factor
        self.model, self.opt = setup.model.to(device), setup.optimizer
        self.sched = setup.scheduler(self.opt)
        state = {}
        if restored is not None:
            state = torch.load(TrainPaths.dp_state(restored), map_location=device, weights_only=False)
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
        elif run.init_from:  # fine-tune a handed-off model (checked against the plan by the driver)
            load_init_from(self.model, run.init_from)
        self.seqs = private_sequences(plan.data, plan.target.seq_len, run.dataset_size)
        # The optimizer wrapper: per-example clipping, rank 0's noise, the accountant at q = B/N.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus' "secure RNG turned off" and hook warnings
            self.engine, self.gsm, self.dp_opt, _ = make_private_normalized(
                DPDDP(self.model),
                self.opt,
                TensorDataset(self.seqs),
                batch_size=run.batch_size,
                noise_multiplier=run.noise_multiplier,
                clip=run.clip,
                accountant=run.accountant,
                distributed=True,
            )  # its loader is unused: `poisson_sample` draws each step's batch
        if state:
            self.engine.accountant.load_state_dict(state["accountant"])
        self.seed = state.get("seed", self.kit.config["seed"])
        self.shard = torch.arange(rank, run.dataset_size, world)  # this rank's examples
        self.val = (
            open_corpus(plan.data).val_batches(plan.data.eval_batches, min(run.batch_size, 16), plan.target.seq_len)
            if rank == 0
            else []
        )
        # The starting model's validation loss (a fine-tune is judged against where it started).
        self.initial_val = state.get("initial_val_loss") if state else (evaluate(self.model, self.val) if rank == 0 else None)
        return {k: state[k] for k in ("step", "history") if k in state}

    def stop_before(self, step: int) -> str | None:
        # Never account more steps than the budget's T.
        return "budget_exhausted" if recorded_steps(self.engine.accountant) >= self.run.steps else None

    def step(self, step: int) -> StepResult:
        import torch
        import torch.distributed as dist

        from hptransfer.models import lm_logits
        from hptransfer.models.build import lm_loss

        run, rank, device, dp_opt = self.run, self.kit.rank, self.device, self.dp_opt
        idx = poisson_sample(self.shard, run.sample_rate, self.seed, step, rank)
        x, y = self.seqs[idx, :-1].to(device), self.seqs[idx, 1:].to(device)
        if rank == 0:  # the noise of this step (only rank 0 adds noise)
            dp_opt.generator = torch.Generator(device=device).manual_seed(_seed(self.seed, step, "noise"))
        dp_opt.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
            if len(idx):
                loss = lm_loss(lm_logits(self.gsm, x), y)
                loss.backward()
                loss_sum = float(loss.detach()) * len(idx)
            else:  # an empty Poisson sample on this rank: no gradient, but it joins the step (and its noise)
                for p in dp_opt.params:
                    p.grad_sample = p.new_zeros((0, *p.shape))
                loss_sum = 0.0
            dp_opt.step()  # clip, noise (rank 0), 1/B, ÷C, all-reduce, Adam; the accountant records (σ, q)
        self.sched.step()
        stats = torch.tensor([loss_sum, float(len(idx))], device=device)  # NCCL reduces device tensors only
        dist.all_reduce(stats)
        loss_total, sampled = stats.tolist()
        extra: dict[str, Any] = {"sampled_batch": int(sampled)}
        if math.floor(step * run.sample_rate) > math.floor((step - 1) * run.sample_rate) or step == run.steps:
            extra["epoch"] = step * run.sample_rate  # an expected epoch ended: ε spent so far
            if rank == 0:
                extra["epsilon_spent"] = float(self.engine.get_epsilon(run.delta))
        return StepResult(loss_total / max(sampled, 1.0), int(sampled) * self.plan.target.seq_len, extra)

    def evaluate(self) -> float | None:
        from hptransfer.models import evaluate

        return evaluate(self.model, self.val) if self.kit.rank == 0 else None

    def save_checkpoint(self, folder: Path, client: dict[str, Any]) -> None:
        """Rank 0 writes the checkpoint (the ranks hold identical states)."""
        import torch

        if self.kit.rank != 0:
            return
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "accountant": self.engine.accountant.state_dict(),
            **client,
            "seed": self.seed,
            "initial_val_loss": self.initial_val,
        }
        torch.save(state, TrainPaths.dp_state(folder))

    def finish(self, final: dict[str, Any]) -> dict[str, Any]:
        run = self.run
        eps = float(self.engine.get_epsilon(run.delta))  # the plan's accountant at its default precision
        final = {
            **final,
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
            "accounted_steps": recorded_steps(self.engine.accountant),
            "initial_val_loss": self.initial_val,
            "init_from": run.init_from,
        }
        if eps > run.epsilon:  # cannot happen when the driver's check passed; never report it as ok
            final["status"] = "budget_exceeded"
        if final["status"] == "ok" and final["accounted_steps"] != run.steps:
            final["status"] = "budget_exhausted"
        return final

    def save(self, final: dict[str, Any], history: list[dict]) -> None:
        sizes = [h["sampled_batch"] for h in history]
        hist = [(float(s), float(r), int(k)) for s, r, k in self.engine.accountant.history]
        self.kit.write_metrics(
            {
                "final": {**final, "mean_sampled_batch": sum(sizes) / max(len(sizes), 1)},
                "history": history,
                "dp": {**asdict(self.run), "accountant_history": hist, "note": NOT_PRIVATE},
            }
        )
        self.kit.save_handoff(self.model)

    def check(self, final: dict[str, Any]) -> None:
        if final["status"] == "budget_exceeded":
            from hptransfer.dp.train import PrivacyBudgetExceeded

            raise PrivacyBudgetExceeded(f"accountant reports ε={final['epsilon_spent']:.4g} > target {self.run.epsilon:g}")
