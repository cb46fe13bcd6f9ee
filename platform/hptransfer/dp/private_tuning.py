"""`dp.tuning: private`: tuning on the private data with the whole procedure accounted (pure rules:
numpy and Opacus' RDP analysis only; the procedure that runs them is dp/tuning_run.py).

For a user with no public proxy of the private corpus. Three mechanisms read the private data, and
their Rényi-DP curves ε_i(λ) compose by addition at every order λ (Mironov 2017, Prop. 1; adaptive
composition holds), converted once to (ε, δ) by Opacus' `get_privacy_spent`:

1. **C from a DP quantile** (`dp_quantile`): a noisy binary search over log C for the q-quantile of the
   per-example gradient norms of m private sequences at the pretrained model. Each step releases
   #{‖g_i‖ ≤ C} + N(0, s²): a count, sensitivity 1 under add/remove of one sequence, so the Gaussian
   mechanism's RDP λ/(2s²) per step (Mironov 2017, Cor. 3); k steps: k·λ/(2s²). The norms are never
   written; only C is. (Andrew et al. 2021 estimate the same quantile inside training; a one-shot
   search is simpler to account and C is then fixed for every trial.)
2. **The tuning** (`tnb_rdp`): Papernot & Steinke, "Hyperparameter tuning with Rényi differential
   privacy" (ICLR 2022), Theorem 2. Repeat a DP mechanism Q (one trial: hyperparameters drawn from a
   fixed distribution, i.e. random search, then DP-SGD on the private training sequences and a DP score
   on private validation sequences) K times, K drawn from the truncated negative binomial D_{η,γ}
   (P[K = k] ∝ (1−γ)^k·C(k+η−1, k) for k ≥ 1; η = 1 the geometric, η = 0 the logarithmic distribution),
   and release only the best. If Q is (λ, ε)-RDP and (λ̂, ε̂)-RDP, the whole is (λ, ε′)-RDP with
       ε′ = ε + (1+η)(1 − 1/λ̂)·ε̂ + (1+η)·log(1/γ)/λ̂ + log(E[K])/(λ−1),
   minimised here over λ̂ on the orders grid. E[K] = η(1−γ)/(γ(1−γ^η)) (η > 0), (1/γ − 1)/log(1/γ)
   (η = 0). Only the selected trial is released: the other trials' scores are kept in a state file
   for resuming and deleted when the selection is made.
3. **One trial's score** (`gaussian_rdp`): the mean over n private validation sequences of each one's
   mean next-token loss clipped to [0, L], plus N(0, s²): sensitivity L/n (n treated as public, as N
   is), RDP λ(L/n)²/(2s²). Composed with the trial's DP-SGD (Opacus' `compute_rdp` for the sampled
   Gaussian mechanism) into Q's curve.
4. **The private large run**: DP-SGD, its curve from `compute_rdp`.

`dp.epsilon` is the whole study's budget: `tuning_budget` picks the trials' per-trial ε so the quantile
and the tuning alone spend `share`·ε at δ, and `final_epsilon` the private run's own ε so that all of
it composed is at most dp.epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))  # Opacus' RDP alphas
COMPOSITION = "RDP composition (Mironov 2017) of the entries' curves, converted by Opacus' get_privacy_spent"


def orders() -> np.ndarray:
    return np.asarray(ORDERS, dtype=float)


def expected_trials(eta: float, gamma: float) -> float:
    """E[K] under the truncated negative binomial D_{η,γ} (Papernot & Steinke, §2)."""
    if not (0 < gamma < 1) or eta < 0:
        raise ValueError(f"need 0 < γ < 1 and η ≥ 0, got γ={gamma}, η={eta}")
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma**eta))


def gamma_for(mean_trials: float, eta: float) -> float:
    """γ such that E[K] = `mean_trials` (> 1): E[K] falls from ∞ to 1 as γ rises from 0 to 1."""
    if mean_trials <= 1:
        raise ValueError(f"the expected number of trials must exceed 1, got {mean_trials}")
    lo, hi = 1e-12, 1 - 1e-12
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_trials(eta, mid) > mean_trials else (lo, mid)
    return (lo + hi) / 2


def sample_trials(eta: float, gamma: float, rng: np.random.Generator) -> int:
    """K ~ D_{η,γ}: numpy's negative binomial (failures before η successes of probability γ, the
    same pmf for real η > 0) conditioned on K ≥ 1; η = 0 is numpy's logarithmic (log-series) law."""
    if eta == 0:
        return int(rng.logseries(1 - gamma))
    while True:
        k = int(rng.negative_binomial(eta, gamma))
        if k >= 1:
            return k


