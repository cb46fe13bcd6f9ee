"""Synthetic sweeps with a known true optimum, for tests, docs and benchmarks of the engine.

Loss model (paper 2's picture, arXiv 2512.22768): φ_n(ν) = φ_∞ + A·n^−α + κ·(log ν − log ν*(n))²
with ν*(n) = ν*_∞·exp(B·n^−β) (set B = 0 for a width-invariant optimum, or `power` = b for a
pure power law ν*(n) = ν0·(n/n0)^b), plus Gaussian noise per trial (std `noise`, independent
across seeds and grid values: the seed noise of docs/RESEARCH.md, not its chaos). Trials with ν above
`diverge_above(n)` diverge (NaN loss, status `diverged`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd


def true_optimum(
    n: float, nu_inf: float, B: float = 0.0, beta: float = 0.5, power: float | None = None, n0: float = 64.0
) -> float:
    if power is not None:
        return nu_inf * (n / n0) ** power
    return nu_inf * math.exp(B * n**-beta)


def synthetic_trials(
    n: int,
    grid,
    *,
    nu_inf: float = 3e-3,
    B: float = 0.0,
    beta: float = 0.5,
    power: float | None = None,
    n0: float = 64.0,
    kappa: float = 0.08,
    phi_inf: float = 2.0,
    A: float = 4.0,
    alpha: float = 0.5,
    noise: float = 0.0,
    n_seeds: int = 1,
    diverge_above: float | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One width's trials as arrays (values, losses, diverged), seeds repeated per grid value: the
    fast path for calibration tests that draw thousands of sweeps (no DataFrame per draw)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    v = np.repeat(np.asarray(grid, float), n_seeds)
    opt = true_optimum(n, nu_inf, B, beta, power, n0)
    loss = phi_inf + A * n**-alpha + kappa * (np.log(v) - math.log(opt)) ** 2 + noise * rng.standard_normal(len(v))
    div = v > diverge_above if diverge_above is not None else np.zeros(len(v), bool)
    loss[div] = np.nan
    return v, loss, div


def synthetic_sweep(
    widths,
    grid,
    *,
    nu_inf: float = 3e-3,
    B: float = 0.0,
    beta: float = 0.5,
    power: float | None = None,
    n0: float = 64.0,
    kappa: float = 0.08,
    phi_inf: float = 2.0,
    A: float = 4.0,
    alpha: float = 0.5,
    noise: float = 0.0,
    seeds=(0,),
    diverge_above: Callable[[int], float] | None = None,
    hp: str = "lr",
    rng_seed: int = 0,
) -> pd.DataFrame:
    rng = np.random.default_rng(rng_seed)
    rows = []
    for n in widths:
        opt = true_optimum(n, nu_inf, B, beta, power, n0)
        for v in grid:
            for s in seeds:
                if diverge_above is not None and v > diverge_above(n):
                    rows.append({"width": n, hp: v, "seed": s, "val_loss": float("nan"), "status": "diverged"})
                    continue
                loss = phi_inf + A * n**-alpha + kappa * (math.log(v) - math.log(opt)) ** 2
                rows.append({"width": n, hp: v, "seed": s, "val_loss": loss + noise * rng.standard_normal(), "status": "ok"})
    return pd.DataFrame(rows)


def synthetic_axes_sweep(
    widths,
    grid,
    *,
    base: dict[str, int],
    arms: dict[str, list[int]],
    exponents: dict[str, float],
    arm_width: int | None = None,
    nu0: float = 3e-3,
    kappa: float = 0.08,
    noise: float = 0.0,
    seeds=(0,),
    rng_seed: int = 0,
) -> pd.DataFrame:
    """A width-invariant optimum ν0 at the base point (steps, batch_size, depth) with a power law
    along each axis: ν*(v) = ν0·Π_a (v_a/base_a)^exponents[a]. Rows: the width ladder at the base,
    then each axis's `arms` values at `arm_width` (default: the narrowest), the other axes at base;
    columns width, steps, batch_size, depth, lr, seed, val_loss, status."""
    rng = np.random.default_rng(rng_seed)
    points = [(n, dict(base)) for n in widths]
    arm_width = arm_width or min(widths)
    points += [(arm_width, {**base, a: v}) for a, vals in arms.items() for v in vals if v != base[a]]
    rows = []
    for n, at in points:
        opt = nu0 * math.prod((at[a] / base[a]) ** exponents.get(a, 0.0) for a in base)
        for v in grid:
            for s in seeds:
                loss = 2.0 + 4.0 * n**-0.5 + kappa * (math.log(v) - math.log(opt)) ** 2 + noise * rng.standard_normal()
                rows.append({"width": n, **at, "lr": v, "seed": s, "val_loss": loss, "status": "ok"})
    return pd.DataFrame(rows)
