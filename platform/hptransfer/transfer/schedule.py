"""The multiplicative warmup of rule `sp-warmup`, called by the trainer at every step.

Paper 3 (Kosson, Welborn, Liu, Jaggi, Chen, arXiv 2510.19093): µP acts as an implicit warmup. With
AdamW in the PyTorch form p ← p(1 − ηλ) − η·u and weights starting at their equilibrium norm, a
model m× wider in standard parametrization sees relative updates that start 1/m too large in µP's
terms and settle as the weight norm relaxes with factor (1 − ηλ) per step:
    s_t = (1 + (m² − 1)(1 − ηλ)^{2t})^{−1/2}
s_0 = 1/m, s_t → 1, and s_t = 1/√2 after ≈ ln(m)/(ηλ) steps. We write (1 − ηλ)^{2t} = exp(−2t/τ)
with τ = −1/ln(1 − ηλ) ≈ 1/(ηλ) by default; the paper's exact warmup (its Eq. 12–13) was not
published in what we could read, so τ is a parameter of the plan (`schedule.timescale`).
The trainer multiplies its usual schedule (linear warmup + cosine) by this factor.
"""

from __future__ import annotations

import math
from typing import Any


def sp_warmup_factor(step: int | float, m: float, timescale: float) -> float:
    """s_t for width ratio m and timescale τ (steps). Equals 1 for m = 1."""
    if m <= 1:
        return 1.0
    return (1.0 + (m * m - 1.0) * math.exp(-2.0 * step / timescale)) ** -0.5


def default_timescale(eta_lambda: float) -> float:
    """τ with (1 − ηλ)^{2t} = exp(−2t/τ)."""
    if not 0 < eta_lambda < 1:
        raise ValueError(f"η·λ must be in (0, 1) to set the warmup timescale, got {eta_lambda:g}")
    return -1.0 / math.log1p(-eta_lambda)


def steps_to_half(m: float, timescale: float) -> float:
    """Steps until s_t = 1/√2: (m² − 1)·exp(−2t/τ) = 1 ⇒ t = τ·ln(m² − 1)/2."""
    return timescale * math.log(m * m - 1) / 2 if m * m > 2 else 0.0


def warmup_multiplier(step: int | float, plan: Any) -> float:
    """Factor on the learning rate at `step` for a plan (TransferPlan or its dict); 1.0 when the
    plan's rule sets no multiplicative warmup."""
    sched = plan.get("schedule") if isinstance(plan, dict) else getattr(plan, "schedule", None)
    if not sched or sched.get("kind") != "sp-warmup":
        return 1.0
    return sp_warmup_factor(step, float(sched["m"]), float(sched["timescale"]))
