"""Per-width optimum: a parabola in log ν, seeds pooled, diverged trials as information."""

import math

import numpy as np
import pytest

from hptransfer.transfer.optimum import fit_optimum

GRID = np.geomspace(1e-4, 1e-1, 13)  # half-decade... ratio 10^(1/4) between neighbours


def parabola(v, opt=3e-3, kappa=0.08, floor=2.0):
    return floor + kappa * (np.log(v) - math.log(opt)) ** 2


def test_exact_parabola_recovers_off_grid_optimum():
    f = fit_optimum(GRID, parabola(GRID, opt=2.2e-3))
    assert f.convex and not f.on_edge and not f.capped_by_divergence
    assert f.value == pytest.approx(2.2e-3, rel=1e-6)
    assert f.curvature == pytest.approx(0.08, rel=1e-6)
    assert f.fitted_loss == pytest.approx(2.0, abs=1e-9)
    assert f.log_se is None  # one trial per grid value: nothing to bootstrap


def test_seeds_pooled_and_bootstrap_interval_covers_truth():
    rng = np.random.default_rng(1)
    v = np.repeat(GRID, 4)
    loss = parabola(v, opt=5e-3) + 0.01 * rng.standard_normal(len(v))
    f = fit_optimum(v, loss)
    assert abs(math.log(f.value / 5e-3)) < 0.3
    assert f.log_se is not None and 0 < f.log_se < 0.5
    assert f.ci_low < 5e-3 < f.ci_high


def test_edge_optimum_is_flagged_not_extrapolated():
    f = fit_optimum(GRID, parabola(GRID, opt=1e-5))
    assert f.on_edge and f.value == GRID[0]
    f = fit_optimum(GRID, parabola(GRID, opt=1.0))
    assert f.on_edge and f.value == GRID[-1]


def test_diverged_values_cap_the_optimum_and_are_not_an_edge():
    # True optimum 1e-2, but everything above 6e-3 diverged: the estimate must stay below it.
    loss = parabola(GRID, opt=1e-2)
    div = GRID > 6e-3
    loss[div] = np.nan
    f = fit_optimum(GRID, loss, diverged=div)
    assert f.capped_by_divergence and not f.on_edge
    assert f.value <= GRID[~div].max() + 1e-12
    assert f.n_diverged == div.sum()


def test_a_single_diverged_seed_marks_the_value_unstable():
    v = np.repeat(GRID, 2)
    loss = parabola(v, opt=3e-3)
    div = np.zeros(len(v), bool)
    i = int(np.where(np.isclose(v, GRID[8]))[0][0])  # one of two seeds at a value above the optimum
    div[i], loss[i] = True, np.nan
    f = fit_optimum(v, loss, diverged=div)
    assert f.value < GRID[8]
    assert f.n_diverged == 1


def test_failed_trials_are_noise_not_information():
    loss = parabola(GRID, opt=3e-3)
    loss[8] = np.nan  # a crash, not flagged diverged: ignored
    f = fit_optimum(GRID, loss, diverged=np.zeros(len(GRID), bool))
    assert not f.capped_by_divergence and f.n_diverged == 0
    assert f.value == pytest.approx(3e-3, rel=0.05)


def test_no_finite_loss_is_an_error():
    with pytest.raises(ValueError, match="no trial with a finite loss"):
        fit_optimum(GRID, np.full(len(GRID), np.nan))


def test_linear_scale_hyperparameter():
    v = np.linspace(0.8, 0.99, 9)
    f = fit_optimum(v, 1 + 3 * (v - 0.93) ** 2, log_scale=False)
    assert f.value == pytest.approx(0.93, abs=1e-9)
