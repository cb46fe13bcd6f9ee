"""`transfer:` and `target:`: the rule that maps the ladder's optima to the target, and the target."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hptransfer.spec.base import MAX_STEPS, MAX_WIDTH, RULE_NAMES, _Strict


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


class TargetSpec(_Strict):
    width: int = Field(..., ge=1, le=MAX_WIDTH, description="Width of the large model.")
    steps: int | None = Field(None, ge=1, le=MAX_STEPS, description="Training steps of the large run. Default: the sweep's.")
    batch_size: int | None = Field(
        None, ge=1, le=1_000_000, description="Global batch (sequences) of the large run. Default: the sweep's."
    )
    depth: int | None = Field(
        None, ge=1, le=128, description="Blocks (layers) of the large model. Default: model.depth (the ladder's)."
    )
