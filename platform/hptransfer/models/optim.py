"""Optimizer and schedule shared by sweep trials and the large run.

µP uses `mup.MuAdamW`: per parameter it divides the LR by width_mult for matrix-like weights and
(paper 3's "independent" form) multiplies weight decay by width_mult, keeping lr·wd per group
constant across widths. SP uses `torch.optim.AdamW` with one global LR.
Weight decay applies to matrices only (not norms or biases), the usual LLM practice.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, parametrization: str, hps: dict[str, float]) -> torch.optim.Optimizer:
    groups = param_groups(model, float(hps.get("weight_decay", 0.0)))
    kw = dict(lr=float(hps["lr"]), betas=(float(hps.get("beta1", 0.9)), float(hps.get("beta2", 0.98))), eps=1e-8)
    if parametrization == "mup":
        from mup import MuAdamW

        return MuAdamW(groups, **kw)
    return torch.optim.AdamW(groups, **kw)


def lr_schedule(step: int, total_steps: int, warmup_steps: float = 0, final_frac: float = 0.1) -> float:
    """Multiplier on the peak LR: linear warmup, then cosine decay to `final_frac` of the peak."""
    warmup = int(warmup_steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
