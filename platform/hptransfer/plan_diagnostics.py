"""The plan's `diagnostics` section, typed: the evidence a user reads before trusting a plan.

Made by the transfer engine (transfer/diagnostics.py assembles it from transfer/fitting.py,
verdicts.py, penalty.py and target_check.py; the formulas are in docs/RESEARCH.md) and read by the
CLI, the report, the pipeline and the target check. The names are those plan files have always
carried, so plans written before this section was typed load unchanged (tests/data/old_plans).

Every number is finite or null: null is "not computed" or "not finite" (a degenerate fit), never
NaN, so the YAML stays plain. Per-width maps are keyed by the width as text, as YAML and JSON give
them back. Unknown keys are refused, like everywhere else in the plan: a typo is not evidence.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

__all__ = [
    "Diagnostics",
    "DriftFit",
    "DriftVerdict",
    "HyperparameterTransfer",
    "JointOptimum",
    "LossFit",
    "MixtureWeights",
    "OptimumSummary",
    "OptimumTrend",
]

Interval = tuple[float | None, float | None]  # (low, high); null where open or not finite


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)

    # Fields added for the joint path are left out of the file while empty, so a grid's plan file is
    # byte for byte what it was before them (and an old plan round-trips unchanged).
    _omit_empty: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _drop_empty(self, handler):
        out = handler(self)
        for k in self._omit_empty:
            if isinstance(out, dict) and out.get(k) in (None, {}):
                out.pop(k, None)
        return out


class OptimumSummary(_Section):
    """One width's optimum of one hyperparameter (transfer/optimum.py: `OptimumFit`)."""

    _omit_empty = ("method", "fallback")

    value: float | None = None
    """The estimated optimum ν* (vertex of the parabola in log ν through the best grid point)."""
    best_grid_value: float | None = None
    """The stable grid value with the lowest seed-averaged loss."""
    best_loss: float | None = None
    """Seed-averaged loss at the best grid value."""
    fitted_loss: float | None = None
    """The parabola's value at its vertex (= best_loss when no parabola was fitted)."""
    on_edge: bool = False
    """The best value is the grid's smallest or largest: extend the grid."""
    convex: bool = True
    """A convex parabola was fitted (False: too few points, or a concave curve)."""
    n_points: int = 0
    """Finite-loss trials used."""
    n_diverged: int = 0
    """Trials that diverged at this width (they inform the fit: too high)."""
    capped_by_divergence: bool = False
    """The next grid value up diverged: ν* is capped at the best stable point."""
    curvature: float | None = None
    """κ in loss ≈ κ·(x − x*)² + min, x = log ν (ν when linear): the loss a miss costs."""
    log_se: float | None = None
    """Standard error of x* (parametric bootstrap, floored at `se_floor`)."""
    ci: Interval | None = None
    """2.5% / 97.5% bootstrap quantiles of ν*."""
    censored: Literal["upper", "lower"] | None = None
    """`upper`: ν* ≤ value, `lower`: ν* ≥ value (grid edge, capped by divergence); null: a point estimate."""
    bound: Interval = (None, None)
    """When censored, the interval ν* is known to lie in (null: open)."""
    noise: float | None = None
    """Per-trial loss noise σ used for the uncertainty."""
    noise_source: str = "none"
    """Where σ came from: `given`, `seed replicates`, `parabola residuals` or `none`."""
    n_seeds: int = 1
    """Trials averaged at the best grid value."""
    se_floor: float | None = None
    """The least `log_se` can be: a quarter of a grid step in x."""
    curvature_ci: Interval = (None, None)
    """2.5% / 97.5% bootstrap quantiles of κ."""
    loss_se: float | None = None
    """Standard error of the fitted minimum loss φ*_n."""
    method: Literal["joint"] | None = None
    """`joint`: from the joint local quadratic over scattered points (transfer/joint.py); null: the grid's fit."""
    fallback: str | None = None
    """Why the joint fit used the best point instead of the quadratic's vertex (null: it did not)."""


