"""Per-width optimum: a parabola in log ν, seeds pooled, diverged trials as information, an
uncertainty for every optimum (parametric resampling, floored), censored optima as bounds."""

import math

import numpy as np
import pytest

from hptransfer.transfer.optimum import SE_FLOOR_STEPS, fit_optimum
from hptransfer.transfer.synthetic import synthetic_trials

GRID = np.geomspace(1e-4, 1e-1, 13)  # half-decade... ratio 10^(1/4) between neighbours


def parabola(v, opt=3e-3, kappa=0.08, floor=2.0):
    return floor + kappa * (np.log(v) - math.log(opt)) ** 2


def test_exact_parabola_recovers_off_grid_optimum():
    f = fit_optimum(GRID, parabola(GRID, opt=2.2e-3))
    assert f.convex and not f.on_edge and not f.capped_by_divergence
    assert f.value == pytest.approx(2.2e-3, rel=1e-6)
    assert f.curvature == pytest.approx(0.08, rel=1e-6)
    assert f.fitted_loss == pytest.approx(2.0, abs=1e-9)
    # One seed, no noise given, an exact parabola: the residual noise estimate is 0, so the
    # uncertainty is the floor — a quarter of the grid step in log space, never zero.
    step = math.log(GRID[1] / GRID[0])
    assert f.noise_source == "parabola residuals" and f.noise == pytest.approx(0, abs=1e-9)
    assert f.se_floor == pytest.approx(SE_FLOOR_STEPS * step) and f.log_se == pytest.approx(f.se_floor)
    assert f.censored is None and f.bound_low is None and f.bound_high is None
    assert f.ci_low < 2.2e-3 < f.ci_high


def test_seeds_pooled_and_bootstrap_interval_covers_truth():
    rng = np.random.default_rng(1)
    v = np.repeat(GRID, 4)
    loss = parabola(v, opt=5e-3) + 0.01 * rng.standard_normal(len(v))
    f = fit_optimum(v, loss)
    assert abs(math.log(f.value / 5e-3)) < 0.3
    assert f.log_se is not None and 0 < f.log_se < 0.5
    assert f.ci_low < 5e-3 < f.ci_high


def test_edge_optimum_is_flagged_not_extrapolated_and_censored():
    f = fit_optimum(GRID, parabola(GRID, opt=1e-5))
    assert f.on_edge and f.value == GRID[0]
    assert f.censored == "upper" and f.bound_high == GRID[0] and f.bound_low is None and f.ci_low == 0.0
    f = fit_optimum(GRID, parabola(GRID, opt=1.0))
    assert f.on_edge and f.value == GRID[-1]
    assert f.censored == "lower" and f.bound_low == GRID[-1] and f.bound_high is None and f.ci_high == math.inf


def test_diverged_values_cap_the_optimum_and_are_not_an_edge():
    # True optimum 1e-2, but everything above 6e-3 diverged: the estimate must stay below it.
    loss = parabola(GRID, opt=1e-2)
    div = GRID > 6e-3
    loss[div] = np.nan
    f = fit_optimum(GRID, loss, diverged=div)
    assert f.capped_by_divergence and not f.on_edge
    assert f.value <= GRID[~div].max() + 1e-12
    assert f.n_diverged == div.sum()
    # A bound, not a point: ν* lies between the best stable value and the first diverged one.
    assert f.censored == "lower" and f.bound_low == f.value and f.bound_high == GRID[div].min()
    assert f.ci_high == GRID[div].min()


def test_capped_optimum_never_gets_a_near_zero_error():
    """Regression: three identical seeds capped by divergence once gave a bootstrap SE of ~1e-15,
    which the trend fit turned into a weight of 1e30. The error is at least the spread of a
    uniform distribution over the gap to the diverged value."""
    v = np.repeat(GRID, 3)
    loss = parabola(v, opt=1e-2)
    div = v > 6e-3
    loss[div] = np.nan
    f = fit_optimum(v, loss, diverged=div)
    gap = math.log(v[div].min() / f.value)
    assert f.censored == "lower" and f.noise < 1e-12 and f.noise_source == "seed replicates"
    assert f.log_se >= gap / math.sqrt(12) > 0.1


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


def test_noise_estimated_from_seed_replicates_pooled_over_grid_values():
    v, loss, div = synthetic_trials(128, GRID, noise=0.05, n_seeds=4, rng=np.random.default_rng(3))
    f = fit_optimum(v, loss, diverged=div)
    assert f.noise_source == "seed replicates" and f.n_seeds == 4
    assert f.noise == pytest.approx(0.05, rel=0.25)  # 13 values × 3 dof = 39 dof
    g = fit_optimum(v, loss, diverged=div, noise=0.5)  # a measured noise wins over the estimate
    assert g.noise_source == "given" and g.noise == 0.5 and g.log_se > f.log_se


def test_one_seed_with_measured_noise_gets_a_calibrated_error():
    """Parametric resampling σ/√n per grid point: over many draws of one-seed sweeps the 95%
    interval covers the true optimum about 95% of the time and log_se matches the true spread."""
    rng = np.random.default_rng(11)
    grid = np.geomspace(3e-4, 3e-2, 14)  # ×√2 steps
    errs, ses, cover = [], [], 0
    for d in range(150):
        v, loss, div = synthetic_trials(128, grid, nu_inf=3e-3, noise=0.02, n_seeds=1, rng=rng)
        f = fit_optimum(v, loss, diverged=div, noise=0.02, n_boot=100, seed=d)
        errs.append(math.log(f.value / 3e-3))
        ses.append(f.log_se)
        cover += f.ci_low <= 3e-3 <= f.ci_high
    assert 0.88 <= cover / 150 <= 1.0
    assert np.std(errs) / 1.5 < np.mean(ses) < np.std(errs) * 1.5


def test_more_noise_means_a_wider_optimum_and_a_curvature_interval():
    v, loss, div = synthetic_trials(128, GRID, noise=0.01, n_seeds=3, rng=np.random.default_rng(5))
    quiet = fit_optimum(v, loss, diverged=div, noise=0.01)
    noisy = fit_optimum(v, loss, diverged=div, noise=0.1)
    assert noisy.log_se > 1.5 * quiet.log_se and noisy.log_se > noisy.se_floor
    assert quiet.curvature_low < 0.08 < quiet.curvature_high
    assert quiet.loss_se >= 0.01 / math.sqrt(3)  # at least the best point's own noise


def test_negative_noise_is_an_error():
    with pytest.raises(ValueError, match="noise must be a finite loss std"):
        fit_optimum(GRID, parabola(GRID), noise=-1.0)
