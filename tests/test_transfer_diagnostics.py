"""Paper 2's fits on synthetic power laws with known α, β, and the warnings a sweep can earn."""

import math

import numpy as np
import pytest

from hptransfer.spec import LOG_SCALE
from hptransfer.transfer.diagnostics import diagnose, fit_drift, fit_log_linear, fit_loss_vs_width
from hptransfer.transfer.engine import optima_by_width
from hptransfer.transfer.synthetic import synthetic_sweep

WIDTHS = [32, 64, 128, 256, 512]


@pytest.mark.parametrize("alpha", [0.3, 0.52, 1.1])
def test_loss_law_recovers_alpha(alpha):
    n = np.array(WIDTHS, float)
    fit = fit_loss_vs_width(n, 3.137 + 13.16 * n ** -alpha)
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
    fit = fit_drift(n, x_inf - 5.0 * n ** -beta)
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
    return diagnose(fits, ["lr"], LOG_SCALE, rule, "mup", max(fits), target,
                    transferred={"lr": fits[max(fits)]["lr"].value})  # what `mup` carries over


def test_fast_transfer_verdict_and_penalty_on_a_synthetic_sweep():
    grid = list(np.geomspace(1e-4, 1e-1, 25))
    fast = _diag(synthetic_sweep(WIDTHS, grid, B=0.0))  # no drift at all
    assert fast["fast_transfer"] is True and fast["predicted_penalty"] == 0
    assert fast["loss_fit"]["alpha"] == pytest.approx(0.5, rel=0.02)
    # Strong drift that decays slowly (β = 0.1 < α/2 = 0.5) is not fast transfer.
    slow = _diag(synthetic_sweep(WIDTHS, grid, B=3.0, beta=0.1, alpha=1.0))
    assert slow["fast_transfer"] is False
    # Penalty at the target = κ·(log lr_used − trend at target)²; check it against the truth's order.
    true_gap = 3.0 * (512 ** -0.1 - 4096 ** -0.1)
    assert 0.08 * true_gap**2 / 3 < slow["predicted_penalty"] < 0.08 * true_gap**2 * 3
    assert any("drifts with width" in w and "power-law" in w for w in slow["warnings"])


def test_warnings_edge_few_widths_nonconvex_divergence():
    grid = list(np.geomspace(1e-4, 1e-2, 9))
    d = _diag(synthetic_sweep([32, 64], grid, nu_inf=5e-2))  # optimum above the grid; 2 widths
    text = " | ".join(d["warnings"])
    assert "grid edge; extend sweep.grid.lr" in text
    assert "only 2 widths" in text and d["fast_transfer"] is None
    df = synthetic_sweep([32, 64, 128], list(np.geomspace(1e-4, 1e-1, 13)), nu_inf=2e-2,
                         diverge_above=lambda n: 1.1e-2)
    text = " | ".join(_diag(df)["warnings"])
    assert "diverged" in text and "stability edge" in text
    bumpy = synthetic_sweep([32, 64, 128], list(np.geomspace(1e-4, 1e-1, 13)))
    bumpy.loc[(bumpy["width"] == 64) & np.isclose(bumpy["lr"], bumpy["lr"].unique()[5]), "val_loss"] += 1.0
    assert "not convex" in " | ".join(_diag(bumpy)["warnings"])