class JointOptimum(_Section):
    """One width's joint optimum of every tuned hyperparameter from scattered points (transfer/joint.py):
    a full quadratic in the search scale fitted to the best points, a bootstrap over rows for the interval."""

    _omit_empty = ("model", "heldout_rmse", "pooled_widths", "undecided", "drift")

    hyperparameters: list[str] = Field(default_factory=list)
    """The tuned hyperparameters, in the order of `hessian`."""
    value: dict[str, float | None] = Field(default_factory=dict)
    """The joint optimum ν* of each (the best point's values when the fit fell back)."""
    fitted_loss: float | None = None
    """The quadratic's minimum (the best point's loss on a fallback)."""
    best_loss: float | None = None
    """The lowest loss among the points (seeds averaged at a repeated point)."""
    hessian: list[list[float | None]] | None = None
    """∂²loss/∂x_i∂x_j at the optimum, x = log ν (ν for a linear-scale tunable); null: not convex or not fitted."""
    coupling: dict[str, float | None] = Field(default_factory=dict)
    """`a|b` → −H_ab/√(H_aa·H_bb): how the bowl is tilted (0: coordinate slices are unbiased; < 0: a larger b wants a smaller a)."""
    optimum_correlation: dict[str, float | None] = Field(default_factory=dict)
    """`a|b` → correlation of the two optima over the bootstrap."""
    n_points: int = 0
    """Ok trials with a finite loss at this width."""
    n_fit: int = 0
    """Of them, the best ones the quadratic was fitted to."""
    n_diverged: int = 0
    """Diverged trials (they cap the fit: a vertex nearest one is not trusted)."""
    n_boot: int = 0
    """Bootstrap resamples (rows drawn with replacement)."""
    n_boot_convex: int = 0
    """Of them, those whose quadratic was convex (the others gave their best point)."""
    convex: bool = False
    """The vertex of a convex quadratic is the estimate (False: the best point, see `fallback`)."""
    fallback: str | None = None
    """Why the best point was used instead of the vertex."""
    held: dict[str, Literal["low", "high"]] = Field(default_factory=dict)
    """Hyperparameters whose vertex lay outside the points' box: held at that edge (a bound), the others re-minimised."""
    noise: float | None = None
    """Per-trial loss noise σ (seed replicates at repeated points, else the quadratic's residuals)."""
    noise_source: str = "none"
    """Where σ came from: `seed replicates`, `quadratic residuals` or `none`."""
    model: str | None = None
    """The pooled fit's model (transfer/joint_pooled.py), chosen by held-out error; absent: a per-width fit."""
    heldout_rmse: float | None = None
    """Its K-fold held-out RMSE of the loss on the fitted points."""
    pooled_widths: list[int] | None = None
    """The widths fitted together (µP: they share the optimum; the loss level has an offset per width)."""
    undecided: list[str] | None = None
    """Tunables the points do not pin (along a near-flat direction, or an interval over most of the span searched)."""
    drift: dict[str, float | None] | None = None
    """How far the fitted optimum moves per doubling of width, in the search scale, when the chosen model has a drift."""


class HyperparameterTransfer(_Section):
    """How one tuned hyperparameter went from the ladder to the plan."""

    _omit_empty = ("undecided",)

    scale: Literal["log", "linear"] = "log"
    """Its search scale (`Hyperparameters`): the optimum and its interval are fitted in log ν or ν."""
    applied: str | None = None
    """Where training applies it (optimizer, init, readout, schedule, clipping)."""
    method: Literal["joint", "grid"] | None = None
    """How its optimum was estimated."""
    source_width: int | None = None
    """The swept width whose optimum was carried over."""
    source_value: float | None = None
    """Its optimum there."""
    value: float | None = None
    """The plan's value."""
    factor: float | None = None
    """value / source_value: what the rule and the heuristics changed (1: carried as is)."""
    ci: Interval | None = None
    """95% interval of the optimum at the source width."""
    log_se: float | None = None
    """Its standard error in the search scale."""
    censored: Literal["upper", "lower"] | None = None
    """The optimum at the source width is a bound (`upper`: ν* ≤ value; `lower`: ν* ≥ value)."""
    how: str | None = None
    """The rule that carried it to the target, in words."""
    undecided: bool | None = None
    """True: the sweep's points do not pin it; the value is where the good points lie, not an estimate."""


