"""`optimizer.json`: the tuned optimizer as any trainer can apply it, parameter by parameter.

One global AdamW setting (lr, betas, eps, weight_decay, grad_clip) and a list of parameter groups,
each a Python regex (`re.fullmatch` against the names of `model.named_parameters()`, the first
match wins, every parameter matches one) with multipliers on the LR, the weight decay and Adam's ε.
The schedule is transformers' `get_cosine_with_min_lr_schedule_with_warmup(opt, warmup_steps,
total_steps, min_lr_rate=min_lr_rate)`, the large run's own (`models.optim.lr_schedule` is the
same function, float for float), with an optional multiplicative warmup (rule `sp-warmup`).

A consumer needs nothing of hptransfer: `torch_param_groups` below is the ~15 lines it would write.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hptransfer.handoff.semantics import AdamWSemantics

OPTIMIZER_FILE = "optimizer.json"
FORMAT_VERSION = 1


class ParamGroup(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    pattern: str = Field(description="Python regex, `re.fullmatch`ed against parameter names; the first matching group wins.")
    lr_mult: float = Field(gt=0, description="The group trains at lr × lr_mult.")
    wd_mult: float = Field(ge=0, description="The group's decoupled weight decay is weight_decay × wd_mult (0: none).")
    eps_mult: float = Field(gt=0, description="The group's Adam ε is eps × eps_mult.")


class SpWarmup(BaseModel):
    """Rule `sp-warmup`'s multiplicative warmup: the LR factor is also multiplied by
    s_t = (1 + (m² − 1)·exp(−2t/τ))^(−1/2) at optimizer step t (0-based)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    m: float = Field(ge=1)
    timescale: float = Field(gt=0)


class Schedule(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    warmup_steps: int = Field(ge=0)
    total_steps: int = Field(ge=1)
    min_lr_rate: float = Field(ge=0, le=1, description="The cosine's floor as a fraction of the peak LR.")
    sp_warmup: SpWarmup | None = None


class OptimizerSpec(BaseModel):
    """The contents of `optimizer.json`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    format: str = "hptransfer-optimizer"
    version: int = FORMAT_VERSION
    optimizer: str = Field("AdamW", description="torch.optim.AdamW: decoupled weight decay p ← p·(1 − lr·wd).")
    adamw: AdamWSemantics = Field(
        default_factory=AdamWSemantics,
        description="The update the multipliers assume (handoff/semantics.py); each trainer file's optimizer is probed against it.",
    )
    lr: float = Field(gt=0)
    betas: tuple[float, float]
    eps: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    grad_clip: float = Field(ge=0, description="clip_grad_norm_ over all parameters with this max_norm; 0: off.")
    param_groups: list[ParamGroup]
    schedule: Schedule
    notes: list[str] = Field(default_factory=list)

    def group_of(self, names: Iterable[str]) -> dict[str, int]:
        return assign_groups(names, self.param_groups)

    def lr_factor(self, step: int) -> float:
        """The factor on every group's LR at optimizer step `step` (0-based, as LambdaLR counts)."""
        from hptransfer.models.optim import lr_schedule

        s = self.schedule
        f = lr_schedule(step, s.total_steps, s.warmup_steps, s.min_lr_rate)
        if s.sp_warmup is not None:
            from hptransfer.transfer.schedule import sp_warmup_factor

            f *= sp_warmup_factor(step, s.sp_warmup.m, s.sp_warmup.timescale)
        return f


def assign_groups(names: Iterable[str], groups: list[ParamGroup]) -> dict[str, int]:
    """Parameter name → index of the first group whose pattern fullmatches it. Every name must match."""
    compiled = [re.compile(g.pattern) for g in groups]
    out, missing = {}, []
    for name in names:
        i = next((i for i, rx in enumerate(compiled) if rx.fullmatch(name)), None)
        if i is None:
            missing.append(name)
        else:
            out[name] = i
    if missing:
        raise ValueError(f"{len(missing)} parameter(s) match no param_groups pattern, e.g. {missing[:3]}; add a pattern for them")
    return out


def name_pattern(name: str) -> str:
    """A regex for `name` with block indices generalised (`layers.3.` → `layers\\.\\d+\\.`), so one group
    covers a parameter in every block."""
    return re.sub(r"\\\.\d+\\\.", r"\\.\\d+\\.", re.escape(name))


def make_groups(mults: dict[str, tuple[float, float, float]]) -> list[ParamGroup]:
    """Groups from per-parameter (lr_mult, wd_mult, eps_mult), in parameter order: one per name
    pattern (blocks generalised), or exact names where blocks of one pattern differ."""
    by_pattern: dict[str, list[str]] = {}
    for name in mults:
        by_pattern.setdefault(name_pattern(name), []).append(name)
    groups = []
    for pattern, names in by_pattern.items():
        values = {mults[n] for n in names}
        if len(values) == 1:
            groups.append(ParamGroup(pattern=pattern, **dict(zip(("lr_mult", "wd_mult", "eps_mult"), values.pop()))))
        else:
            groups.extend(
                ParamGroup(pattern=re.escape(n), **dict(zip(("lr_mult", "wd_mult", "eps_mult"), mults[n]))) for n in names
            )
    return groups


def torch_param_groups(model: Any, spec: OptimizerSpec | dict) -> list[dict[str, Any]]:
    """`torch.optim.AdamW` parameter groups for `model` (a consumer's version is these lines):
    lr, weight_decay and eps per group from the multipliers; `names` lists each group's parameters."""
    spec = spec if isinstance(spec, OptimizerSpec) else OptimizerSpec.model_validate(spec)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    idx = spec.group_of(n for n, _ in params)
    out = []
    for i, g in enumerate(spec.param_groups):
        members = [(n, p) for n, p in params if idx[n] == i]
        if members:
            out.append(
                {
                    "params": [p for _, p in members],
                    "names": [n for n, _ in members],
                    "lr": spec.lr * g.lr_mult,
                    "weight_decay": spec.weight_decay * g.wd_mult,
                    "eps": spec.eps * g.eps_mult,
                }
            )
    return out


def build_adamw(model: Any, spec: OptimizerSpec | dict):
    """torch.optim.AdamW over `torch_param_groups` (the `names` key dropped: torch keeps unknown keys,
    DeepSpeed's checkpoint does not need them)."""
    import torch

    spec = spec if isinstance(spec, OptimizerSpec) else OptimizerSpec.model_validate(spec)
    groups = [{k: v for k, v in g.items() if k != "names"} for g in torch_param_groups(model, spec)]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay)


def is_identity(spec: OptimizerSpec) -> bool:
    """True when every group trains at the global settings (an SP plan without output_mult)."""
    return all(math.isclose(g.lr_mult, 1) and g.eps_mult == 1 and g.wd_mult in (0, 1) for g in spec.param_groups)
