"""The ladder's LR and a free formula's, combined (issue 36 item 3): never ignore Step Law when the
ladder knows less than it does.

Derivation (docs/RESEARCH.md, "The formula as a prior"). In x = log η of the hidden matrices at the
target (the parameters Step Law's η is about; µP's readout and embeddings keep their multipliers):

- prior: the formula, x ~ N(x_F, σ_F²), x_F = log η_formula(N, D). σ_F is the formula's error at
  this scale, an input (`transfer.formula_prior.log_sd`): the papers give no error in log η for
  models this small, so it is a stated assumption, not a fitted constant;
- likelihood: the ladder's estimate x_L = log η_plan with σ_L² the sum of its independent parts in
  quadrature — the width transfer's RMS error √(bias² + se²) at the target (transfer/penalty.py:
  the plan's value against the target's estimated optimum, or the source optimum's log_se when the
  penalty was not priced), and each axis law's factor error (a fitted law: its 95% interval's
  log half-width / 1.96, conservative since that interval is Student's t; a prior: its exponent
  range as a uniform spread, (hi − lo)·|Δlog axis| / √12).

The Gaussian posterior's mean is the precision-weighted mean
    x* = w·x_L + (1 − w)·x_F,   w = σ_F² / (σ_F² + σ_L²),   σ*² = σ_F²·σ_L² / (σ_F² + σ_L²),
so a ladder much surer than the formula (σ_L ≪ σ_F) keeps its value and a ladder that knows little
(σ_L ≫ σ_F) hands the plan to the formula. A censored source optimum (a grid edge: the ladder knows a
bound, not a point with an error) is not combined: the plan says so and keeps the ladder's value.

Pure functions.
"""

from __future__ import annotations

import math
from typing import Any


def axis_log_sd(law: dict[str, Any]) -> float:
    """One axis law's error in log of its LR factor (the law dict of transfer/axes.py: axis_law)."""
    if law.get("basis") == "fit" and law.get("factor_interval"):
        lo, hi = law["factor_interval"]
        return math.log(hi / lo) / 2 / 1.96
    lo, hi = law.get("prior_range") or (law.get("exponent", 0.0), law.get("exponent", 0.0))
    shift = abs(math.log(law["target"] / law["base"]))
    return (hi - lo) * shift / math.sqrt(12)


def ladder_log_sd(width_rms: float | None, source_log_se: float | None, laws: dict[str, dict]) -> tuple[float | None, dict]:
    """σ_L and its parts. width_rms: √(bias² + se²) of the width transfer (None: not priced); then the
    source optimum's log_se stands for it; None if neither is known (no error: nothing to weigh)."""
    width = width_rms if width_rms is not None else source_log_se
    if width is None:
        return None, {}
    parts = {"width": float(width), **{f"axis {a}": axis_log_sd(law) for a, law in laws.items()}}
    return math.sqrt(sum(v * v for v in parts.values())), parts


def combine(ladder_lr: float, ladder_sd: float, formula_lr: float, formula_sd: float) -> dict[str, float]:
    """The posterior of log η from the formula's prior and the ladder's likelihood (module docstring)."""
    if not (ladder_lr > 0 and formula_lr > 0 and ladder_sd >= 0 and formula_sd > 0):
        raise ValueError(f"combine needs positive LRs and errors, got {ladder_lr=}, {ladder_sd=}, {formula_lr=}, {formula_sd=}")
    w = formula_sd**2 / (formula_sd**2 + ladder_sd**2)
    x = w * math.log(ladder_lr) + (1 - w) * math.log(formula_lr)
    return {
        "lr": math.exp(x),
        "weight_ladder": w,
        "log_sd": math.sqrt(formula_sd**2 * ladder_sd**2 / (formula_sd**2 + ladder_sd**2)),
        "factor": math.exp(x) / ladder_lr,
    }
