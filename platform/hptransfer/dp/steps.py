"""The predicted-loss batch rule's model of a DP fine-tuning run (pure: numpy and pandas only).

Under a fixed epoch budget E, the batch size B sets both the number of steps T = ceil(E·N/B) and the
cumulative DP noise σ(B)·√T. Paper 1's σ√T rule looks at the noise alone; a step-limited task (ours,
benchmarks/results/dp_lm.json: the σ√T rule's B = 512, T = 32 lost to B = 256 and to the grid best
at ε = 2 and 8) also pays for having few steps. So we predict the final loss as

    L(B) = L_∞ + A·T^(−α)  +  κ·(σ√T / (E·N))²
           └ step curve ┘     └ DP-noise penalty ┘

and choose the B with the lowest prediction (`rule.choose_batch_size_predicted`). Derivation and
assumptions in docs/RESEARCH.md (paper 1, "Predicted-loss batch rule"):
- Step curve: the loss of a run with T steps and no DP noise, a saturating power law (the usual
  empirical form of loss against steps). Assumption: at fixed E the noise-free loss depends on B only
  through T (B below the critical batch size, and the LR moved with B by the measured law below).
- Noise penalty: in the normalized form every clipped example contributes at most a unit vector, so
  the signal summed over the run has norm ≤ E·N whatever B is, and the noise summed over the run has
  std σ√T per coordinate. Their ratio ρ = σ√T/(E·N) is the run's noise-to-signal ratio; a random
  perturbation of the parameters of relative size ρ costs, to second order around where the run
  ends, a loss ∝ ρ² (the first-order term averages to zero). κ is that curvature constant, fitted.
  When the step curve is flat (α → 0 or T large), minimising L is minimising σ√T: the σ√T rule.
- Fit: α on a grid, (L_∞, A, κ) by least squares with A, κ ≥ 0, on per-(ε, B) points: noise-free
  trials (σ = 0, ρ = 0) pin the step curve; private trials at several ε give κ and, because ρ varies
  with ε at a fixed T, also separate the two terms when no noise-free trial exists.
- Guard: the fit carries bootstrap refits (cells resampled with replacement); the rule leaves the
  σ√T rule's B for the predicted best only when the predicted gain's bootstrap interval is above 0
  (`rule.choose_batch_size_predicted`). A fit whose rmse is as large as the differences it predicts
  between batch sizes (dp_finetune: rmse 0.044–0.05 against gaps of 0.003–0.015) moves nothing.
- LR: a trial's point is its best LR's loss, so the curve is the tuned-LR curve; how that LR moves
  with B is fitted as a power law η*(B) = η_ref·(B/B_ref)^β (`fit_lr_law`; one B: β = 1/2, Adam's
  square-root rule, the prior).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALPHAS = tuple(np.round(np.arange(0.05, 2.0001, 0.05), 4))  # the grid of step-curve exponents α
N_BOOT = 100  # bootstrap refits of the loss model: enough for a 95% interval's ends to ±0.5 cells


def noise_ratio(sigma: float, steps: int, epochs: float, dataset_size: int) -> float:
    """ρ = σ√T / (E·N): cumulative DP noise over the run's maximal cumulative clipped signal."""
    return sigma * math.sqrt(steps) / (epochs * dataset_size)


@dataclass(frozen=True)
class StepPoint:
    """One measured (ε, B) cell: its steps, its noise ratio ρ (0: no DP noise) and best loss."""

    steps: int
    rho: float
    loss: float
    batch_size: int | None = None
    epsilon: float | None = None  # None or inf: a noise-free trial