def tnb_rdp(trial_rdp: np.ndarray, eta: float, gamma: float, alphas: np.ndarray | None = None) -> np.ndarray:
    """Papernot & Steinke's Theorem 2 at every order λ of `alphas`, for a trial mechanism whose RDP
    curve is `trial_rdp` (ε(λ) on the same orders); the minimum over λ̂ ∈ alphas."""
    a = orders() if alphas is None else np.asarray(alphas, dtype=float)
    e = np.asarray(trial_rdp, dtype=float)
    log_k = math.log(expected_trials(eta, gamma))
    # the λ̂-terms, one per λ̂: (1+η)(1 − 1/λ̂)ε̂ + (1+η)log(1/γ)/λ̂
    hat = (1 + eta) * (1 - 1 / a) * e + (1 + eta) * math.log(1 / gamma) / a
    return e + hat.min() + log_k / (a - 1)


def gaussian_rdp(sensitivity: float, std: float, alphas: np.ndarray | None = None) -> np.ndarray:
    """The Gaussian mechanism's RDP λΔ²/(2s²) (Mironov 2017, Cor. 3)."""
    a = orders() if alphas is None else np.asarray(alphas, dtype=float)
    return a * sensitivity**2 / (2 * std**2)


def dp_sgd_rdp(sample_rate: float, sigma: float, steps: int, alphas: np.ndarray | None = None) -> np.ndarray:
    """T steps of the sampled Gaussian mechanism at (q, σ): Opacus' own RDP analysis."""
    from opacus.accountants.analysis.rdp import compute_rdp

    a = orders() if alphas is None else np.asarray(alphas, dtype=float)
    return np.asarray(compute_rdp(q=sample_rate, noise_multiplier=sigma, steps=steps, orders=list(a)), dtype=float)


def epsilon_of(rdp: np.ndarray, delta: float, alphas: np.ndarray | None = None) -> float:
    """(ε, δ) from an RDP curve: Opacus' conversion (the best order)."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    a = orders() if alphas is None else np.asarray(alphas, dtype=float)
    eps, _ = get_privacy_spent(orders=list(a), rdp=list(np.asarray(rdp, dtype=float)), delta=delta)
    return float(eps)


def dp_quantile(
    values: Sequence[float], quantile: float, lo: float, hi: float, steps: int, noise: float, rng: np.random.Generator
) -> float:
    """The `quantile` of `values` by a noisy binary search over [lo, hi] in log space: `steps`
    noisy counts #{v ≤ c} + N(0, noise²), each sensitivity 1 (`gaussian_rdp(1, noise)` per step).
    Returns the geometric midpoint of the last bracket."""
    v = np.asarray(values, dtype=float)
    a, b = math.log(lo), math.log(hi)
    target = quantile * len(v)
    for _ in range(steps):
        mid = (a + b) / 2
        count = float((v <= math.exp(mid)).sum()) + float(rng.normal(0.0, noise))
        a, b = (mid, b) if count < target else (a, mid)
    return math.exp((a + b) / 2)


def noisy_score(losses: Sequence[float], clip: float, noise: float, rng: np.random.Generator) -> float:
    """The mean of the per-sequence losses clipped to [0, clip] plus N(0, noise²): sensitivity clip/n."""
    x = np.clip(np.asarray(losses, dtype=float), 0.0, clip)
    return float(x.mean() + rng.normal(0.0, noise))


@dataclass(frozen=True)
class Candidate:
    """One batch size a trial may draw: its q, T and the σ calibrated to the per-trial ε."""

    batch_size: int
    sample_rate: float
    steps: int
    sigma: float


@dataclass(frozen=True)
class TuningBudget:
    """The private tuning's settings and curves (all on `orders()`)."""

    trial_epsilon: float  # each trial's DP-SGD alone at δ (the knob the solver turns)
    candidates: tuple[Candidate, ...]
    gamma: float
    eta: float
    quantile_rdp: np.ndarray
    score_rdp: np.ndarray
    trial_rdp: np.ndarray  # the worst candidate's DP-SGD curve + the score's
    tuning_rdp: np.ndarray  # Theorem 2 of the trial curve
    epsilon: float  # the quantile and the tuning together, at δ

    @property
    def rdp(self) -> np.ndarray:
        return self.quantile_rdp + self.tuning_rdp


