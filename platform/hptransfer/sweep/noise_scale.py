"""The gradient noise scale B_simple = tr(Σ)/|G|², measured cheaply at the end of a trial: the
critical batch size of McCandlish et al. ("An Empirical Model of Large-Batch Training", arXiv
1812.06162), beyond which a larger batch buys little (and the √B LR rule stops holding).

Their unbiased two-batch estimator (appendix A.1): with |G_b|² the squared norm of a gradient over b
examples, E|G_b|² = |G|² + tr(Σ)/b, so two sizes b < B give
    |G|²  ≈ (B·|G_B|² − b·|G_b|²)/(B − b),      tr(Σ) ≈ (|G_b|² − |G_B|²)/(1/b − 1/B).
One batch of B sequences split into m micro-batches gives both: |G_b|² is the mean of the
micro-batch gradients' squared norms, |G_B|² the squared norm of their mean. Numerators and
denominators are averaged over `n_batches` batches before the ratio (the ratio of means is the
paper's; a mean of ratios is dominated by batches where |G|² is near 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch


def gradient_noise_scale(
    model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], loss_fn: Callable
) -> float:
    """B_simple in sequences; NaN when a batch cannot be split (B < 2) or |G|² is not positive.
    `loss_fn(model, x, y)` is the mean loss over the rows of x. Leaves the gradients cleared."""
    params = [p for p in model.parameters() if p.requires_grad]
    g2, trace = [], []
    for x, y in batches:
        big = x.shape[0]
        m = next((k for k in (4, 2) if big % k == 0 and big >= k), None)
        if m is None:
            return math.nan
        b = big // m
        total, small = None, 0.0
        for i in range(m):
            model.zero_grad(set_to_none=True)
            loss_fn(model, x[i * b : (i + 1) * b], y[i * b : (i + 1) * b]).backward()
            g = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]).double()
            small += float(g @ g) / m
            total = g if total is None else total + g
        mean = total / m
        full = float(mean @ mean)
        g2.append((big * full - b * small) / (big - b))
        trace.append((small - full) / (1 / b - 1 / big))
    model.zero_grad(set_to_none=True)
    if not g2:
        return math.nan
    G2, S = sum(g2) / len(g2), sum(trace) / len(trace)
    return S / G2 if G2 > 0 and math.isfinite(S / G2) else math.nan
