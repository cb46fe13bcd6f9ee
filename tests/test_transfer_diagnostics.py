"""Paper 2's fits on synthetic power laws with known α, β, verdicts that abstain, the predicted
penalty, and the warnings a sweep can earn. Rates over many noisy draws: test_calibration.py."""

import math

import numpy as np
import pytest

from hptransfer.hyperparameters import LOG_SCALE
from hptransfer.transfer.diagnostics import diagnose
from hptransfer.transfer.engine import optima_by_width
from hptransfer.transfer.fitting import fit_drift, fit_log_linear, fit_loss_vs_width
from hptransfer.transfer.optimum import fit_optimum
from hptransfer.transfer.penalty import no_drift_weight, predicted_penalty
from hptransfer.transfer.synthetic import synthetic_sweep, synthetic_trials
from hptransfer.transfer.verdicts import drift_verdict

WIDTHS = [32, 64, 128, 256, 512]


@pytest.mark.parametrize("alpha", [0.3, 0.52, 1.1])
def test_loss_law_recovers_alpha(alpha):
    n = np.array(WIDTHS, float)
    fit = fit_loss_vs_width(n, 3.137 + 13.16 * n**-alpha)
    assert fit["alpha"] == pytest.approx(alpha, rel=1e-3)
    assert fit["phi_inf"] == pytest.approx(3.137, abs=1e-3)
    assert fit["A"] == pytest.approx(13.16, rel=1e-2)


def test_loss_law_needs_three_widths_and_improvement():
    assert fit_loss_vs_width([32, 64], [3.0, 2.9]) is None
    assert fit_loss_vs_width([32, 64, 128], [2.0, 2.1, 2.2]) is None  # worse with width: no law


@pytest.mark.parametrize("beta", [0.25, 0.5, 1.0])
def test_drift_law_recovers_beta(beta):
    n = np.array(WIDTHS, float)
    x_inf = math.log(3e-3)
    fit = fit_drift(n, x_inf - 5.0 * n**-beta)
    assert fit["drift"] == "fitted"
    assert fit["beta"] == pytest.approx(beta, rel=1e-3)
    assert fit["B"] == pytest.approx(5.0, rel=1e-2)
    assert fit["value_at_infinity"] == pytest.approx(3e-3, rel=1e-2)


def test_no_drift_is_reported_as_such():
    assert fit_drift(WIDTHS, [math.log(3e-3)] * len(WIDTHS))["drift"] == "none"
    assert fit_drift([32, 64], [-5.0, -5.3])["drift"] == "unknown"  # 3 parameters need 3 widths


def test_log_linear_slope_and_error():
    n = np.array(WIDTHS, float)
    f = fit_log_linear(n, 1.0 - 0.7 * np.log(n))
    assert f.b == pytest.approx(-0.7) and f.b_se == pytest.approx(0, abs=1e-9)
    assert f.predict(4096) == pytest.approx(1.0 - 0.7 * math.log(4096))


def _diag(df, rule="mup", target=4096):
    fits = optima_by_width(df, ["lr"])
    return diagnose(
        fits, ["lr"], LOG_SCALE, rule, "mup", max(fits), target, transferred={"lr": fits[max(fits)]["lr"].value}
    )  # what `mup` carries over


def test_log_linear_errors_as_given_unless_the_points_scatter_more():
    n = np.array(WIDTHS, float)
    sxx = float(((np.log(n) - np.log(n).mean()) ** 2).sum())
    f = fit_log_linear(n, 1.0 - 0.7 * np.log(n), se=[0.1] * 5)  # exact line: the given errors hold
    assert f.scale == 1.0 and f.b_se == pytest.approx(0.1 / math.sqrt(sxx))
    wobble = 1.0 - 0.7 * np.log(n) + np.array([0.5, -0.5, 0.5, -0.5, 0.5])  # far beyond se = 0.1
    g = fit_log_linear(n, wobble, se=[0.1] * 5)
    assert g.scale > 1 and g.b_se == pytest.approx(0.1 / math.sqrt(sxx) * math.sqrt(g.scale))


