"""Optimizer and schedule shared by sweep trials and the large run.

µP uses `mup.MuAdamW`: per parameter it divides the LR by width_mult for matrix-like weights and
(paper 3's "independent" form) multiplies weight decay by width_mult, keeping lr·wd per group
constant across widths. SP uses `torch.optim.AdamW` with one global LR.
Weight decay applies to matrices only (not norms or biases), the usual LLM practice.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from hptransfer.hyperparameters import Hyperparameters
from hptransfer.spec import WeightDecayScaling

if TYPE_CHECKING:
    from hptransfer.models.depth import DepthScaling


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


ADAM_EPS = 1e-8
FINAL_LR_FRACTION = 0.1  # the cosine schedule's floor, as a fraction of the peak LR


def build_optimizer(
    model: nn.Module,
    parametrization: str,
    hps: Hyperparameters,
    weight_decay_scaling: WeightDecayScaling = "independent",
    depth: DepthScaling | None = None,
) -> torch.optim.Optimizer:
    """AdamW (µP: MuAdamW) with the hyperparameters' lr, weight_decay, beta1 and beta2.

    µP's weight decay on hidden matrices: `independent` (MuAdamW's own: λ·m, so η·λ is constant in
    width) or `standard` (λ unchanged while η/m shrinks η·λ: the variant paper 3, arXiv 2510.19093,
    compares against; rule `mup-standard-wd`).

    `depth`: the depth parametrization's per-parameter LR / weight-decay / ε factors (models/depth.py,
    in the folded form `build_model` initialised), applied on top."""
    opt = _width_optimizer(model, parametrization, hps, weight_decay_scaling)
    if depth is None or depth.identity:
        return opt
    from hptransfer.models.depth import param_factors, rescale_optimizer

    return rescale_optimizer(opt, param_factors(model, depth))


def _width_optimizer(
    model: nn.Module, parametrization: str, hps: Hyperparameters, weight_decay_scaling: WeightDecayScaling
) -> torch.optim.Optimizer:
    groups = param_groups(model, hps.weight_decay)
    kw = {"lr": hps.lr, "betas": (hps.beta1, hps.beta2), "eps": ADAM_EPS}
    if parametrization != "mup":
        return torch.optim.AdamW(groups, **kw)
    from mup import MuAdamW

    opt = MuAdamW(groups, **kw)
    if weight_decay_scaling == "standard":
        for g in opt.param_groups:  # MuAdamW split groups by width_mult; undo its λ·m on hidden matrices
            p = g["params"][0]
            if getattr(p, "infshape", None) is not None and p.infshape.ninf() == 2:
                g["weight_decay"] /= p.infshape.width_mult()
    elif weight_decay_scaling != "independent":
        raise ValueError(f"weight_decay_scaling={weight_decay_scaling!r}; use 'independent' or 'standard'")
    return opt


def lr_schedule(step: int, total_steps: int, warmup_steps: float = 0, final_frac: float = FINAL_LR_FRACTION) -> float:
    """Multiplier on the peak LR for optimizer step `step` (0-based, as LambdaLR counts): linear
    warmup from 0, then cosine decay to `final_frac` of the peak at `total_steps`.

    One definition, the library's: for 0 ≤ step ≤ total_steps this is exactly transformers'
    `get_cosine_with_min_lr_schedule_with_warmup(opt, w, total_steps, min_lr_rate=final_frac)`
    (`_get_cosine_schedule_with_warmup_lr_lambda`, the same float operations), which the HF export
    names, so a run continued with HF's Trainer sees our LR at every step: step s < w trains at s/w
    of the peak (step 0 at 0), step w at the peak. `w = round(warmup_steps)`, as the exports
    round it. Past `total_steps` we hold the floor where HF's cosine would rise again."""
    warmup = round(warmup_steps)
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = min(1.0, float(step - warmup) / float(max(1, total_steps - warmup)))
    factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return max(0.0, factor * (1 - final_frac) + final_frac)
