"""The `dp:` block of a study spec: the privacy budget, the compute budget and the search grids.

Validated once at load; cross-field problems are reported together, each naming the field, the bad
value and the fix. Defaults live on the fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

PRETRAIN = "pretrain"  # dp.init_from: this study's own large run's handoff


class DPConfig(BaseModel):
    """Privacy and compute budget for DP fine-tuning (paper 1: Rehn et al., arXiv 2510.20616)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    epsilon: float = Field(
        ...,
        gt=0,
        description="Target ε of the private run (ε > 0). In the fine-tuning regime, the whole study's ε (private/privacy_ledger.json): under dp.tuning: public the private run is the only read of the private data; under dp.tuning: private the DP quantile, the tuning and the private run together spend at most this.",
    )
    dataset_size: int | None = Field(
        None,
        ge=1,
        description="N, the number of private training examples. Null: derived from the task's data when the plan is made (`with_dataset_size`).",
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="Target δ; must be below 1/dataset_size (the usual rule: δ ≪ 1/N).")
    epochs: float = Field(..., gt=0, description="E, the fixed epoch budget (compute budget). Steps T = ceil(E·N/B).")
    batch_sizes: list[int] | None = Field(
        None, description="Expected batch sizes B to consider. Null: powers of two from 16 below N, plus N (full batch)."
    )
    min_steps: int = Field(
        20, ge=1, description="A batch size is feasible only if T = ceil(E·N/B) ≥ min_steps (paper 1 used ≈20; data-dependent)."
    )
    tolerance: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Choose the smallest feasible B whose σ√T ≤ (1 + tolerance)·min σ√T (paper 1 gives no number).",
    )
    batch_rule: Literal["predicted-loss", "noise"] = Field(
        "predicted-loss",
        description=(
            "How B is chosen. `predicted-loss`: the lowest predicted loss L_∞ + A·T^-α + κ·(σ√T/(E·N))², "
            "fitted on the study's DP sweep (dp.steps; no min_steps floor); without a sweep to fit, the plan "
            "falls back to `noise` and says so. `noise`: paper 1's σ√T rule (smallest B within `tolerance` of "
            "min σ√T, T ≥ min_steps), kept for comparison. Default predicted-loss: on our step-limited LM task the "
            "σ√T rule's choice lost to B=256 at ε=2 and 8 (benchmarks/results/dp_lm.json)."
        ),
    )
    clip_quantile: float = Field(
        0.02,
        gt=0,
        lt=1,
        description=(
            "q: with measured per-example gradient norms, C is their p(ε)-quantile, the odds p/(1−p) = q/(1−q)·"
            "max(1, clip_shift_reference_epsilon/ε)^clip_shift_exponent: the low tail (nearly every example clipped, "
            "which maximizes each example's signal against the noise) at ε ≥ the reference, moving up as ε falls "
            "(rule.clip_quantile). 0.5 puts C at the median there."
        ),
    )
    accountant: Literal["prv", "rdp"] = Field(
        "prv", description="Opacus accountant for σ(B): `prv` (paper 1's choice, tighter, slower) or `rdp`."
    )
    epsilon_tolerance: float = Field(
        0.01,
        gt=0,
        description="Binary-search precision of opacus' get_noise_multiplier (σ lands slightly above the exact value, so ε ≤ target holds).",
    )
    clip_reference: float = Field(
        1.0,
        gt=0,
        description="Scale of the clipping grid: a typical per-example gradient norm measured on PUBLIC data (never the private set, whose norms are not private).",
    )
    clip_factors: list[float] = Field(
        default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0, 8.0],
        description="Log-spaced multiples of clip_reference: the base C grid, extended upward by the ε shift.",
    )
    clip_shift_exponent: float = Field(
        0.5,
        ge=0,
        description="γ in the upward extension of the grid by (ε_ref/ε)^γ for ε < ε_ref (see rule.clip_shift, rule.clip_grid); 0 disables it.",
    )
    clip_shift_reference_epsilon: float = Field(8.0, gt=0, description="ε_ref: at or above this ε the grid is not shifted.")
    lr: float | None = Field(
        None,
        gt=0,
        description="A learning rate tuned at lr_reference_batch; the plan scales it by √(B/B_ref). Null: the plan reports only the scale factor.",
    )
    lr_reference_batch: int | None = Field(
        None, ge=1, description="B_ref, the batch size lr was tuned at. Required when lr is set."
    )
    init_from: str | None = Field(
        None,
        min_length=1,
        description="The private large run fine-tunes this model: a folder handed off by an earlier study (its `train/hf_model/`), whose shape must be the plan's; or `pretrain`: this study's own large run (the fine-tuning regime: `hpt run` pretrains on `data`, then DP-fine-tunes on `dp.data`, dp/finetune.py). Null: a fresh model (µP or SP, as the spec says).",
    )

    @field_validator("*")
    @classmethod
    def _fits_int64(cls, v):
        # Opacus and numpy hold 64-bit integers: N or B like 10**30 is a typo, not a budget.
        if any(isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 2**63 for x in (v if isinstance(v, list) else [v])):
            raise ValueError(f"{v} is beyond any real setting (and 64-bit integers); use a realistic value")
        return v

    # Field validators (not one model validator) so these errors are reported together with any
    # other bad field, e.g. `epsilon=0` and `delta ≥ 1/N` at once. They see fields declared above.
    @field_validator("delta")
    @classmethod
    def _delta_below_1_over_n(cls, v: float, info: ValidationInfo) -> float:
        n = info.data.get("dataset_size")
        if n is not None and v >= 1 / n:
            raise ValueError(
                f"must be < 1/dataset_size = {1 / n:.3g} (δ ≪ 1/N, else releasing one record "
                f"outright is allowed); use e.g. {_suggest_delta(n):g}"
            )
        return v

    @field_validator("batch_sizes")
    @classmethod
    def _batch_sizes_valid(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is empty; list at least one B, or leave it null for the default grid")
        errs = []
        if bad := [b for b in v if b < 1]:
            errs.append(f"entries must be positive integers, got {bad}")
        n = info.data.get("dataset_size")
        if n is not None and (big := [b for b in v if b > n]):
            errs.append(f"{big} exceed dataset_size={n}; the expected batch B = q·N needs q ≤ 1")
        if errs:
            raise ValueError("; ".join(errs))
        return v

    @field_validator("clip_factors")
    @classmethod
    def _factors_positive(cls, v: list[float]) -> list[float]:
        if not v or any(f <= 0 for f in v):
            raise ValueError(f"must be a non-empty list of positive numbers, got {v}")
        return v

    @field_validator("init_from")
    @classmethod
    def _absolute_init_from(cls, v: str | None) -> str | None:
        # Resolved once, at load: Ray workers run in other folders.
        from pathlib import Path

        if v is None or v == PRETRAIN or Path(v).expanduser().is_absolute():
            return v
        return str(Path.cwd() / v)

    @model_validator(mode="after")
    def _lr_pair(self) -> DPConfig:
        if (self.lr is None) != (self.lr_reference_batch is None):
            raise ValueError(
                f"lr={self.lr} and lr_reference_batch={self.lr_reference_batch} go together: "
                "set both (the LR and the batch it was tuned at) or neither"
            )
        return self

    def with_dataset_size(self, n: int) -> DPConfig:
        """The same config with N filled in (re-validated, so δ < 1/N and B ≤ N are checked)."""
        return type(self).model_validate({**self.model_dump(), "dataset_size": n})

    def resolved_batch_sizes(self) -> list[int]:
        n = self.require_dataset_size()
        if self.batch_sizes is not None:
            return sorted(set(self.batch_sizes))
        out, b = [], 16
        while b < n:
            out.append(b)
            b *= 2
        return [*out, n]

    def require_dataset_size(self) -> int:
        if self.dataset_size is None:
            raise ValueError(
                "dp.dataset_size is not set; give it in the spec or derive it from the data "
                "with DPConfig.with_dataset_size(len(private_train_set))"
            )
        return self.dataset_size


def _suggest_delta(n: int) -> float:
    """The largest power of ten below 1/(10·N): a conventional δ ≪ 1/N."""
    import math

    return 10.0 ** math.floor(math.log10(1 / (10 * n)))