def test_drift_verdict_abstains_without_four_widths_or_a_clear_interval():
    n = np.array(WIDTHS, float)
    strong = -1.0 * np.log(n)
    three = drift_verdict(WIDTHS[:3], strong[:3], [0.01] * 3)
    assert three["verdict"] == "undecided" and "needs 4" in three["reason"]
    assert drift_verdict(WIDTHS, strong, [0.1] * 5)["verdict"] == "drift"
    flat = drift_verdict(WIDTHS, [math.log(3e-3)] * 5, [0.05] * 5)
    assert flat["verdict"] == "none" and -0.1 < flat["slope_ci"][0] < 0 < flat["slope_ci"][1] < 0.1
    assert drift_verdict(WIDTHS, [math.log(3e-3)] * 5, [0.5] * 5)["verdict"] == "undecided"  # too noisy to tell


def _diag(df, rule="mup", target=4096):
    fits = optima_by_width(df, ["lr"])
    return diagnose(
        fits, ["lr"], LOG_SCALE, rule, "mup", max(fits), target, transferred={"lr": fits[max(fits)]["lr"].value}
    )  # what `mup` carries over


GRID25 = list(np.geomspace(1e-4, 1e-1, 25))


def test_no_drift_is_fast_and_its_penalty_prices_only_the_uncertainty():
    d = _diag(synthetic_sweep(WIDTHS, GRID25, B=0.0))
    assert d.drift_verdict.verdict == "none" and d.fast_transfer is True
    assert d.loss_fit.alpha == pytest.approx(0.5, rel=0.02)
    # The rule lands on the pooled estimate (bias 0), yet the penalty is κ·se², not 0.
    assert d.predicted_penalty_bias == pytest.approx(0, abs=1e-9)
    assert d.predicted_penalty == pytest.approx(d.curvature * d.predicted_penalty_se**2)
    lo, hi = d.predicted_penalty_interval
    assert 0 <= lo < d.predicted_penalty < hi
    assert d.warnings == []


def test_fast_and_slow_drift_are_told_apart_when_the_evidence_allows():
    # ν* ∝ 1/n forever (β → 0 < α/2): detected drift, not fast, and the mup rule is warned off.
    slow = _diag(synthetic_sweep(WIDTHS, GRID25, power=-1.0))
    assert slow.drift_verdict.verdict == "drift" and slow.fast_transfer is False
    assert slow.fast_transfer_interval[1] < 0
    assert any("drifts with width" in w and "power-law" in w for w in slow.warnings)
    # A drift that dies out as 1/n (β = 1 > α/2 = 0.25): visible on the ladder, but fast.
    fast = _diag(synthetic_sweep(WIDTHS, GRID25, B=30.0, beta=1.0))
    assert fast.drift_verdict.verdict == "drift" and fast.fast_transfer is True
    assert fast.fast_transfer_interval[0] > 0
    assert not any("drifts with width" in w for w in fast.warnings)
    # A slow decay (β = 0.1 < α/2 = 0.5) that 5 widths cannot pin down: never called fast.
    slow_decay = _diag(synthetic_sweep(WIDTHS, GRID25, B=3.0, beta=0.1, alpha=1.0))
    assert slow_decay.drift_verdict.verdict == "drift" and slow_decay.fast_transfer in (False, "undecided")
    # Penalty at the target ≈ κ·(true gap)² (the trend extrapolates the optimum; the rule does not).
    true_gap = 3.0 * (512**-0.1 - 4096**-0.1)
    assert 0.08 * true_gap**2 / 3 < slow_decay.predicted_penalty < 0.08 * true_gap**2 * 3


