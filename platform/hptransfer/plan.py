"""`transfer_plan.yaml`: everything the large run needs, format-neutral, plus the evidence.

The plan is self-contained (model shape, data, hyperparameters, train settings) so `hpt train PLAN`
needs no spec, and a user can read, edit or hand it off.
"""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hptransfer.errors import PlanError, Problem, problems_from_validation
from hptransfer.hyperparameters import TUNABLE, Hyperparameters
from hptransfer.io import sidecar, torn, write_checked
from hptransfer.plan_diagnostics import Diagnostics
from hptransfer.spec import MAX_SEED, MAX_STEPS, MAX_WIDTH, RULE_NAMES, DataSpec, ModelSpec, Precision, TrainSpec

__all__ = [
    "PLAN_VERSION",
    "Diagnostics",
    "PlanError",
    "TargetShape",
    "TransferPlan",
    "load_plan",
    "precision_mismatch",
    "save_plan",
]

PLAN_VERSION = 1


class TargetShape(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    width: int = Field(ge=1, le=MAX_WIDTH)
    steps: int = Field(ge=1, le=MAX_STEPS)
    batch_size: int = Field(ge=1, le=1_000_000, description="Global batch in sequences.")
    seq_len: int = Field(ge=1, le=2**20)


class TransferPlan(BaseModel):
    # Strict: a hand-edited `hyperparamters:` is a typo, not a new field; NaN/inf are never a setting.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    version: int = Field(PLAN_VERSION, ge=PLAN_VERSION, le=PLAN_VERSION, description="Plan format version.")
    study: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    rule: str
    model: ModelSpec  # family, depth, parametrization, ... (width comes from `target`)
    base_width: int = Field(ge=1, le=MAX_WIDTH, description="µP base width the target's width_mult is relative to.")
    target: TargetShape
    hyperparameters: dict[str, float] = Field(
        description="Target run's lr, weight_decay, warmup_steps, beta1, beta2 (+ any tuned); under µP these are base-width values."
    )
    param_group_multipliers: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Per parameter group factors on lr / weight_decay set by the rule (µP: hidden matrices lr/m, wd·m); for exports to trainers without `mup`.",
    )
    schedule: dict[str, Any] | None = Field(
        None,
        description="`base`: the LR schedule (linear warmup, cosine to a final fraction); `kind`: a multiplicative warmup on top of it (`sp-warmup`) or `none`; apply with transfer.schedule.warmup_multiplier(step, plan).",
    )
    heuristics: list[dict[str, Any]] = Field(
        default_factory=list, description="Rules of thumb applied for a batch/steps change, each with its factor and source."
    )
    baselines: dict[str, Any] = Field(
        default_factory=dict, description="DeepSeek and Step-Law LR/batch for the target, for comparison."
    )
    data: DataSpec
    train: TrainSpec
    sweep_precision: Precision = Field(
        "fp32",
        description="The precision the sweep tuned in (`sweep.precision`); a large run in another `train.precision` is warned.",
    )
    diagnostics: Diagnostics = Field(
        default_factory=Diagnostics,
        description="The evidence to judge the plan by: optima per width, verdicts, predicted penalty and target loss, warnings (hptransfer.plan_diagnostics).",
    )
    provenance: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    dp: dict[str, Any] | None = Field(None, description="Rule `dp`: the DP plan (B, T, σ, C grid, σ√T table).")
    axes: dict[str, Any] | None = Field(
        None,
        description="Transfer across steps, batch size and depth (transfer/axes.py): the base point, each axis's law "
        "of the optimum LR (fitted, undecided, or the literature's prior), its factor at the target, the critical batch.",
    )

    @field_validator("rule")
    @classmethod
    def _rule(cls, v: str) -> str:
        if v not in RULE_NAMES:
            raise ValueError(f"unknown rule {v!r}; one of {sorted(RULE_NAMES)}")
        return v

    @field_validator("hyperparameters")
    @classmethod
    def _hps(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - TUNABLE)
        if unknown:
            raise ValueError(f"unknown hyperparameter(s) {unknown}; tunable ones are {sorted(TUNABLE)}")
        Hyperparameters.model_validate(v)  # ranges (lr > 0, 0 ≤ beta < 1, ...)
        return v

    @field_validator("schedule", "heuristics", "baselines", "provenance", "dp", "axes")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        # Free-form blocks are not covered by allow_inf_nan: a hand-edited `.nan` would reach exports.
        bad = [p for p, x in _numbers(v) if not math.isfinite(x)]
        if bad:
            raise ValueError(
                f"non-finite number(s) at {bad[:5]}; NaN and inf are never a setting: "
                "write a number, or null for an unknown diagnostic"
            )
        return v

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None or v.get("kind", "none") == "none":
            return v
        if v["kind"] != "sp-warmup":
            raise ValueError(f"schedule.kind={v['kind']!r} is unknown; one of ['none', 'sp-warmup']")
        for key in ("m", "timescale"):
            x = v.get(key)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (1 <= x <= MAX_WIDTH if key == "m" else x > 0):
                raise ValueError(
                    f"schedule.{key} must be a number {f'in 1..{MAX_WIDTH:,} (width ratio)' if key == 'm' else '> 0 (steps)'} "
                    f"for kind sp-warmup, got {x!r}; remake the plan with `hpt transfer`"
                )
        return v

    @property
    def hps(self) -> Hyperparameters:
        """The plan's hyperparameters, typed (defaults filled in)."""
        return Hyperparameters.of(self.hyperparameters)


