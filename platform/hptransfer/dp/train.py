"""DP fine-tuning with Opacus: DP-Adam in the normalized clipping form, Poisson sampling at q = B/N.

What makes the run private, and where each piece comes from:
- per-example gradients and clipping to C, Gaussian noise of std σ·C on the clipped sum: Opacus'
  `PrivacyEngine.make_private` (GradSampleModule + DPOptimizer);
- Poisson sampling at exactly q = B/N: Opacus' `DPDataLoader(dataset, sample_rate=q)`. We build it
  ourselves because `make_private` derives q = 1/len(loader) = 1/ceil(N/B), which is not B/N; the
  accountant hook and the optimizer's expected batch are re-attached with the true q and B;
- normalized clipping (paper 1, arXiv 2510.20616; docs/RESEARCH.md): g_i ← g_i·min(1/C, 1/‖g_i‖), update
  (Σ g_i + N(0, σ²I))/B. Opacus 1.6 has no `normalize_clipping` switch, so we divide Opacus'
  flat-clipped, noised mean by C in the optimizer's step hook: (Σ clip_C(g_i) + N(0, σ²C²))/(B·C)
  is exactly the normalized form, which decouples the learning rate from C;
- ε spent, read from the engine's accountant after every pass over the data and at the end; the
  run refuses to start if (σ, q, T) would exceed the target, and raises if it ever did.

`train_dp` is the single-process loop of a dp-sweep trial (digits and LM tasks); the private large
run (train/private.py, on Ray Train) wraps its optimizer with the same `make_private_normalized`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from pydantic import BaseModel, Field
from torch import nn
from torch.utils.data import Dataset

LogMetrics = Callable[[dict[str, float], int], None]


class PrivacyBudgetExceeded(RuntimeError):
    """The accountant reports more ε than the target: the run is not private as promised."""


class DPTrainResult(BaseModel):
    epsilon: float = Field(..., description="ε spent by the whole run (the engine's accountant).")
    target_epsilon: float
    delta: float
    steps: int
    sample_rate: float
    noise_multiplier: float
    clip: float
    accountant_history: list[tuple[float, float, int]] = Field(..., description="(σ, q, steps) as the accountant recorded them.")
    batch_sizes: list[int] = Field(..., description="Realised Poisson batch sizes, one per step.")
    final_loss: float


def train_dp(
    model: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int,
    steps: int,
    noise_multiplier: float,
    clip: float,
    lr: float | None,
    target_epsilon: float,
    delta: float,
    accountant: str = "prv",
    optimizer: str | torch.optim.Optimizer = "adam",
    lr_factor: Callable[[int], float] | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    seed: int = 0,
    log_metrics: LogMetrics | None = None,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
) -> DPTrainResult:
    """Train `model` in place on `dataset` (pairs of tensors (x, y)) with DP-Adam for exactly `steps`
    Poisson-sampled steps at q = batch_size/len(dataset). `log_metrics(dict, step)` receives ε spent
    (and loss, and `eval_fn(model)` if given) after every pass of 1/q steps and at the end; the caller
    decides where it goes (MLflow, a list, nowhere). `optimizer`: "adam" (DP-Adam, paper 1) or "sgd"
    at `lr`; or an optimizer already built over `model`'s parameters (e.g. `models.training_setup`'s
    MuAdamW; then `lr` must be None: the optimizer has its own). `lr_factor(step)` multiplies the
    peak LR at each step (a LambdaLR schedule, e.g. `TrainingSetup.lr_factor`). `loss_fn(output, y)`:
    a mean over the batch (Opacus scales per-example gradients by the batch size)."""
    from hptransfer.dp.accounting import epsilon_spent

    n = len(dataset)
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size={batch_size} must be in [1, N={n}]: q = B/N is a probability")
    q = batch_size / n
    planned = epsilon_spent(noise_multiplier, q, steps, delta, accountant)
    if planned > target_epsilon:
        raise PrivacyBudgetExceeded(
            f"(σ={noise_multiplier:.4g}, q={q:.4g}, T={steps}) spends ε={planned:.4g} > target {target_epsilon:g}; "
            "take σ from dp_plan_for / accounting.noise_multiplier for this q and T"
        )
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    torch.manual_seed(seed)
    opt = _optimizer(model, optimizer, lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor) if lr_factor is not None else None
    engine, gsm, dp_opt, loader = make_private_normalized(
        model,
        opt,
        dataset,
        batch_size=batch_size,
        noise_multiplier=noise_multiplier,
        clip=clip,
        accountant=accountant,
        generator=torch.Generator().manual_seed(seed),
    )

    sizes: list[int] = []
    step, losses = 0, []
    gsm.train()
    with warnings.catch_warnings():  # torch warns on Opacus' hooks when inputs need no grad: harmless
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        while step < steps:
            for x, y in loader:  # one pass = 1/q steps: an epoch in expectation
                sizes.append(len(y))
                dp_opt.zero_grad(set_to_none=True)
                loss = loss_fn(gsm(x), y)  # an empty Poisson batch still runs: Opacus adds noise only
                loss.backward()
                if len(y):
                    losses.append(float(loss.detach()))
                dp_opt.step()
                if sched is not None:
                    sched.step()
                step += 1
                if step == steps:
                    break
            if log_metrics is not None:
                _log_progress(engine, gsm, delta, target_epsilon, step, losses, log_metrics, eval_fn)
    eps = float(engine.get_epsilon(delta))
    gsm.remove_hooks()  # `model` is trained in place; leave it a plain module
    if eps > target_epsilon:
        raise PrivacyBudgetExceeded(f"accountant reports ε={eps:.4g} > target {target_epsilon:g} after {step} steps")
    hist = [(float(s), float(r), int(k)) for s, r, k in engine.accountant.history]
    return DPTrainResult(
        epsilon=eps,
        target_epsilon=target_epsilon,
        delta=delta,
        steps=step,
        sample_rate=q,
        noise_multiplier=noise_multiplier,
        clip=clip,
        accountant_history=hist,
        batch_sizes=sizes,
        final_loss=losses[-1] if losses else math.nan,
    )


def _optimizer(model: nn.Module, optimizer: str | torch.optim.Optimizer, lr: float | None) -> torch.optim.Optimizer:
    if isinstance(optimizer, torch.optim.Optimizer):
        if lr is not None:
            raise ValueError(f"lr={lr} given with a ready optimizer, which has its own; pass lr=None")
        return optimizer
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer={optimizer!r} is unknown; use 'adam' (DP-Adam, paper 1) or 'sgd'")
    if lr is None:
        raise ValueError(f"optimizer={optimizer!r} needs a learning rate; pass lr")
    return (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(model.parameters(), lr=lr)


def make_private_normalized(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    *,
    batch_size: int,
    noise_multiplier: float,
    clip: float,
    accountant: str,
    generator: torch.Generator | None = None,
    distributed: bool = False,
):
    """Opacus' PrivacyEngine set up for paper 1's DP-Adam: Poisson sampling at q = B/N with B the
    GLOBAL expected batch, accounting at that q, and the normalized clipping form.
    Returns (engine, grad-sample module, DP optimizer, Poisson data loader). With `distributed`,
    `model` must already be wrapped in Opacus' DPDDP inside an initialised process group; each rank
    then samples its shard at rate q, rank 0 alone adds the noise, and the all-reduced mean divides
    by B (so per-rank expected batch = B / world size)."""
    from opacus import PrivacyEngine
    from opacus.data_loader import DPDataLoader

    q = batch_size / len(dataset)
    world = torch.distributed.get_world_size() if distributed else 1
    loader = DPDataLoader(dataset, sample_rate=q, generator=generator, distributed=distributed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "secure RNG turned off": fine for research runs
        engine = PrivacyEngine(accountant=accountant)
        gsm, dp_opt, _ = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=clip,
            poisson_sampling=False,
        )  # the loader already is Poisson
    # make_private derives q = 1/len(loader) and its expected batch from that; both must be B/N and B.
    dp_opt.expected_batch_size = batch_size / world
    account = engine.accountant.get_optimizer_hook_fn(sample_rate=q)

    def step_hook(o) -> None:  # runs after clip, noise and the 1/B mean (before any all-reduce)
        account(o)
        for p in o.params:  # normalized form: the noisy mean of clip_C(g_i) divided by C
            p.grad.div_(clip)

    dp_opt.attach_step_hook(step_hook)
    return engine, gsm, dp_opt, loader


def _log_progress(engine, gsm, delta, target_epsilon, step, losses, log, eval_fn) -> None:
    from hptransfer.dp.accounting import prv_eps_error

    # Progress only: a coarser PRV mesh (an upper bound still); the final check uses the default.
    kw = {"eps_error": prv_eps_error(target_epsilon)} if engine.accountant.mechanism() == "prv" else {}
    metrics = {"dp/epsilon": float(engine.accountant.get_epsilon(delta=delta, **kw))}
    if losses:
        metrics["train/loss"] = sum(losses[-20:]) / len(losses[-20:])
    if eval_fn is not None:
        gsm.eval()
        with torch.no_grad():
            metrics.update(eval_fn(gsm._module))
        gsm.train()
    log(metrics, step)