def test_capped_optima_are_bounds_not_evidence_of_drift():
    """Regression (issue 12): when the LR above the optimum diverges at every width, the capped optima
    had a bootstrap SE of ~1e-15, the trend fit weighted them 1e30 and any slope > 0.05 read as
    drift (β = 4). Here the stability edge moves a little with width; the optimum does not."""
    df = synthetic_sweep(
        WIDTHS, GRID25, nu_inf=3e-2, noise=0.003, seeds=(0, 1, 2), diverge_above=lambda n: 1.1e-2 * (n / 32) ** -0.15, rng_seed=4
    )
    d = _diag(df)
    assert set(d.censored_widths["lr"].values()) == {"lower"} and d.usable_widths == []
    assert d.drift_verdict.verdict == "undecided" and d.fast_transfer == "undecided"
    assert not any("drifts with width" in w and "power-law" in w for w in d.warnings)
    assert d.predicted_penalty > 0  # the widest width's own (censored) uncertainty, not zero


def test_three_widths_never_decide():
    d = _diag(synthetic_sweep(WIDTHS[:3], GRID25, power=-1.0))  # a blatant drift, but 3 widths
    assert d.drift_verdict.verdict == "undecided" and d.fast_transfer == "undecided"
    assert "interpolates" in d.fast_transfer_reason


def test_predicted_penalty_is_kappa_times_bias_squared_plus_variance():
    v, loss, div = synthetic_trials(128, GRID25, noise=0.0, rng=np.random.default_rng(0))
    fit = fit_optimum(v, loss, diverged=div)
    k, se = fit.curvature, fit.log_se
    at = predicted_penalty(fit, fit.value)  # the rule lands on the estimate: still κ·se²
    assert at.mean == pytest.approx(k * se**2) and at.bias == pytest.approx(0, abs=1e-12)
    off = predicted_penalty(fit, fit.value * math.exp(0.5), estimate_se=0.2)
    assert off.mean == pytest.approx(k * (0.25 + 0.04)) and off.bias == pytest.approx(0.5)
    assert off.lo < k * 0.25 < off.mean < off.hi
    # The interval is a 95% predictive interval of κ·(x_rule − x*)² for x* ~ N(x̂, se²).
    xs = math.log(fit.value) + 0.2 * np.random.default_rng(1).standard_normal(20_000)
    realized = k * (math.log(fit.value) + 0.5 - xs) ** 2
    assert realized.mean() == pytest.approx(off.mean, rel=0.03)
    assert np.mean((off.lo <= realized) & (realized <= off.hi)) == pytest.approx(0.95, abs=0.01)
    assert predicted_penalty(fit_optimum(GRID25, np.full(25, 2.0)), 1e-3) is None  # flat: no curvature


def test_a_mixture_penalty_is_the_penalty_of_the_averaged_models():
    """Model averaging (drift undecided): x* drawn from w·N(m0, s0²) + (1 − w)·N(m1, s1²)."""
    v, loss, div = synthetic_trials(128, GRID25, noise=0.0, rng=np.random.default_rng(0))
    fit = fit_optimum(v, loss, diverged=div)
    k, x_rule = fit.curvature, math.log(fit.value)
    comps = [(0.7, x_rule - 0.1, 0.15), (0.3, x_rule + 0.8, 0.6)]
    p = predicted_penalty(fit, fit.value, mixture=comps)
    assert p.mean == pytest.approx(k * sum(w * ((x_rule - m) ** 2 + s**2) for w, m, s in comps))
    rng = np.random.default_rng(2)
    pick = rng.random(40_000) < 0.7
    xs = np.where(pick, x_rule - 0.1 + 0.15 * rng.standard_normal(40_000), x_rule + 0.8 + 0.6 * rng.standard_normal(40_000))
    realized = k * (x_rule - xs) ** 2
    assert realized.mean() == pytest.approx(p.mean, rel=0.03)
    assert np.mean((p.lo <= realized) & (realized <= p.hi)) == pytest.approx(0.95, abs=0.01)
    assert np.mean(realized < p.lo) == pytest.approx(0.025, abs=0.006)
    # One component is the single-normal penalty, closed form and all.
    one = predicted_penalty(fit, fit.value, mixture=[(1.0, x_rule - 0.5, 0.2)])
    assert one == pytest.approx(predicted_penalty(fit, fit.value, estimate=fit.value * math.exp(-0.5), estimate_se=0.2))


