"""`transfer_plan.yaml`: everything the large run needs, format-neutral, plus the evidence.

The plan is self-contained (model shape, data, hyperparameters, train settings) so `hpt train PLAN`
needs no spec, and a user can read, edit or hand it off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from hptransfer.io import write_yaml
from hptransfer.spec import DataSpec, ModelSpec, TrainSpec

PLAN_VERSION = 1


class TargetShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int
    steps: int
    batch_size: int = Field(description="Global batch in sequences.")
    seq_len: int


class TransferPlan(BaseModel):
    model_config = ConfigDict(extra="allow")  # later versions add fields; old readers keep working
    version: int = PLAN_VERSION
    study: str
    rule: str
    model: ModelSpec  # family, depth, parametrization, ... (width comes from `target`)
    base_width: int = Field(description="µP base width the target's width_mult is relative to.")
    target: TargetShape
    hyperparameters: dict[str, float] = Field(description="Target run's lr, weight_decay, warmup_steps, beta1, beta2 (+ any tuned); under µP these are base-width values.")
    param_group_multipliers: dict[str, dict[str, float]] = Field(default_factory=dict, description="Per parameter group factors on lr / weight_decay set by the rule (µP: hidden matrices lr/m, wd·m); for exports to trainers without `mup`.")
    schedule: dict[str, Any] | None = Field(None, description="`base`: the LR schedule (linear warmup, cosine to a final fraction); `kind`: a multiplicative warmup on top of it (`sp-warmup`) or `none`; apply with transfer.schedule.warmup_multiplier(step, plan).")
    heuristics: list[dict[str, Any]] = Field(default_factory=list, description="Rules of thumb applied for a batch/steps change, each with its factor and source.")
    baselines: dict[str, Any] = Field(default_factory=dict, description="DeepSeek and Step-Law LR/batch for the target, for comparison.")
    data: DataSpec
    train: TrainSpec
    diagnostics: dict[str, Any] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0


def save_plan(plan: TransferPlan, path: str | Path) -> Path:
    return write_yaml(path, plan.model_dump(mode="json"))


def load_plan(path: str | Path) -> TransferPlan:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"plan not found: {path} (make one with `hpt transfer`)")
    return TransferPlan.model_validate(yaml.safe_load(path.read_text()))