class LossFit(_Section):
    """Paper 2's loss law φ*_n = φ_∞ + A·n^−α over the ladder's best losses (transfer/fitting.py)."""

    phi_inf: float | None = None
    """φ_∞: the loss an infinitely wide model would reach at this horizon."""
    A: float | None = None
    """Amplitude of the width term (> 0: loss falls with width)."""
    alpha: float | None = None
    """Exponent α, profiled over [0.02, 4]."""
    rmse: float | None = None
    """Root-mean-square residual of the fit."""
    n_widths: int = 0
    """Widths fitted."""
    exact: bool = False
    """Three widths: the three-parameter law interpolates them."""
    at_bound: bool = False
    """α sits at an end of the profiled range: not identified."""


class DriftFit(_Section):
    """Paper 2's drift law log ν*(n) = x_∞ + K·n^−β with B = |K| (transfer/fitting.py: fit_drift)."""

    drift: Literal["none", "unknown", "fitted"] = "unknown"
    """`none`: the optima agree (within 5%, or within their errors); `fitted`: the law was fitted."""
    B: float | None = None
    """|K|: the size of the drift."""
    beta: float | None = None
    """β: how fast the optimum settles with width."""
    x_inf: float | None = None
    """x_∞ = log ν*(∞) (ν*(∞) for a linear-scale hyperparameter)."""
    value_at_infinity: float | None = None
    """ν*(∞)."""
    rmse: float | None = None
    """Root-mean-square residual of the fit."""
    exact: bool | None = None
    """Three widths: the law interpolates them."""
    at_bound: bool | None = None
    """β sits at an end of the profiled range: not identified."""
    why: str | None = None
    """Why there is no fitted law."""


class DriftVerdict(_Section):
    """Does the optimum move with width? (transfer/verdicts.py: drift_verdict)"""

    verdict: Literal["none", "drift", "undecided"] = "undecided"
    """`none`: the slope's interval lies inside ±tolerance; `drift`: it excludes 0; else undecided."""
    slope: float | None = None
    """Slope of x* = log ν* against log width (weighted log-linear fit, censored optima as bounds)."""
    slope_se: float | None = None
    """Its standard error."""
    slope_ci: Interval | None = None
    """Its 95% interval, the statistic the verdict is read from."""
    tolerance: float | None = None
    """A slope inside ±tolerance is no drift worth a law."""
    n_widths: int = 0
    """Widths with an uncensored optimum."""
    n_bounds: int | None = None
    """Widths whose optimum entered the slope as a bound (censored likelihood; null in older plans)."""
    reason: str | None = None
    """The verdict in words."""


class OptimumTrend(_Section):
    """A tuned hyperparameter's log-linear trend over the widths, censored optima as bounds."""

    slope: float | None = None
    """d log ν*/d log n (dν*/d log n when linear-scale); 0 means width-invariant."""
    slope_se: float | None = None
    """Its standard error (null with fewer than 3 widths)."""
    log_scale: bool = True
    """The hyperparameter is fitted on a log scale."""
    widths: list[int] = Field(default_factory=list)
    """The widths fitted."""
    bounds: list[int] = Field(default_factory=list)
    """Of them, the widths whose optimum entered as a bound (grid edge or capped by divergence)."""


class MixtureWeights(_Section):
    """BIC weights of the two models averaged when the drift verdict abstains (no_drift_weight)."""

    no_drift: float
    """Weight of "the optimum does not move"."""
    trend: float
    """Weight of "it moves log-linearly"."""


