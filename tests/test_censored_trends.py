"""Censored optima as bounds in the width trends (issue 23, item 3; fitting.fit_log_linear_censored).

An optimum on the grid's edge says "ν* ≤ the low edge" (or "≥ the high edge"). Dropping it from the
trend fits lost the widest widths exactly when the optimum drifts off the grid: both cases below
fail when censored optima are left out (the code before this change: drift detected in 4 of the 10
draws; power-law at 2^-11.8 where the truth is 2^-13).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hptransfer.transfer.diagnostics import diagnose
from hptransfer.transfer.engine import make_plan, standalone_spec
from hptransfer.transfer.fitting import fit_log_linear, fit_log_linear_censored
from hptransfer.transfer.optimum import fit_optimum
from hptransfer.transfer.synthetic import synthetic_sweep, synthetic_trials

W5 = (32, 64, 128, 256, 512)


def test_without_bounds_the_censored_fit_is_the_plain_fit():
    x = [0.1, -0.6, -1.4, -2.0]
    plain, cens = fit_log_linear(W5[:4], x, [0.1] * 4), fit_log_linear_censored(W5[:4], x, [0.1] * 4, [None] * 4)
    assert (cens.a, cens.b, cens.b_se) == (plain.a, plain.b, plain.b_se)


def test_a_satisfied_bound_moves_nothing_and_a_crossed_one_pulls():
    x = [-math.log(w) for w in W5]
    plain = fit_log_linear(W5[:4], x[:4], [0.1] * 4)
    # ν*(512) ≤ something far above the line: no information beyond the four points.
    far = fit_log_linear_censored(W5, [*x[:4], x[4] + 3.0], [0.1] * 5, [None] * 4 + ["upper"])
    assert far.b == pytest.approx(plain.b, abs=1e-9) and far.n_censored == 1
    # ν*(512) ≥ a value above the line: the slope flattens toward the bound.
    crossed = fit_log_linear_censored(W5, [*x[:4], x[4] + 0.5], [0.1] * 5, [None] * 4 + ["lower"])
    assert crossed.b > plain.b + 0.05
    with pytest.raises(ValueError, match="2 uncensored"):
        fit_log_linear_censored(W5[:3], x[:3], [0.1] * 3, ["upper", None, "upper"])


def test_a_one_over_width_drift_off_the_grid_edge_is_detected():
    """ν* ∝ 1/n with the grid's low edge at ν*(256): width 512's optimum leaves the grid (always a
    bound), 256's often. 10 draws, σ = 0.02, 3 seeds (tests/test_calibration.py's noise)."""
    grid = 7.5e-4 * 2 ** (0.5 * np.arange(14))
    rng, detected, bounds = np.random.default_rng(11), 0, 0
    for d in range(10):
        fits = {}
        for n in W5:
            v, loss, div = synthetic_trials(n, grid, nu_inf=3e-3, power=-1.0, n0=64, noise=0.02, n_seeds=3, rng=rng)
            fits[n] = {"lr": fit_optimum(v, loss, diverged=div, seed=d)}
        out = diagnose(fits, ["lr"], {"lr"}, "mup", "mup", 512, 4096, {"lr": fits[512]["lr"].value}, seed=d)
        detected += out.drift_verdict.verdict == "drift"
        bounds += out.drift_verdict.n_bounds
        assert out.drift_verdict.verdict != "none"
    assert bounds >= 10  # the case this is about: 512 is censored in every draw
    assert detected >= 7


def test_power_law_reaches_the_truth_past_a_censored_widest_width():
    """A clean halving per doubling, ν*(n) = 2^-6·32/n on a ×2 grid 2^-10 … 2^-4: ν*(512) = 2^-10
    sits on the low edge (a bound). The truth at 8× the widest width is 2^-13."""
    grid = [2.0**k for k in range(-10, -3)]
    df = synthetic_sweep(W5, grid, nu_inf=2**-6, power=-1.0, n0=32, seeds=(0, 1, 2))
    plan = make_plan(standalone_spec(df, rule="power-law", target_width=4096, model={"family": "mlp"}), df)
    assert plan.diagnostics.censored_widths["lr"] == {"512": "upper"}
    assert abs(math.log2(plan.hyperparameters["lr"]) + 13) < 0.5  # within half a grid step
    assert any("censored widths [512] as bounds" in n for n in plan.diagnostics.notes)
