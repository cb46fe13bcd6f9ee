"""What every section of the study spec shares: the strict base model, the bounds that catch
typos, precisions, and the transfer rules by name with what each changes in training (so the spec,
its hashes and the trainer know them without importing the engine)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hptransfer.hyperparameters import Hyperparameters

WeightDecayScaling = Literal["independent", "standard"]


class RuleTraining(BaseModel):
    """What a transfer rule changes in how models are trained — sweep trials and the large run alike
    (models/setup.py) — so a sweep's results depend on it and it is part of `sweep_hash`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    weight_decay_scaling: WeightDecayScaling = Field(
        "independent",
        description="µP's weight decay on hidden matrices: `independent` (MuAdamW's λ·m, η·λ constant in width) or "
        "`standard` (λ unchanged, η·λ shrinks as 1/m; paper 3, arXiv 2510.19093). SP ignores it (plain AdamW).",
    )

    def under(self, parametrization: str) -> RuleTraining:
        """What reaches training under `parametrization`: the scaling exists only under µP."""
        return self if parametrization == "mup" else RuleTraining()


# The transfer rules by name, with what each changes in training. Their code is registered in
# hptransfer.transfer.rules, each rule carrying its entry here (a test checks the two agree); listed
# here so the spec, its hashes and the trainer know it without importing the engine.
RULE_TRAINING: dict[str, RuleTraining] = {
    "mup": RuleTraining(),
    "mup-independent-wd": RuleTraining(),
    "mup-standard-wd": RuleTraining(weight_decay_scaling="standard"),
    "sp-warmup": RuleTraining(),
    "power-law": RuleTraining(),
    "dp": RuleTraining(),
}
RULE_NAMES = tuple(RULE_TRAINING)


def rule_training(rule: str) -> RuleTraining:
    """What rule `rule` changes in training; a ValueError naming the rules for an unknown name."""
    if rule not in RULE_TRAINING:
        raise ValueError(f"unknown transfer rule {rule!r}; choose one of {sorted(RULE_NAMES)}")
    return RULE_TRAINING[rule]


MAX_STEPS = 10_000_000  # far beyond any proxy or target run; catches typos like 1e12
MAX_WIDTH = 1_000_000  # far beyond any model's hidden size; keeps width ratios and costs finite
MAX_SEED = 2**32 - 1  # what numpy, torch and Ray all accept


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise: `wdith:` must not be silently ignored.
    # NaN and ±inf are never a setting.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _fits_int64(cls, v: Any) -> Any:
        # numpy, torch and Ray hold 64-bit integers: a count or size like 10**30 is a typo, not a setting.
        if any(isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 2**63 for x in (v if isinstance(v, list) else [v])):
            raise ValueError(f"{v} is beyond any real setting (and 64-bit integers); use a realistic value")
        return v


Precision = Literal["fp32", "bf16"]
DEFAULT_PRECISION = "fp32"

BYTE_VOCAB = 256  # the `byte` tokenizer: one token per UTF-8 byte


def _check_hps(name: str, values: list[float]) -> None:
    """Each value must be a valid setting of that hyperparameter (finite, in range)."""
    bad = []
    for x in values:
        try:
            Hyperparameters.model_validate({name: x})
        except ValidationError as e:
            bad.append(f"{x!r}: {e.errors()[0]['msg']}")
    if bad:
        raise ValueError(f"{name} values out of range: {'; '.join(bad)}")