@dataclass(frozen=True)
class LossModel:
    """L(T, ρ) = l_inf + a·T^(−alpha) + kappa·ρ², fitted on `n_points` cells."""

    l_inf: float
    a: float
    alpha: float
    kappa: float
    n_points: int
    rmse: float
    steps_range: tuple[int, int]  # the measured T: outside it the step curve is extrapolated
    # (l_inf, a, alpha, kappa) of each bootstrap refit; None: a model given, not fitted (taken as exact)
    boot: tuple[tuple[float, float, float, float], ...] | None = None

    def step_loss(self, steps: int) -> float:
        return self.l_inf + self.a * steps ** (-self.alpha)

    def noise_penalty(self, rho: float) -> float:
        return self.kappa * rho * rho

    def predict(self, steps: int, rho: float) -> float:
        return self.step_loss(steps) + self.noise_penalty(rho)

    def boot_predict(self, steps: int, rho: float) -> np.ndarray:
        """The prediction under every bootstrap refit (empty without refits)."""
        b = np.asarray(self.boot or (), dtype=float).reshape(-1, 4)
        return b[:, 0] + b[:, 1] * float(steps) ** (-b[:, 2]) + b[:, 3] * rho * rho

    def as_dict(self) -> dict:
        return {
            "law": "L = l_inf + a·T^-alpha + kappa·(σ√T/(E·N))²",
            "l_inf": self.l_inf,
            "a": self.a,
            "alpha": self.alpha,
            "kappa": self.kappa,
            "n_points": self.n_points,
            "rmse": self.rmse,
            "steps_range": list(self.steps_range),
            "bootstrap_refits": None if self.boot is None else len(self.boot),
        }


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray, nonneg: Sequence[int]) -> tuple[np.ndarray, float]:
    """Least squares with the columns in `nonneg` constrained ≥ 0 (exhaustive active sets: ≤ 3
    columns here, so exact and cheap)."""
    best, best_sse = None, math.inf
    k = x.shape[1]
    for mask in range(1 << len(nonneg)):
        drop = {nonneg[i] for i in range(len(nonneg)) if mask >> i & 1}
        keep = [j for j in range(k) if j not in drop]
        coef = np.zeros(k)
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if any(coef[j] < 0 for j in nonneg):
            continue
        sse = float(np.sum((x @ coef - y) ** 2))
        if sse < best_sse - 1e-15:
            best, best_sse = coef, sse
    assert best is not None  # dropping every constrained column is always admissible
    return best, best_sse


def _fit(t: np.ndarray, rho2: np.ndarray, y: np.ndarray, alphas: Sequence[float]) -> tuple[float, np.ndarray, float]:
    """(α, [l_inf, a, kappa], sse): least squares over the α grid, a and κ ≥ 0."""
    has_noise = bool(np.any(rho2 > 0))
    best = None
    for alpha in alphas:
        cols = [np.ones_like(t), t ** (-alpha)] + ([rho2] if has_noise else [])
        coef, sse = _nonneg_lstsq(np.stack(cols, axis=1), y, [1, 2] if has_noise else [1])
        if best is None or sse < best[2] - 1e-15:
            best = (float(alpha), coef, sse)
    alpha, coef, sse = best
    return alpha, (coef if has_noise else np.append(coef, 0.0)), sse


def fit_loss_model(
    points: Sequence[StepPoint], alphas: Sequence[float] = ALPHAS, n_boot: int = N_BOOT, seed: int = 0
) -> LossModel:
    """Fit L(T, ρ) to the cells, with `n_boot` bootstrap refits (cells resampled with replacement;
    a resample with < 2 distinct T is skipped); raises ValueError (saying what to add) when the data
    cannot identify a step curve: fewer than 3 cells or fewer than 2 distinct T."""
    pts = [p for p in points if math.isfinite(p.loss)]
    if len(pts) < 3 or len({p.steps for p in pts}) < 2:
        raise ValueError(
            f"a step curve needs ≥ 3 finite cells at ≥ 2 different step counts T, got {len(pts)} cell(s) at "
            f"T = {sorted({p.steps for p in pts})}; run the DP sweep over more batch sizes (or noise-free trials)"
        )
    t = np.array([p.steps for p in pts], dtype=float)
    rho2 = np.array([p.rho for p in pts]) ** 2
    y = np.array([p.loss for p in pts])
    alpha, coef, sse = _fit(t, rho2, y, alphas)
    rng, boot = np.random.default_rng(seed), []
    for _ in range(n_boot):
        i = rng.integers(0, len(pts), len(pts))
        if len(set(t[i])) < 2:
            continue
        a_i, c_i, _ = _fit(t[i], rho2[i], y[i], alphas)
        boot.append((float(c_i[0]), float(c_i[1]), a_i, float(c_i[2])))
    return LossModel(
        l_inf=float(coef[0]),
        a=float(coef[1]),
        alpha=alpha,
        kappa=float(coef[2]),
        n_points=len(pts),
        rmse=math.sqrt(sse / len(pts)),
        steps_range=(int(t.min()), int(t.max())),
        boot=tuple(boot),
    )


