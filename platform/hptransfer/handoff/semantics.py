"""The AdamW semantics the fold assumes: stated in optimizer.json, measured on each consumer's optimizer.

handoff/fold.py moves a forward multiplier α into the optimizer (initial weight × α, LR × α, weight
decay / α, ε / α). Its derivation holds for torch.optim.AdamW's update

    p ← p·(1 − η_g·λ_g) − η_g·m̂/(√v̂ + ε_g),   m̂, v̂ bias-corrected,

and breaks silently under the other common variants:
- decay not scaled by the group's LR (Composer's DecoupledAdamW, p·(1 − λ·η_t/η_0)): λ / α would
  have to be λ, so the folded layer decays α times too fast or too slow;
- L2 decay through the gradient (torch.optim.Adam's weight_decay; Megatron-core with
  `decoupled_weight_decay: False`): the decay then passes through Adam's normalisation;
- ε inside the square root (optax's `eps_root`, m̂/√(v̂ + ε)): W′ = α·W needs ε / α², not ε / α;
- no bias correction: not a fold error, but the first steps differ from the large run's (conformance).

`probe` measures these three properties of an optimizer from two steps on scalar parameters with
known gradients; each trainer file's check (to_torch, to_torchtitan, to_megatron) runs it on the
optimizer that trainer builds from the file, and a file whose optimizer differs is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class AdamWSemantics(BaseModel):
    """What optimizer.json's multipliers assume of the optimizer that applies them."""

    model_config = ConfigDict(extra="forbid")
    weight_decay: Literal["decoupled-times-group-lr", "decoupled-not-times-lr", "l2-in-gradient", "unrecognised"] = Field(
        "decoupled-times-group-lr",
        description="p ← p·(1 − lr_g·wd_g) before the Adam step (torch.optim.AdamW); wd_mult is relative to it.",
    )
    eps: Literal["outside-sqrt", "inside-sqrt", "unrecognised"] = Field(
        "outside-sqrt", description="The update is m̂/(√v̂ + eps_g); eps_mult is relative to that ε, not an eps_root."
    )
    bias_correction: bool = Field(True, description="m̂ = m/(1 − β1^t), v̂ = v/(1 − β2^t).")


ASSUMED = AdamWSemantics()

# One optimizer over one scalar parameter: (param, lr, weight_decay, eps) → an optimizer the consumer built.
MakeOptimizer = Callable[[Any, float, float, float], Any]

LR, WD = 0.1, 0.5


def _run(make: MakeOptimizer, p0: float, grad: float, wd: float, eps: float, steps: int) -> float:
    import torch

    p = torch.nn.Parameter(torch.tensor([p0], dtype=torch.float64))
    opt = make(p, LR, wd, eps)
    for _ in range(steps):
        opt.zero_grad()
        p.grad = torch.tensor([grad], dtype=torch.float64)
        opt.step()
    return p.item()


def probe(make: MakeOptimizer, betas: tuple[float, float]) -> AdamWSemantics:
    """Measure the optimizer `make` builds (with the consumer's `betas`):
    - decay: p₀ = 1, no gradient, lr 0.1, wd 0.5, one step: 0.95 when decoupled × lr, 0.5 when
      decoupled without the LR, 0.9 when L2 (the gradient λ·p normalised by Adam to one LR step);
    - ε: p₀ = 0, one step with gradient = ε = 1e-4 and with both 1e-2: the same update when ε is outside
      the root (−lr/2 with bias correction), ≈ 10× smaller at 1e-4 when inside it (−lr·1e-4/√(1e-8 + 1e-4));
    - bias correction: p₀ = 0, gradient 1, ε 1e-12, two steps: −2·lr corrected; uncorrected
      −lr·((1 − β1)/√(1 − β2) + (1 − β1²)/√(1 − β2²)), which is 2 only at β1 = 0."""
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9)  # float32 optimizers round at 1e-7
    decayed = _run(make, 1.0, 0.0, WD, 1e-8, 1)
    decay = next(
        (
            k
            for k, v in (
                ("decoupled-times-group-lr", 1 - LR * WD),
                ("decoupled-not-times-lr", 1 - WD),
                ("l2-in-gradient", 1 - LR),
            )
            if close(decayed, v)
        ),
        "unrecognised",
    )
    # ε has the units of the gradient outside the root and of its square inside it: scaling the gradient
    # and ε together by 100 leaves the first update unchanged only when ε is outside (with or without
    # bias correction), and ε = g must then still matter (against ε ≈ 0).
    same_units = _run(make, 0.0, 1e-4, 0.0, 1e-4, 1), _run(make, 0.0, 1e-2, 0.0, 1e-2, 1)
    no_eps = _run(make, 0.0, 1e-4, 0.0, 1e-12, 1)
    if close(*same_units) and not close(same_units[0], no_eps):
        eps = "outside-sqrt"
    elif abs(same_units[0]) < 0.5 * abs(same_units[1]):
        eps = "inside-sqrt"
    else:
        eps = "unrecognised"
    b1, b2 = betas
    two = _run(make, 0.0, 1.0, 0.0, 1e-12, 2)
    uncorrected = -LR * ((1 - b1) / math.sqrt(1 - b2) + (1 - b1**2) / math.sqrt(1 - b2**2))
    corrected = close(two, -2 * LR) and not close(two, uncorrected)
    return AdamWSemantics(weight_decay=decay, eps=eps, bias_correction=corrected)


def check_semantics(trainer: str, make: MakeOptimizer, betas: tuple[float, float], want: AdamWSemantics = ASSUMED) -> None:
    """Probe the optimizer `trainer` builds from its file; raise, naming each property, where it differs."""
    bad = semantics_mismatch(probe(make, betas), want)
    if bad:
        raise RuntimeError(
            f"{trainer} hand-off check: its optimizer does not apply optimizer.json's multipliers as they assume "
            f"({'; '.join(bad)}); the folded µP multipliers would train a different model (handoff/semantics.py)"
        )


def one_param_module(p: Any) -> Any:
    """A module whose only parameter, named `w`, is `p` (for trainers that build from a model)."""
    import torch

    m = torch.nn.Module()
    m.register_parameter("w", p)
    return m


def semantics_mismatch(got: AdamWSemantics, want: AdamWSemantics = ASSUMED) -> list[str]:
    """Each property where the measured optimizer differs from what optimizer.json assumes."""
    return [
        f"{k}: the trainer's optimizer has {getattr(got, k)!r}, optimizer.json assumes {v!r}"
        for k, v in want
        if getattr(got, k) != v
    ]


__all__ = ["ASSUMED", "AdamWSemantics", "MakeOptimizer", "check_semantics", "one_param_module", "probe", "semantics_mismatch"]