def test_no_drift_weight_follows_the_evidence_for_a_slope():
    n = np.array(WIDTHS, float)
    flat = no_drift_weight(WIDTHS, np.array([0.02, -0.03, 0.01, -0.01, 0.0]), np.full(5, 0.1))
    assert 0.6 < flat < 0.8  # BIC: at zero slope the constant model is favoured by √5 to 1, no more
    steep = no_drift_weight(WIDTHS, -1.0 * np.log(n), np.full(5, 0.1))
    assert steep < 1e-6
    # Scatter beyond the errors (Birge ratio > 1) is noise for both models, not evidence for a slope.
    rng = np.random.default_rng(0)
    noisy = 0.05 * np.log(n) + 0.5 * rng.standard_normal(5)
    assert no_drift_weight(WIDTHS, noisy, np.full(5, 0.05)) > 0.2


def test_warnings_edge_few_widths_nonconvex_divergence():
    grid = list(np.geomspace(1e-4, 1e-2, 9))
    d = _diag(synthetic_sweep([32, 64], grid, nu_inf=5e-2))  # optimum above the grid; 2 widths
    text = " | ".join(d.warnings)
    assert "grid edge; extend sweep.grid.lr" in text
    assert "only 2 widths" in text and d.fast_transfer == "undecided"
    df = synthetic_sweep([32, 64, 128], list(np.geomspace(1e-4, 1e-1, 13)), nu_inf=2e-2, diverge_above=lambda n: 1.1e-2)
    text = " | ".join(_diag(df).warnings)
    assert "diverged" in text and "stability edge" in text
    bumpy = synthetic_sweep([32, 64, 128], list(np.geomspace(1e-4, 1e-1, 13)))
    bumpy.loc[(bumpy["width"] == 64) & np.isclose(bumpy["lr"], bumpy["lr"].unique()[5]), "val_loss"] += 1.0
    assert "not convex" in " | ".join(_diag(bumpy).warnings)


def test_wider_is_better_is_checked_after_the_large_run():
    from hptransfer.plan_diagnostics import Diagnostics
    from hptransfer.transfer.target_check import check_target

    d = Diagnostics(predicted_target_loss_interval=(2.40, 2.50), ladder_best_loss=2.60)
    assert check_target(d, 2.45)["verdict"] == "ok"
    assert check_target(d, 2.55)["verdict"] == "worse than predicted"
    worse = check_target(d, 2.70)
    assert worse["verdict"] == "worse than predicted" and any("WORSE than the ladder" in m for m in worse["messages"])
    assert check_target(Diagnostics(ladder_best_loss=2.6), 2.7)["verdict"] == "worse than the ladder"
    assert check_target(d, float("nan"))["verdict"] == "unchecked"


def test_the_plan_predicts_the_target_loss_with_an_interval():
    import numpy as np

    from hptransfer.transfer.diagnostics import diagnose
    from hptransfer.transfer.optimum import fit_optimum

    grid = np.geomspace(1e-3, 1e-1, 9)
    fits = {}
    for w in (32, 64, 128, 256):
        best = 2.0 + 8.0 * w**-0.5
        loss = best + 0.08 * (np.log(grid) - np.log(1e-2)) ** 2
        fits[w] = {"lr": fit_optimum(np.repeat(grid, 2), np.repeat(loss, 2) + np.tile([0.01, -0.01], 9), True)}
    d = diagnose(fits, ["lr"], {"lr"}, "mup", "mup", 256, 1024)
    lo, hi = d.predicted_target_loss_interval
    assert lo < 2.0 + 8.0 * 1024**-0.5 < hi and hi - lo < 0.2
    assert d.ladder_best_loss == pytest.approx(min(f["lr"].best_loss for f in fits.values()), abs=0.05)