def fit_lr_law(batch_sizes: Sequence[int], lrs: Sequence[float]) -> tuple[float, float, int]:
    """(β, η_ref, B_ref) of η*(B) = η_ref·(B/B_ref)^β, by least squares in log-log over the best LR
    per batch size; B_ref is the geometric middle of the measured B. One B: β = 1/2 (the square-root
    rule for Adam, Malladi et al. arXiv 2205.10287), the prior."""
    if len(batch_sizes) != len(lrs) or not batch_sizes:
        raise ValueError("fit_lr_law needs one best LR per batch size, and at least one")
    lb, ll = np.log(np.asarray(batch_sizes, float)), np.log(np.asarray(lrs, float))
    ref = int(round(math.exp(float(lb.mean()))))
    if len(set(batch_sizes)) < 2:
        return 0.5, float(math.exp(ll.mean())), ref
    beta, icpt = np.polyfit(lb - math.log(ref), ll, 1)
    return float(beta), float(math.exp(icpt)), ref


def step_points_from_table(df, epochs: float, dataset_size: int, metric: str = "val_loss") -> list[StepPoint]:
    """The DP sweep table (`dp_sweep_results.csv`: one row per trial) as per-(ε, B) cells: the mean
    over seeds of each (C, lr) setting, then the best setting. Noise-free trials are the rows with
    σ = 0 (ε = inf); they get ρ = 0. Only `status == ok` rows count."""
    ok = df[(df["status"] == "ok") & df[metric].notna()]
    if ok.empty:
        return []
    eps = ok["epsilon"].astype(float)
    ok = ok.assign(_eps=eps.where(np.isfinite(eps), math.inf))
    means = ok.groupby(["_eps", "batch_size", "clip", "lr"], dropna=False).agg(
        loss=(metric, "mean"), steps=("steps", "first"), sigma=("sigma", "first")
    )
    out = []
    for (e, b), g in means.groupby(level=[0, 1]):
        best = g.loc[g["loss"].idxmin()]
        sigma = 0.0 if not math.isfinite(e) else float(best["sigma"])
        out.append(
            StepPoint(
                steps=int(best["steps"]),
                rho=noise_ratio(sigma, int(best["steps"]), epochs, dataset_size),
                loss=float(best["loss"]),
                batch_size=int(b),
                epsilon=float(e),
            )
        )
    return out


def best_lr_per_batch(df, metric: str = "val_loss") -> tuple[list[int], list[float]]:
    """Best LR per batch size for `fit_lr_law`: from the noise-free trials when there are any (the
    LR law of the step curve), else from every ok trial; seed-mean loss per (ε, B, C, lr)."""
    ok = df[(df["status"] == "ok") & df[metric].notna()]
    free = ok[~np.isfinite(ok["epsilon"].astype(float))]
    use = free if not free.empty else ok
    if use.empty or use["lr"].nunique() < 2:
        return [], []
    m = use.groupby(["epsilon", "batch_size", "clip", "lr"])[metric].mean().reset_index()
    best = m.loc[m.groupby("batch_size")[metric].idxmin()]
    return [int(b) for b in best["batch_size"]], [float(x) for x in best["lr"]]
