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
    return _smallest_within(ok, tolerance)


def _smallest_within(rows: Sequence[Row], tolerance: float) -> int:
    """The smallest B whose σ√T ≤ (1 + tolerance)·min σ√T over `rows` (all with a σ)."""
    best = min(r.sigma_sqrt_t for r in rows)
    return min(r.batch_size for r in rows if r.sigma_sqrt_t <= (1 + tolerance) * best)


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


def noise_choice(rows: Sequence[Row], tolerance: float) -> int:
    """The σ√T rule's B over every row with a valid σ, with no `min_steps` floor: the smallest B within
    `tolerance` of min σ√T. The predicted-loss rule's anchor (its step curve replaces the floor)."""
    ok = [r for r in rows if r.sigma_sqrt_t is not None]
    if not ok:
        raise ValueError("no feasible batch size: no σ meets the budget at any B")
    return _smallest_within(ok, tolerance)


def choose_batch_size_predicted(
    rows: Sequence[Row], model, epochs: float, dataset_size: int, tolerance: float = 0.05, level: float = 0.95
) -> tuple[int, list[dict], dict]:
    """B by the predicted loss L(T) + κ·(σ√T/(E·N))² (`dp.steps.LossModel`), guarded by its interval.
    Returns (B, every candidate's prediction, the decision).

    The anchor is the σ√T rule's B (`noise_choice`, no `min_steps` floor: the measured step curve
    says what few steps cost). The rule moves from it to the B of lowest predicted loss only when the
    predicted gain, L̂(B_σ) − L̂(B*), has its bootstrap `level` interval above 0 (every refit of
    `model.boot`; a model given without refits is taken as exact). So a steep measured step curve
    moves B down to buy steps; a flat one, or a fit whose error is as large as the differences it
    predicts, leaves the σ√T choice. Ties among predictions go to the smaller B. Derivation:
    `dp.steps` and docs/RESEARCH.md."""
    import numpy as np

    from hptransfer.dp.steps import noise_ratio

    ok = [r for r in rows if r.sigma_sqrt_t is not None]
    if not ok:
        raise ValueError("no feasible batch size: no σ meets the budget at any B")
    preds, rhos = [], {}
    for r in ok:
        rho = rhos[r.batch_size] = noise_ratio(r.sigma_sqrt_t / math.sqrt(r.steps), r.steps, epochs, dataset_size)
        preds.append(
            {
                "batch_size": r.batch_size,
                "steps": r.steps,
                "step_loss": model.step_loss(r.steps),
                "noise_penalty": model.noise_penalty(rho),
                "predicted_loss": model.predict(r.steps, rho),
                "extrapolated": not (model.steps_range[0] <= r.steps <= model.steps_range[1]),
            }
        )
    best = min(p["predicted_loss"] for p in preds)
    b_pred = min(p["batch_size"] for p in preds if p["predicted_loss"] <= best + 1e-12 * max(1.0, abs(best)))
    b_sigma = noise_choice(rows, tolerance)
    pred = {p["batch_size"]: p for p in preds}
    gain = pred[b_sigma]["predicted_loss"] - pred[b_pred]["predicted_loss"]
    decision = {"sigma_sqrt_t_choice": b_sigma, "predicted_best": b_pred, "predicted_gain": gain, "level": level}
    if b_pred == b_sigma:
        return b_sigma, preds, {**decision, "moved": False, "why": "the predicted best is the σ√T choice"}
    if model.boot is None:
        return b_pred, preds, {**decision, "moved": True, "why": "a given (not fitted) loss model, taken as exact"}
    steps = {r.batch_size: r.steps for r in ok}
    g = model.boot_predict(steps[b_sigma], rhos[b_sigma]) - model.boot_predict(steps[b_pred], rhos[b_pred])
    if g.size < 20:
        return b_sigma, preds, {**decision, "moved": False, "why": f"only {g.size} bootstrap refits: no interval"}
    lo, hi = (float(x) for x in np.quantile(g, [(1 - level) / 2, (1 + level) / 2]))
    moved = lo > 0
    why = (
        f"predicted gain of B={b_pred} over B={b_sigma}: {gain:.3g} [{lo:.3g}, {hi:.3g}] ({level:.0%} bootstrap, "
        f"{g.size} refits): " + ("above 0, moved" if moved else "not above 0, kept the σ√T choice")
    )
    return (b_pred if moved else b_sigma), preds, {**decision, "moved": moved, "gain_interval": [lo, hi], "why": why}