class Diagnostics(_Section):
    """Everything a user needs to judge a plan: fits per width, the verdicts, the predicted penalty,
    the predicted target loss, notes and warnings."""

    _omit_empty = ("joint_by_width", "per_hyperparameter")

    tuned: list[str] = Field(default_factory=list)
    """The tuned hyperparameters (the sweep's grid)."""
    source_width: int | None = None
    """The swept width whose optimum the rule carried over."""
    optimum_by_width: dict[str, dict[str, OptimumSummary]] = Field(default_factory=dict)
    """Width → tuned hyperparameter → its optimum."""
    trials_by_width: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Width → trial status (ok, diverged, failed, stopped) → count."""
    primary: str | None = None
    """The hyperparameter the verdicts and the penalty are about (lr when tuned)."""
    widths: list[int] = Field(default_factory=list)
    """Widths with a finite ok loss."""
    usable_widths: list[int] = Field(default_factory=list)
    """Widths whose primary optimum is a point, not a bound: the ones trends are fitted on."""
    censored_widths: dict[str, dict[str, Literal["upper", "lower"]]] = Field(default_factory=dict)
    """Hyperparameter → width → how its optimum is censored."""
    noise_by_width: dict[str, float | None] = Field(default_factory=dict)
    """Width → per-trial loss noise σ of the primary fit."""
    loss_fit: LossFit | None = None
    """The loss law over the ladder (null: fewer than 3 widths, or loss does not fall with width)."""
    optimum_trend: dict[str, OptimumTrend] = Field(default_factory=dict)
    """Hyperparameter → its trend with width."""
    drift_fit: DriftFit | None = None
    """The drift law of the primary optimum (null: fewer than 2 usable widths)."""
    drift_verdict: DriftVerdict = Field(default_factory=DriftVerdict)
    """Does the primary optimum move with width."""
    fast_transfer: bool | Literal["undecided"] | None = None
    """Paper 2's test β > α/2 (a small-width search beats a direct one); null: not judged."""
    fast_transfer_reason: str | None = None
    """The fast-transfer verdict in words."""
    fast_transfer_interval: Interval | None = None
    """95% bootstrap interval of β − α/2, when the optimum drifts."""
    fast_transfer_undecided: str | None = None
    """Why the fast-transfer test abstained."""
    fast_transfer_test: str | None = None
    """The fitted β against α/2, in words."""
    curvature: float | None = None
    """κ at the widest usable convex width: the loss a miss of the optimum costs."""
    predicted_penalty_asymptotic: float | None = None
    """Paper 2's c_n ≈ κ·b_n² at the source width."""
    predicted_hp_gap: float | None = None
    """b_n: the source width's distance to ν*(∞) in log units."""
    predicted_penalty: float | None = None
    """Expected loss increase of the plan's value against the target's estimated optimum, κ·(bias² + se²)."""
    predicted_penalty_interval: Interval | None = None
    """95% predictive interval of the realized increase."""
    predicted_penalty_basis: str | None = None
    """How the target's optimum was estimated."""
    predicted_penalty_bias: float | None = None
    """The plan's value minus the estimate (log units for a log-scale hyperparameter)."""
    predicted_penalty_se: float | None = None
    """Standard error of the estimate."""
    predicted_penalty_weights: MixtureWeights | None = None
    """Model-averaging weights when the drift verdict abstains."""
    trend_value_at_target: float | None = None
    """The log-linear trend's value of the primary hyperparameter at the target width."""
    loss_gap_at_source: float | None = None
    """A·n^−α at the source width: its distance to φ_∞."""
    predicted_target_loss: float | None = None
    """The loss law's value at the target width."""
    predicted_target_loss_interval: Interval | None = None
    """Its 95% interval (the large run is checked against it: transfer/target_check.py)."""
    ladder_best_loss: float | None = None
    """The best loss anywhere on the ladder (the target should not be worse)."""
    joint_by_width: dict[str, JointOptimum] = Field(default_factory=dict)
    """Width → the joint optimum of every tuned hyperparameter, when the table's points are not a grid (else empty)."""
    per_hyperparameter: dict[str, HyperparameterTransfer] = Field(default_factory=dict)
    """Tuned hyperparameter → how it was transferred (filled with the joint fit; empty on a grid)."""
    notes: list[str] = Field(default_factory=list)
    """What the rule did, in words."""
    warnings: list[str] = Field(default_factory=list)
    """What to check or fix before trusting the plan, each saying what to do next."""

    @classmethod
    def measured(cls, values: dict[str, Any]) -> Diagnostics:
        """From freshly computed values: numpy scalars to Python, non-finite numbers to null (a
        degenerate fit has no interval, it is not an error). A loaded plan is validated as it is."""
        return cls.model_validate(_plain(values))


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "dtype") and hasattr(obj, "item"):  # a numpy scalar (numpy is not imported here)
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj
