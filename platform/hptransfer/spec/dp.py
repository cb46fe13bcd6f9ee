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


class PrivateTuningSpec(_Strict):
    """`dp.tuning: private`: the tuning on the private corpus, accounted as a whole (dp/private_tuning.py:
    Papernot & Steinke's truncated-negative-binomial bound, a DP quantile for C, a DP score)."""

    share: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="The part of dp.epsilon the tuning (the DP quantile and the trials together, at dp.delta) may spend; "
        "the private run gets the rest, composed by RDP so that the whole study spends at most dp.epsilon.",
    )
    expected_trials: float = Field(
        4.0,
        gt=1,
        le=64,
        description="E[K]: the mean of the random number of DP trials (Papernot & Steinke: K is drawn, not fixed; its "
        "cost grows as log E[K]). Trials draw (B, lr) uniformly from dp.batch_sizes × dp.sweep.lrs.",
    )
    eta: float = Field(
        1.0, ge=0, le=8, description="η of the truncated negative binomial: 1 the geometric law, 0 the logarithmic."
    )
    quantile: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="C is this quantile of the per-example gradient norms of the private training sequences at the "
        "pretrained model, found privately (0.5: the median, Andrew et al. 2021's default target).",
    )
    quantile_sequences: int | None = Field(
        None, ge=16, description="m, the private sequences whose norms the DP quantile counts. Null: all N of them."
    )
    quantile_noise: float = Field(
        0.05,
        gt=0,
        description="Std of the noise added to each count of the DP quantile's binary search, as a fraction of m.",
    )
    quantile_steps: int = Field(8, ge=1, le=20, description="Binary-search steps over C in [1e-3, 1e3] (log space).")
    score_sequences: int = Field(
        2048,
        ge=16,
        description="Non-overlapping validation sequences of the private corpus each trial is scored on (its noisy mean "
        "loss; the score's sensitivity is score_clip / score_sequences).",
    )
    score_noise: float = Field(0.05, gt=0, description="Std (nats) of the Gaussian noise on each trial's mean loss.")
    score_clip: float | None = Field(
        None, gt=0, description="Each sequence's loss is clipped to [0, score_clip]. Null: ln(vocabulary size)."
    )


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
        "tune on public or proxy data). `private`: a random number of DP trials on the private corpus, C from a DP "
        "quantile, a DP score, only the best released, and the whole procedure accounted within dp.epsilon "
        "(Papernot & Steinke, ICLR 2022; `dp.private_tuning`).",
    )
    private_tuning: PrivateTuningSpec = Field(
        PrivateTuningSpec(), description="dp.tuning: private: its budget share, trial count law, DP quantile and DP score."
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
