"""The axes laws as their papers state them (issue 37): one distribution for every interval an axis
law reports or guards, and a Birge ratio only where there are degrees of freedom to estimate it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from hptransfer.transfer.axes import axis_law
from hptransfer.transfer.fitting import BIRGE_MIN_DOF, fit_log_linear, fit_log_linear_censored, interval_quantile

# log ν* along the horizon, 0.1 given error each, scattered ±0.5 about a slope of −0.3: far more
# than the errors allow (χ²/dof ≫ 1).
STEPS = [100, 200, 400, 800, 1600]
WIGGLE = [0.5, -0.5, 0.5, -0.5, 0.5]


def _x(values):
    return [-4.0 - 0.3 * math.log(v) + w for v, w in zip(values, WIGGLE)]


def test_the_factor_interval_takes_the_exponents_quantile():
    """Five values (3 dof, the scatter sets the scale): the exponent's interval is Student t's
    (3.18 at 3 dof), and the factor at the target is that same interval carried by log(target/base),
    not a normal 1.96 one (which made the ×/÷2 guard see an interval 1.6× too narrow here)."""
    law = axis_law("steps", STEPS, _x(STEPS), [0.1] * 5, [None] * 5, base_value=400, target_value=6400)
    shift = math.log(6400 / 400)
    t = stats.t.ppf(0.975, 3)
    lo, hi = law["exponent_ci"]
    assert (hi - lo) / 2 == pytest.approx(t * law["exponent_se"], rel=1e-9)
    f_lo, f_hi = law["factor_interval"]
    assert math.log(f_lo) / shift == pytest.approx(lo, rel=1e-9) and math.log(f_hi) / shift == pytest.approx(hi, rel=1e-9)
    assert law["bounded"]  # as wide as it is, it is too wide to trust: the guard sees it


def test_a_birge_ratio_needs_degrees_of_freedom():
    """Three values (1 dof): χ²/dof is a χ²₁ draw (90% range ×0.004–×3.8), too unstable to rescale
    errors by, so the given errors hold, with normal quantiles, unless χ² is beyond its 95% quantile
    (3.84): then the scatter wins, with t's quantile. From BIRGE_MIN_DOF dof on, the ratio always.
    Same for the censored fit."""
    three = STEPS[:3]

    def mild(values):  # ±0.08 about the line: χ² = 1.7 at 1 dof, a likely draw under the errors
        return [-4.0 - 0.3 * math.log(v) + 0.16 * w for v, w in zip(values, WIGGLE)]

    f = fit_log_linear(three, mild(three), [0.1] * 3)
    chi2 = float(((np.asarray(mild(three)) - (f.a + f.b * np.log(three))) ** 2).sum() / 0.01)
    assert f.dof == 1 and 1.0 < chi2 < stats.chi2.ppf(0.95, 1)
    assert f.scale == 1.0 and interval_quantile(f) == pytest.approx(stats.norm.ppf(0.975), rel=1e-12)
    X = np.column_stack([np.ones(3), np.log(three)])  # the errors as given: weighted LS, no rescaling
    assert f.b_se == pytest.approx(math.sqrt(np.linalg.inv(X.T @ X / 0.01)[1, 1]), rel=1e-9)
    law = axis_law("steps", three, mild(three), [0.1] * 3, [None] * 3, base_value=200, target_value=800)
    assert law["exponent_ci"][1] - law["exponent_ci"][0] == pytest.approx(2 * stats.norm.ppf(0.975) * f.b_se, rel=1e-9)

    plain = fit_log_linear(three, _x(three), [0.1] * 3)  # ±0.5: χ² = 67, no error bar of 0.1 explains it
    assert plain.scale == pytest.approx(200 / 3, rel=1e-9) and interval_quantile(plain) == pytest.approx(stats.t.ppf(0.975, 1))

    assert BIRGE_MIN_DOF == 3
    five = fit_log_linear(STEPS, _x(STEPS), [0.1] * 5)
    chi2 = float(((np.asarray(_x(STEPS)) - (five.a + five.b * np.log(STEPS))) ** 2).sum() / 0.01)
    assert five.dof == 3 and five.scale == pytest.approx(chi2 / 3, rel=1e-9) and five.scale > 1
    assert interval_quantile(five) == pytest.approx(stats.t.ppf(0.975, 3), rel=1e-12)

    censored = fit_log_linear_censored([*three, 1600], [*mild(three), mild([1600])[0]], [0.1] * 4, [None, None, None, "lower"])
    assert censored.dof == 1 and censored.scale == 1.0
