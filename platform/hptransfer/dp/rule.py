"""The DP rule, as pure functions: batch size from cumulative noise, an ε-shifted clipping grid, and
the learning-rate scaling. No Opacus, Ray or MLflow here; the σ√T table comes from `accounting`.

Reference: Rehn, Zhao, Heikkilä, Honkela, "On Optimal Hyperparameters for Differentially Private
Deep Transfer Learning", arXiv 2510.20616 (paper 1 in docs/RESEARCH.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol


class Row(Protocol):
    batch_size: int
    sigma_sqrt_t: float | None
    feasible: bool


def choose_batch_size(rows: Sequence[Row], tolerance: float) -> int:
    """Smallest feasible B with σ√T ≤ (1 + tolerance) · min over feasible B of σ√T.

    Why σ√T: with a fixed epoch budget E, T = ceil(E·N/B). In the normalized form the update is
    (Σ clip(g_i)/C + σ·z)/B, so the noise summed over the run has std σ√T (per coordinate, before
    the 1/B that the learning rate absorbs). Per-step noise σ/B always points to full batch and is
    the wrong criterion under a fixed epoch budget (paper 1, Sec. "cumulative noise").
    Why the smallest within tolerance: at tight ε, σ√T is nearly flat in B (TAN, Sander et al.
    arXiv 2210.03403: σ√T ≈ E/η_TAN at fixed ε), so a smaller B costs no noise and buys more
    steps; at loose ε σ√T keeps falling and the rule moves to large B. The tolerance is not given
    in the paper (assumption: 5% by default). Feasibility (T ≥ min_steps, σ exists) is decided
    by the caller and carried on the rows.
    """
    ok = [r for r in rows if r.feasible and r.sigma_sqrt_t is not None]
    if not ok:
        raise ValueError("no feasible batch size: every B either has T < min_steps or no σ meets the budget")
    best = min(r.sigma_sqrt_t for r in ok)
    return min(r.batch_size for r in ok if r.sigma_sqrt_t <= (1 + tolerance) * best)


def clip_shift(epsilon: float, reference_epsilon: float = 8.0, exponent: float = 0.5) -> float:
    """Factor by which the clipping grid moves up as ε falls: max(1, ε_ref/ε)^γ.

    Paper 1 gives the direction only: optimal C is larger for smaller ε, because per-example
    gradient-norm distributions shift upward (and turn bimodal) under strong privacy, so a
    quantile rule on the norms misleads. The size of the shift is our assumption, made explicit:
    - γ = 0 is "no shift" (what a quantile/fixed rule does), which the paper shows is wrong;
    - γ = 1 is the most the shift can plausibly be: the norms track the noise-driven distance
      from the optimum, which grows linearly with the cumulative noise σ√T ∝ 1/ε (large-σ regime);
    - we take the geometric middle, γ = 1/2 (assumption!: ‖g‖ ∝ √(excess loss), excess loss ∝ σ√T).
    From ε_ref = 8 to ε = 0.5 that extends the grid up 4× (2 octaves); `clip_grid` keeps the
    unshifted points too, so a wrong γ costs grid points, not the optimum.
    """
    return max(1.0, reference_epsilon / epsilon) ** exponent


def clip_grid(
    epsilon: float, reference: float, factors: Sequence[float], reference_epsilon: float = 8.0, exponent: float = 0.5
) -> list[float]:
    """C grid = reference·factors, extended upward by the points of reference·factors·clip_shift(ε)
    that lie above it, with `reference` a typical per-example gradient norm measured on public
    data (the grid is relative to the norm distribution, paper 1).

    Why an extension and not a pure translation: the shift's size is our assumption (γ above), and on
    our digits task (benchmarks/dp_directions.py) the best C sat at ≤ 0.5× the reference at both
    ε = 8 and ε = 0.5, below a ×4-translated grid. Keeping the low end costs a few grid points;
    translating would have excluded the optimum. At ε ≥ ε_ref the grid is unchanged."""
    s = clip_shift(epsilon, reference_epsilon, exponent)
    base = sorted(reference * f for f in factors)
    return base + sorted(reference * f * s for f in factors if reference * f * s > base[-1] * (1 + 1e-9))


def lr_scale(from_batch: int, to_batch: int) -> float:
    """η′ = η · √(B′/B): the square-root rule for Adam-type optimizers (Malladi et al., "On the SDEs
    and Scaling Rules for Adaptive Gradient Algorithms", arXiv 2205.10287), which paper 1 uses as
    the starting point when B changes; it keeps the update's noise scale η/√B fixed. A start for
    joint tuning, not a guarantee."""
    return math.sqrt(to_batch / from_batch)