def trial_curve(candidates: Sequence[Candidate], score_rdp: np.ndarray) -> np.ndarray:
    """Q's curve: the pointwise maximum over the candidates a trial may draw (Q is each of them with
    some probability; the max bounds every one), plus the score's."""
    return np.max([dp_sgd_rdp(c.sample_rate, c.sigma, c.steps) for c in candidates], axis=0) + score_rdp


def tuning_budget(
    share_epsilon: float,
    delta: float,
    batch_steps: Sequence[tuple[int, float, int]],
    sigma_for: Callable[[float, float, int], float],
    mean_trials: float,
    eta: float,
    quantile_rdp: np.ndarray,
    score_rdp: np.ndarray,
) -> TuningBudget:
    """The per-trial ε such that the quantile and the tuning together spend `share_epsilon` at δ
    (bisection in log ε: the spend rises with it). `batch_steps`: (B, q, T) per candidate;
    `sigma_for(ε, q, T)` the σ for a trial's DP-SGD alone. Raises ValueError when the quantile and
    the scores alone (trials of ε → 0) already spend the share."""
    gamma = gamma_for(mean_trials, eta)

    def build(eps_t: float) -> TuningBudget:
        cands = tuple(Candidate(b, q, t, sigma_for(eps_t, q, t)) for b, q, t in batch_steps)
        trial = trial_curve(cands, score_rdp)
        tun = tnb_rdp(trial, eta, gamma)
        return TuningBudget(eps_t, cands, gamma, eta, quantile_rdp, score_rdp, trial, tun, epsilon_of(quantile_rdp + tun, delta))

    floor = epsilon_of(quantile_rdp + tnb_rdp(score_rdp, eta, gamma), delta)
    if floor >= share_epsilon:
        raise ValueError(
            f"the DP quantile and the trials' scores alone spend ε={floor:.4g} ≥ the tuning's share {share_epsilon:.4g}"
        )
    lo, hi = math.log(1e-3), math.log(max(share_epsilon, 1e-3) * 4)
    best = None
    for _ in range(30):
        mid = (lo + hi) / 2
        try:
            cand = build(math.exp(mid))
        except ValueError:  # no σ reaches this per-trial ε (too small): go up
            lo = mid
            continue
        if cand.epsilon <= share_epsilon:
            best, lo = cand, mid
        else:
            hi = mid
        if best is not None and share_epsilon - best.epsilon < 0.01 * share_epsilon:
            break
    if best is None:
        raise ValueError(f"no per-trial ε ≥ 1e-3 keeps the tuning within its share ε={share_epsilon:.4g}")
    return best


def final_epsilon(
    budget_epsilon: float,
    delta: float,
    prior_rdp: np.ndarray,
    sample_rate: float,
    steps: int,
    sigma_for: Callable[[float, float, int], float],
) -> tuple[float, float, float]:
    """The private run's own ε (its σ = sigma_for(ε, q, T)) such that its curve composed with
    `prior_rdp` (the quantile and the tuning) spends at most `budget_epsilon` at δ: the largest such ε
    by bisection. Returns (its ε, σ, the composed total)."""
    lo, hi = 1e-3, budget_epsilon
    best = None
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        try:
            sigma = sigma_for(mid, sample_rate, steps)
        except ValueError:
            lo = mid
            continue
        total = epsilon_of(prior_rdp + dp_sgd_rdp(sample_rate, sigma, steps), delta)
        if total <= budget_epsilon:
            best, lo = (mid, sigma, total), mid
        else:
            hi = mid
        if best is not None and budget_epsilon - best[2] < 0.01 * budget_epsilon:
            break
    if best is None:
        raise ValueError(f"the tuning leaves no room for the private run within ε={budget_epsilon:g}")
    return best


__all__ = [
    "COMPOSITION",
    "ORDERS",
    "Candidate",
    "TuningBudget",
    "dp_quantile",
    "dp_sgd_rdp",
    "epsilon_of",
    "expected_trials",
    "final_epsilon",
    "gamma_for",
    "gaussian_rdp",
    "noisy_score",
    "orders",
    "sample_trials",
    "tnb_rdp",
    "trial_curve",
    "tuning_budget",
]