def precision_mismatch(plan: TransferPlan) -> str | None:
    """A warning when the large run's precision differs from the sweep's: the optimal LR found in one
    need not be the optimum in the other (bf16 rounding adds noise to every update), so the transfer
    was not measured for it. None when they agree."""
    tuned, trains = plan.sweep_precision, plan.train.precision
    if tuned == trains:
        return None
    return (
        f"the sweep tuned in {tuned} and the large run trains in {trains}: the tuned LR may not carry over; "
        f"set train.precision: {tuned} or sweep.precision: {trains}"
    )


def _numbers(obj: Any, path: str = "") -> list[tuple[str, float]]:
    """Every float in nested dicts/lists, with its dotted path."""
    if isinstance(obj, dict):
        return [n for k, v in obj.items() for n in _numbers(v, f"{path}.{k}" if path else str(k))]
    if isinstance(obj, (list, tuple)):
        return [n for i, v in enumerate(obj) for n in _numbers(v, f"{path}[{i}]")]
    return [(path, obj)] if isinstance(obj, float) else []


def save_plan(plan: TransferPlan, path: str | Path) -> Path:
    """Atomically, with a checksum sidecar that tells a plan cut short (`io.torn`)."""
    return write_checked(path, yaml.safe_dump(plan.model_dump(mode="json"), sort_keys=False, allow_unicode=True))


def parse_plan(data: Any, source: str = "<plan>") -> TransferPlan:
    if not isinstance(data, dict):
        raise PlanError(source, [Problem("", "a plan must be a YAML mapping", type(data).__name__)])
    try:
        return TransferPlan.model_validate(data)
    except ValidationError as e:
        raise PlanError(
            source,
            problems_from_validation(e, allowed_keys=_allowed_keys),
        ) from None


def _allowed_keys(loc: tuple) -> list[str]:
    """Field names of the plan section that holds loc[-1] (for "unknown key" errors), through typed
    sections and the per-width maps of `diagnostics`; [] where the section is free-form."""
    ann: Any = TransferPlan
    for part in loc[:-1]:
        ann = _field_type(ann, part)
    members = get_args(ann) if get_origin(ann) in (Union, types.UnionType) else (ann,)
    return next((sorted(m.model_fields) for m in members if isinstance(m, type) and issubclass(m, BaseModel)), [])


def _field_type(ann: Any, part: Any) -> Any:
    """The type one step into `ann` (a model's field, a dict's value), None when there is none."""
    members = get_args(ann) if get_origin(ann) in (Union, types.UnionType) else (ann,)
    for m in members:
        if isinstance(m, type) and issubclass(m, BaseModel) and part in m.model_fields:
            return m.model_fields[part].annotation
        if get_origin(m) is dict:
            return get_args(m)[1]
    return None


def load_plan(path: str | Path) -> TransferPlan:
    path = Path(path)
    if not path.is_file():
        raise PlanError(
            str(path),
            [Problem("", "plan not found", str(path), "make one with `hpt transfer --study-dir DIR` (or `hpt run SPEC`)")],
        )
    if why := torn(path):
        raise PlanError(
            str(path),
            [
                Problem(
                    "",
                    f"cut short while it was written ({why}): a crash on a filesystem without atomic rename, or a full disk",
                    fix="make it again from the sweep's results with `hpt transfer --study-dir DIR` (the same `hpt run` "
                    f"remakes it too); if you shortened it by hand on purpose, delete {sidecar(path).name} to accept it",
                )
            ],
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise PlanError(str(path), [Problem("", f"not valid YAML: {e}")]) from None
    return parse_plan(data, str(path))
