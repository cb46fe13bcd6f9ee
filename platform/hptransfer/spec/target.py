"""`transfer:` and `target:`: the rule that maps the ladder's optima to the target, and the target."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hptransfer.spec.base import MAX_STEPS, MAX_WIDTH, RULE_NAMES, _Strict


class FormulaPriorSpec(_Strict):
    """A free formula's LR as the prior of the ladder's (transfer/formula_prior.py)."""

    formula: Literal["step_law", "deepseek"] = Field(
        "step_law",
        description="The formula: Step Law (arXiv 2503.04715) or DeepSeek (arXiv 2401.02954), at the target's N and D.",
    )
    log_sd: float = Field(
        0.693,
        gt=0,
        le=10,
        description="The formula's error at this scale, σ_F in log η (0.693: within a factor 2 at one σ). An assumption: "
        "the papers fit 10^17–10^21 FLOPs and give no error in log η for small models; on our llama ladder "
        "(benchmarks/axes_regret.py) Step Law's LR was 1.64× the target's measured optimum.",
    )


class TransferSpec(_Strict):
    rule: str = Field("mup", description=f"Transfer rule by name: one of {', '.join(RULE_NAMES)}.")
    warmup_timescale: float | None = Field(
        None,
        gt=0,
        description="sp-warmup: timescale τ (steps) of the multiplicative warmup; null: 1/(lr·weight_decay) (paper 3).",
    )
    weight_decay: Literal["rule", "tau"] = Field(
        "rule",
        description="`rule`: weight decay as the rule carries it; `tau`: keep AdamW's EMA timescale τ = 1/(lr·weight_decay) "
        "a fixed share of the run, lr·weight_decay·steps constant from the ladder to the target (Wang & Aitchison, "
        "arXiv 2405.13698; docs/RESEARCH.md).",
    )
    formula_prior: FormulaPriorSpec | None = Field(
        default_factory=FormulaPriorSpec,
        description="llama: the plan's LR is the posterior of the ladder's estimate (its error from the width transfer "
        "and the axis laws) under the formula's LR as a prior, precision-weighted in log η, so a ladder that knows "
        "less than the formula defers to it (transfer/formula_prior.py); null: the ladder's estimate alone. Not "
        "applied under rule dp, without a tuned lr, or when the source optimum is a grid edge.",
    )


class TargetSpec(_Strict):
    width: int = Field(..., ge=1, le=MAX_WIDTH, description="Width of the large model.")
    steps: int | None = Field(None, ge=1, le=MAX_STEPS, description="Training steps of the large run. Default: the sweep's.")
    batch_size: int | None = Field(
        None, ge=1, le=1_000_000, description="Global batch (sequences) of the large run. Default: the sweep's."
    )
    depth: int | None = Field(
        None, ge=1, le=128, description="Blocks (layers) of the large model. Default: model.depth (the ladder's)."
    )
