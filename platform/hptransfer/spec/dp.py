"""`dp:`: differentially private fine-tuning of the study's model (the DP config plus its sweep)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from hptransfer.privacy import PRETRAIN, DPConfig
from hptransfer.spec.base import _Strict
from hptransfer.spec.data import DataSpec


class DPSweepSpec(_Strict):
    """The DP sweep `hpt run` runs in the fine-tuning regime (`dp.init_from: pretrain`, dp/finetune.py)."""

    # ε = .inf is a setting here (the noise-free arm); kept as .inf in the study's spec.yaml.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True, ser_json_inf_nan="constants")

    widths: list[int] | None = Field(
        None,
        description="Widths of the DP sweep, each fine-tuning a model pretrained at that width (target.width: the "
        "large run's own; a narrower one: the pretraining plan trained at that width). ≥ 2 widths: the plan checks "
        "whether the narrowest width's best (B, C, lr) hold at the widest (dp/width.py) and is made from the "
        "narrowest width's sweep. Null: [target.width].",
    )
    epsilons: list[float] = Field(
        default_factory=list,
        description="ε of the sweep; `.inf` adds the noise-free arm (the step curve the predicted-loss batch rule "
        "fits). Empty: [dp.epsilon, .inf].",
    )
    lrs: list[float] = Field(
        default_factory=list, description="LRs of the sweep (≥ 2 measure the LR-vs-B law). Empty: [dp.lr or 3e-3]."
    )
    seeds: list[int] = Field(
        default_factory=list, description="Seeds of each cell (≥ 2 give the across-width check an interval). Empty: sweep.seeds."
    )
    tolerance: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="Across widths: the narrow width's choice holds when the 95% interval of its extra loss at the "
        "wide width over the wide width's own best stays below this fraction of that loss; does not hold when the "
        "interval lies above it; otherwise inconclusive.",
    )

    @field_validator("epsilons")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if bad := [e for e in v if not e > 0]:
            raise ValueError(f"each ε must be > 0 (or .inf for the noise-free arm), got {bad}")
        return v

    @field_validator("lrs")
    @classmethod
    def _lrs(cls, v: list[float]) -> list[float]:
        if bad := [x for x in v if not (0 < x < math.inf)]:
            raise ValueError(f"each lr must be a positive finite number, got {bad}")
        return v


class StudyDPConfig(DPConfig):
    """A study's `dp:` block: the budget (DPConfig) and, in the fine-tuning regime (`init_from:
    pretrain`), the private corpus and the DP sweep `hpt run` runs after the pretraining large run."""

    data: DataSpec | None = Field(
        None,
        description="init_from pretrain: the PRIVATE corpus the pretrained model is fine-tuned on (e.g. "
        "`{corpus: prose}`), while `data` is the public pretraining corpus. Null: `data` itself.",
    )
    sweep: DPSweepSpec = Field(DPSweepSpec(), description="init_from pretrain: the DP sweep of `hpt run`.")
    tuning: Literal["public", "private"] = Field(
        "public",
        description="init_from pretrain: where the DP sweep (its trials, the noise-free arm, the per-example gradient "
        "norms behind C and the selection) reads its data. `public`: `dp.tuning_data`, data you declare public, never "
        "`dp.data`; the private corpus is read by the private large run alone (Ponomareva et al., 'How to DP-fy ML': "
        "tune on public or proxy data). `private` (DP trials, a random number of them, a DP quantile for C and the "
        "whole procedure accounted: Papernot & Steinke, ICLR 2022) is not built yet and is refused.",
    )
    tuning_data: DataSpec | None = Field(
        None,
        description="init_from pretrain, tuning public: the PUBLIC corpus the DP sweep fine-tunes on, a proxy for "
        "`dp.data` (the closer its distribution, the better the transferred B, C and lr). Null: `data`, the public "
        "pretraining corpus. Must differ from the private corpus.",
    )

    @property
    def finetunes_pretrained(self) -> bool:
        return self.init_from == PRETRAIN
