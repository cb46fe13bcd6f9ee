"""The one place a `Hyperparameters` meets a model: sweep trials, the coordinate check, the large
run and the DP path all build their model, optimizer, schedule and clipping here.

Where each hyperparameter goes (hptransfer.hyperparameters.APPLIED):
  init_std, output_mult   → the model's construction (build_model)
  lr, weight_decay, betas → the optimizer (build_optimizer; µP: MuAdamW's per-group scaling)
  warmup_steps            → the LR schedule (lr_factor)
  grad_clip               → gradient clipping (clip_gradients here; DeepSpeed's `gradient_clipping`
                            in the large run, from the same value)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hptransfer.hyperparameters import Hyperparameters
from hptransfer.models.build import build_model
from hptransfer.models.depth import depth_scaling
from hptransfer.models.optim import build_optimizer, lr_schedule
from hptransfer.spec import ModelSpec, WeightDecayScaling, rule_training


@dataclass
class TrainingSetup:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    lr_factor: Callable[[int], float]  # multiplier on the peak LR at step s (0-based), for LambdaLR
    grad_clip: float  # 0: off
    hps: Hyperparameters
    folded: Any = None  # the large run's model is the plain, folded form (hptransfer.handoff.fold.Folded)

    def scheduler(self, optimizer: torch.optim.Optimizer | None = None) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, self.lr_factor)

    def clip_gradients(self) -> None:
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)


def weight_decay_scaling(rule: str) -> WeightDecayScaling:
    """How µP scales weight decay with width under a transfer rule (sweep and large run alike): what
    the rule says it changes in training (spec.RULE_TRAINING), which `sweep_hash` binds results to."""
    return rule_training(rule).weight_decay_scaling


def training_setup(
    model_spec: ModelSpec,
    width: int,
    *,
    base_width: int,
    hps: Hyperparameters,
    total_steps: int,
    seed: int | None = None,
    extra_lr_factor: Callable[[int], float] | None = None,
    rule: str = "mup",
) -> TrainingSetup:
    """Model, optimizer, schedule and clipping for one run with `hps` applied everywhere it belongs.
    `extra_lr_factor` multiplies the schedule (a rule's multiplicative warmup, e.g. `sp-warmup`);
    `rule` selects what the rule changes in training: µP's weight-decay scaling (spec.RULE_TRAINING)."""
    model = build_model(model_spec, width, base_width=base_width, hps=hps, seed=seed)
    optimizer = build_optimizer(model, model_spec.parametrization, hps, weight_decay_scaling(rule), depth_scaling(model_spec))

    def lr_factor(step: int) -> float:
        base = lr_schedule(step, total_steps, hps.warmup_steps)
        return base * extra_lr_factor(step) if extra_lr_factor is not None else base

    return TrainingSetup(model, optimizer, lr_factor, hps.grad_clip, hps)
