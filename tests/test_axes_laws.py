"""The axes laws as their papers state them (issue 37): one distribution for every interval an axis
law reports or guards, and a Birge ratio only where there are degrees of freedom to estimate it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from hptransfer.errors import SpecError
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
    assert law["wider_than_prior"] and law["basis"] == "prior"  # as wide as it is, it says less than the prior


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


# --- one width: transfer along horizon and batch at the target's own width (issue 37, item 5) -----

GRID = [2.0 ** (-k / 2) for k in range(6, 30)]  # ×√2 apart: half a grid step is 2^0.25


@pytest.mark.parametrize(
    ("axis", "arm", "base", "target", "exponent"),
    [
        ("steps", [25, 50, 100, 200], 100, 800, -0.5),  # 8× longer: ν* ∝ steps^−½
        ("batch_size", [8, 16, 32, 64], 32, 256, 0.5),  # 8× the batch: ν* ∝ √B
    ],
)
def test_a_table_at_the_targets_width_transfers_along_one_axis(axis, arm, base, target, exponent):
    """Bjorck et al.'s setting: the target's size itself tuned on shorter runs (or smaller batches),
    3 seeds, 0.3% loss noise, no width ladder. The law along the axis is fitted and carried 8× past
    the swept values; the optimum there is recovered within half a grid step."""
    from hptransfer.transfer.engine import make_plan, standalone_spec
    from hptransfer.transfer.synthetic import synthetic_axes_sweep

    bases = {"steps": 100, "batch_size": 32, "depth": 2}
    assert bases[axis] == base
    df = synthetic_axes_sweep(
        [256], GRID, base=bases, arms={axis: arm}, exponents={axis: exponent}, nu0=2**-8, noise=0.0066, seeds=(0, 1, 2)
    )
    kw = {"target_steps": target} if axis == "steps" else {"target_batch_size": target}
    plan = make_plan(standalone_spec(df, rule="mup", target_width=256, model={"family": "mlp"}, **kw), df)
    truth = 2**-8 * (target / base) ** exponent
    assert abs(math.log2(plan.hyperparameters["lr"] / truth)) < 0.25, (plan.hyperparameters["lr"], truth)
    law = plan.axes["laws"][axis]
    assert law["verdict"] == "fitted" and law["values"] == arm
    assert law["exponent_ci"][0] < exponent < law["exponent_ci"][1]


def test_one_width_is_refused_only_when_the_target_is_wider():
    from hptransfer.errors import ResultsError
    from hptransfer.spec import parse_spec
    from hptransfer.transfer.engine import standalone_spec
    from hptransfer.transfer.synthetic import synthetic_axes_sweep

    from conftest import tiny_spec_dict

    bases = {"steps": 100, "batch_size": 32, "depth": 2}
    df = synthetic_axes_sweep([256], GRID, base=bases, arms={"steps": [50, 100, 200]}, exponents={"steps": -0.5})
    with pytest.raises(ResultsError, match=r"only one width \(\[256\]\).*set the target's width to 256"):
        standalone_spec(df, rule="mup", target_width=1024, model={"family": "mlp"})
    # A study spec: one swept width is the target's own, or refused naming both fields.
    one = tiny_spec_dict(sweep={"widths": [64], "axes": {"width": 64, "steps": [6, 24]}}, target={"width": 64})
    assert parse_spec(one).sweep.widths == [64]
    with pytest.raises(SpecError) as e:
        parse_spec(tiny_spec_dict(sweep={"widths": [32]}, target={"width": 64}))
    assert "sweep.widths" in str(e.value) and "need at least 2 widths" in str(e.value) and "equal to target.width" in str(e.value)


# --- priors as partials at the arm's held quantity (issue 37, item 2) -------------------------------


@pytest.mark.parametrize(
    ("steps", "batch", "want_exponent_of_8"),
    [
        (96, 256, 0.5 - 0.125),  # batch ×8 at fixed steps: √B at fixed samples plus 8× the tokens
        (768, 32, -0.125),  # steps ×8 at fixed batch: the horizon prior alone
        (12, 256, 0.5),  # batch ×8, steps ÷8: the same samples, so Malladi's √B itself
    ],
    ids=["batch-at-fixed-steps", "steps-at-fixed-batch", "batch-at-fixed-samples"],
)
def test_unswept_axes_move_the_lr_by_partials_that_compose_to_sqrt_b_at_fixed_samples(steps, batch, want_exponent_of_8):
    """A width ladder with no arms, the target at another (steps, batch): the LR moves by the priors.
    Written here from their sources, not read from hptransfer: Malladi's √B holds at fixed *samples*
    (∂log η/∂log B|_D = ½), the horizon exponent at fixed batch is the assumed −0.125, so at fixed
    steps ∂log η/∂log B|_T = ½ − 0.125 (D = T·B). Composed, a target with 8× the batch and ⅛ the
    steps (the same samples) gets exactly √8. Before, the batch prior was ½ at fixed steps: ×8^0.625
    there, and ×8^0.5 where 8^0.375 is due."""
    from hptransfer.transfer.engine import make_plan, standalone_spec
    from hptransfer.transfer.synthetic import synthetic_axes_sweep

    bases = {"steps": 96, "batch_size": 32, "depth": 2}
    df = synthetic_axes_sweep([64, 128, 256], GRID, base=bases, arms={}, exponents={}, nu0=2**-8, noise=0.0066, seeds=(0, 1))
    spec = {"rule": "mup", "target_width": 256, "model": {"family": "mlp"}}
    at_base = make_plan(standalone_spec(df, **spec), df).hyperparameters["lr"]
    plan = make_plan(standalone_spec(df, **spec, target_steps=steps, target_batch_size=batch), df)
    assert plan.hyperparameters["lr"] / at_base == pytest.approx(8**want_exponent_of_8, rel=1e-9)
    laws = plan.axes["laws"]
    moved = [a for a in ("steps", "batch_size") if a in laws]
    assert all(laws[a]["verdict"] == "cannot tell" and laws[a]["basis"] == "prior" for a in moved)
    if "batch_size" in laws:
        assert laws["batch_size"]["prior_held"] == "N, steps"
        record = {h["name"]: h for h in plan.heuristics}["adam-batch-lr"]  # the record says what was applied
        assert record["factor"] == pytest.approx(laws["batch_size"]["factor"], rel=1e-12)