def clip_quantile(epsilon: float, quantile: float = 0.02, reference_epsilon: float = 8.0, exponent: float = 0.5) -> float:
    """The quantile p(ε) of the measured per-example gradient norms to clip at: its odds grow as ε falls,

        p/(1 − p) = q/(1 − q) · max(1, ε_ref/ε)^γ,

    so C starts in the low tail (q, default 0.02: nearly every example clipped) and moves up as ε
    falls, by the same factor (ε_ref/ε)^γ that `clip_shift` extends the grid by.

    Why the low tail (derivation in docs/RESEARCH.md, "Clipping bound from measured norms"): in the
    normalized form an example contributes min(1, ‖g_i‖/C) ≤ 1 of signal against noise of std σ
    whatever C is, so raising C above an example's norm only shrinks its share against the same
    noise; below the smallest norm C no longer matters (every example counts 1: normalized
    per-example gradients). The price of a low C is bias, clipping's re-weighting (`reweighting`).
    Measured (benchmarks/results/dp_finetune.json, a pretrained Llama fine-tuned under DP): C at
    0.25× and 0.63× the median norm (both below its 10% quantile) were within 0.001 of each other and
    beat 1.6× the median by 0.015–0.035 at every ε ∈ {0.5, 2, 8} and E ∈ {1, 4}.
    Why move up as ε falls: paper 1 finds the best C larger at smaller ε because, under strong
    privacy, the norms *during training* sit above where they were measured; keeping C in the low
    tail of the training-time norms means a higher quantile of the measured ones. Assumptions
    (ours): q, γ = 1/2 (the clip_shift exponent) and the odds form, which keeps p in (0, 1) for any
    q. γ = 0: the same quantile at every ε."""
    odds = quantile / (1.0 - quantile) * max(1.0, reference_epsilon / epsilon) ** exponent
    return odds / (1.0 + odds)


def clip_from_norms(
    norms: Sequence[float], epsilon: float, quantile: float = 0.02, reference_epsilon: float = 8.0, exponent: float = 0.5
) -> float:
    """C(ε) = the p(ε)-quantile of the measured per-example gradient norms (`clip_quantile`)."""
    import numpy as np

    a = np.asarray(norms, dtype=float)
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"per-example gradient norms must be a non-empty list of finite numbers ≥ 0, got {a.size} value(s)")
    return float(np.quantile(a, clip_quantile(epsilon, quantile, reference_epsilon, exponent)))


def reweighting(norms: Sequence[float], labels: Sequence, clip: float) -> dict[str, float]:
    """Paper 1's diagnostic: w_y(C) = mean over examples i of class (or bucket) y of min(1, C/‖g_i‖),
    the factor by which clipping at C scales that class's share of the summed gradient. Classes with
    large gradients (hard or rare ones) get w_y ≪ 1: clipping re-weights the objective towards the
    easy classes. A zero norm is never clipped (w = 1)."""
    if len(norms) != len(labels):
        raise ValueError(f"norms and labels differ in length ({len(norms)} vs {len(labels)})")
    acc: dict[str, list[float]] = {}
    for g, y in zip(norms, labels):
        acc.setdefault(str(y), []).append(1.0 if g <= clip else clip / g)
    return {y: sum(v) / len(v) for y, v in sorted(acc.items())}


def norm_buckets(norms: Sequence[float], n_buckets: int = 4) -> list[str]:
    """Labels for `reweighting` when examples have no class (a language model's sequences): the
    quantile bucket of each norm, "q1" (smallest norms) … "q{n}"."""
    import numpy as np

    a = np.asarray(norms, dtype=float)
    edges = np.quantile(a, np.linspace(0, 1, n_buckets + 1)[1:-1])
    return [f"q{int(np.searchsorted(edges, g, side='right')) + 1}" for g in a]
