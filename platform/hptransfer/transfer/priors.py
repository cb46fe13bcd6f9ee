"""Prior exponents of the optimal LR along steps, batch size and depth, as partial derivatives in the
coordinates the plan composes them in: d log η*/d log v at fixed N (width and depth) and the other
axes' values, i.e. the horizon at fixed batch, the batch at fixed *steps* (the batch arm's held
quantity: sweep.axes runs every batch value for the base point's steps), depth at fixed width.

Derivations (docs/RESEARCH.md, "Prior exponents"):
- steps, at fixed N and B: no published partial was available to us. DeepSeek's η ∝ C^−0.125 (arXiv
  2401.02954) is an exponent along its compute-optimal fits, where N and D move together, so it is
  *not* this partial; we assume its magnitude, −0.125, with the plausible range [−0.5, 0]: 0 is a
  horizon-free LR (what WSD recipes hold), −0.5 the constant-step optimum of convex Lipschitz SGD
  (η* = R/(G·√T)). An assumption, said as such in every plan that uses it.
- batch size, at fixed N and steps: Adam's square-root rule (Malladi et al., arXiv 2205.10287) holds
  at a fixed number of samples D: ∂log η*/∂log B |_D = ½. At fixed steps T, D = T·B grows with B, so
      ∂log η*/∂log B |_T = ∂log η*/∂log B |_D + ∂log η*/∂log D |_B = ½ + b_steps
  (∂log D/∂log B = 1 at fixed T, and at fixed B the horizon moves D as steps do): ½ − 0.125 = 0.375.
- depth: 0, the depth parametrization's per-layer rules carry the LR (CompleteP, arXiv 2505.01618;
  depth-µP, arXiv 2310.02244); with depth_parametrization none, an assumption.
The frontier formulas (DeepSeek, Step Law) stay as baselines (transfer/baselines.py), not priors.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

# Adam's √B rule at a fixed number of samples (Malladi et al., arXiv 2205.10287), below the critical batch.
SQRT_B_AT_FIXED_SAMPLES = 0.5
STEPS_EXPONENT = -0.125  # assumed (see above)
STEPS_RANGE = (-0.5, 0.0)


@dataclass(frozen=True)
class Prior:
    exponent: float  # ∂log η*/∂log v at fixed N and the other axes (batch: at fixed steps)
    held: str  # what the partial holds fixed
    range: tuple[float, float]  # the exponents the sources allow; the prior is an assumption inside it
    source: str


def batch_exponent_at_fixed_steps(steps_exponent: float = STEPS_EXPONENT) -> float:
    """∂log η*/∂log B at fixed T = ½ (fixed samples) + the horizon exponent (D = T·B grows with B)."""
    return SQRT_B_AT_FIXED_SAMPLES + steps_exponent


PRIORS = {
    "steps": Prior(
        STEPS_EXPONENT,
        "N, batch size",
        STEPS_RANGE,
        "assumed: DeepSeek's frontier exponent η ∝ C^-0.125 (arXiv 2401.02954) used as a partial at fixed N and B, "
        "which it is not; range [-0.5, 0] (convex constant-step optimum ∝ T^-1/2; horizon-free LR)",
    ),
    "batch_size": Prior(
        batch_exponent_at_fixed_steps(),
        "N, steps",
        (SQRT_B_AT_FIXED_SAMPLES + STEPS_RANGE[0], SQRT_B_AT_FIXED_SAMPLES + STEPS_RANGE[1]),
        "Malladi et al., arXiv 2205.10287 (Adam: η ∝ √B at fixed samples, below the critical batch) plus the "
        "steps prior for the B'/B more tokens at fixed steps: 0.5 + (-0.125)",
    ),
    "depth": Prior(
        0.0,
        "width, steps, batch size",
        (0.0, 0.0),
        "the depth parametrization's rules carry the LR across depth (CompleteP, arXiv 2505.01618; depth-µP, "
        "arXiv 2310.02244); with depth_parametrization none, an assumption",
    ),
}

__all__ = ["PRIORS", "SQRT_B_AT_FIXED_SAMPLES", "STEPS_EXPONENT", "Prior", "batch_exponent_at_fixed_steps"]
