"""Transfer across training length, batch size and depth (issue 23; transfer/axes.py): per-axis laws
of the optimum LR, composed with the width rule; the prior and its warning when the ladder cannot
tell; the τ weight-decay rule; the critical batch from the gradient noise scale; the spec's axes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hptransfer.cli import app
from hptransfer.errors import ResultsError, SpecError
from hptransfer.plan import load_plan
from hptransfer.spec import parse_spec, spec_hash, sweep_hash
from hptransfer.sweep.noise_scale import gradient_noise_scale
from hptransfer.transfer.axes import PRIORS, tau_weight_decay
from hptransfer.transfer.engine import make_plan, standalone_spec
from hptransfer.transfer.synthetic import synthetic_axes_sweep

from conftest import tiny_spec_dict

BASE = {"steps": 100, "batch_size": 16, "depth": 2}
STEP = 2**0.5  # the LR grid's ratio
GRID = list(3e-3 * STEP ** np.arange(-8, 9))
LAW = {"steps": -0.5, "batch_size": 0.5}  # the truth: lr* ∝ steps^-1/2 · batch^1/2, flat in depth and width


def _table(arms, noise=0.003, seed=0):
    return synthetic_axes_sweep(
        [32, 64, 128, 256], GRID, base=BASE, arms=arms, exponents=LAW, noise=noise, seeds=(0, 1, 2), rng_seed=seed
    )


def _truth(steps, batch):
    return 3e-3 * (steps / BASE["steps"]) ** LAW["steps"] * (batch / BASE["batch_size"]) ** LAW["batch_size"]


def test_hpt_transfer_recovers_known_laws_far_beyond_the_ladder(tmp_path):
    """Steps 50–400 and batch 8–64 swept at width 32; the target trains 8× longer than the longest
    arm (3200 steps), on a batch 16× the largest (1024), 8× deeper (16 blocks): the plan's LR is
    the truth within half a grid step, from a CSV through the CLI."""
    path = tmp_path / "results.csv"
    _table({"steps": [50, 200, 400], "batch_size": [8, 32, 64], "depth": [4, 8]}).to_csv(path, index=False)
    out = tmp_path / "plan.yaml"
    r = CliRunner().invoke(
        app,
        [
            "transfer", "--results", str(path), "--rule", "mup", "--target-width", "2048", "--family", "mlp",
            "--target-steps", "3200", "--target-batch-size", "1024", "--target-depth", "16", "--out", str(out),
        ],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "steps law" in r.output and "batch_size law" in r.output
    plan = load_plan(out)
    assert abs(math.log(plan.hyperparameters["lr"] / _truth(3200, 1024))) < 0.5 * math.log(STEP)
    laws = plan.axes["laws"]
    assert {a: laws[a]["verdict"] for a in laws} == {"steps": "fitted", "batch_size": "fitted", "depth": "fitted"}
    for a, b in (("steps", -0.5), ("batch_size", 0.5), ("depth", 0.0)):
        lo, hi = laws[a]["exponent_ci"]
        assert lo < b < hi and hi - lo < 0.4
    assert plan.axes["base"] == BASE and plan.model.depth == 16
    # The rule's batch heuristic is not applied on top of the fitted batch law.
    assert "adam-batch-lr" not in [h["name"] for h in plan.heuristics]
    for a in ("steps", "batch_size", "depth"):
        assert set(laws[a]["baselines"]) == {"deepseek", "step_law"}


def test_one_horizon_and_a_longer_target_warns_and_applies_the_prior():
    df = _table({"batch_size": [8, 32, 64]})
    spec = standalone_spec(df, rule="mup", target_width=2048, target_steps=800, model={"family": "mlp"})
    plan = make_plan(spec, df)
    law = plan.axes["laws"]["steps"]
    assert law["verdict"] == "cannot tell" and law["exponent"] == PRIORS["steps"].exponent
    assert "2401.02954" in law["prior_source"]
    warn = [w for w in plan.diagnostics.warnings if "only one steps was swept" in w]
    assert warn and "not transferred across horizon" in warn[0]
    width_lr = plan.axes["width_rule_lr"]
    assert plan.hyperparameters["lr"] == pytest.approx(width_lr * 8 ** PRIORS["steps"].exponent)
    assert "steps-prior-lr" in [h["name"] for h in plan.heuristics]
    # A target at the ladder's own horizon: nothing to say about steps.
    same = make_plan(standalone_spec(df, rule="mup", target_width=2048, model={"family": "mlp"}), df)
    assert "steps" not in same.axes["laws"] and not any("only one steps" in w for w in same.diagnostics.warnings)


def test_two_horizons_are_undecided():
    df = _table({"steps": [400]})
    plan = make_plan(standalone_spec(df, rule="mup", target_width=2048, target_steps=3200, model={"family": "mlp"}), df)
    law = plan.axes["laws"]["steps"]
    assert law["verdict"] == "undecided" and "no residual freedom" in law["reason"]
    assert any("horizon (steps) law undecided" in w for w in plan.diagnostics.warnings)


def test_a_table_without_axis_columns_gives_the_plan_it_gave_before():
    df = _table({}).drop(columns=["steps", "batch_size", "depth"])
    plan = make_plan(standalone_spec(df, rule="mup", target_width=2048, model={"family": "mlp"}), df)
    assert plan.axes is None and plan.heuristics == []


def test_tau_rule_holds_lr_times_weight_decay_times_steps():
    df = _table({"steps": [50, 200, 400]}).assign(weight_decay=0.1)
    spec = standalone_spec(df, rule="mup", target_width=2048, target_steps=1600, model={"family": "mlp"})
    spec = spec.model_copy(update={"transfer": spec.transfer.model_copy(update={"weight_decay": "tau"})})
    plan = make_plan(spec, df)
    hp = plan.hyperparameters
    assert hp["lr"] * hp["weight_decay"] * 1600 == pytest.approx(plan.axes["width_rule_lr"] * 0.1 * 100)
    assert "tau-weight-decay" in [h["name"] for h in plan.heuristics]
    assert tau_weight_decay(0.1, 1e-3, 100, 5e-4, 400) == pytest.approx(0.05)


def test_target_batch_beyond_the_critical_batch_is_warned():
    df = _table({"batch_size": [8, 32, 64]}).assign(noise_scale=48.0)
    kw = {"rule": "mup", "target_width": 2048, "model": {"family": "mlp"}}
    far = make_plan(standalone_spec(df, target_batch_size=256, **kw), df)
    assert far.axes["critical_batch"]["b_simple"] == pytest.approx(48.0)
    assert any("beyond the critical batch" in w for w in far.diagnostics.warnings)
    near = make_plan(standalone_spec(df, target_batch_size=32, **kw), df)
    assert not any("critical batch" in w for w in near.diagnostics.warnings)


def test_gradient_noise_scale_matches_per_example_gradients():
    """Linear least squares at w = 0: per-example gradients g_i = −2·y_i·x_i are known exactly, so
    B_simple = tr(Σ)/|G|² is computed from 20k of them and compared with the two-batch estimator."""
    torch.manual_seed(0)
    d = 8
    w_true = torch.randn(d)
    x = torch.randn(20_000, d) + 0.5
    y = x @ w_true + 2.0 * torch.randn(20_000)
    g = -2 * y[:, None] * x
    truth = float(g.var(dim=0, unbiased=True).sum() / (g.mean(0) @ g.mean(0)))
    model = torch.nn.Linear(d, 1, bias=False)
    torch.nn.init.zeros_(model.weight)

    def loss_fn(m, xb, yb):
        return ((m(xb).squeeze(-1) - yb) ** 2).mean()

    batches = [(x[i : i + 64], y[i : i + 64]) for i in range(0, 20_000 - 64, 64)]
    est = gradient_noise_scale(model, batches, loss_fn)
    assert est == pytest.approx(truth, rel=0.15)
    assert all(p.grad is None for p in model.parameters())
    assert math.isnan(gradient_noise_scale(model, [(x[:1], y[:1])], loss_fn))


# --- the spec's axes ------------------------------------------------------------------------------


AXES_OK = {"width": 16, "steps": [6, 24], "batch_size": [4, 16]}


def test_spec_axes_count_their_trials_and_keep_old_hashes():
    plain = parse_spec(tiny_spec_dict())
    d = tiny_spec_dict()
    d["sweep"]["axes"] = AXES_OK
    spec = parse_spec(d)
    assert spec.sweep.n_arms == 2 + 4 and spec.sweep.n_trials == 6 * 3 and spec.axes_width == 16
    assert sweep_hash(spec) != sweep_hash(plain)
    # Fields added by this issue at their defaults leave an existing study's hashes as they were.
    explicit = parse_spec(tiny_spec_dict(target={"depth": None}, transfer={"weight_decay": "rule"}))
    assert (sweep_hash(explicit), spec_hash(explicit)) == (sweep_hash(plain), spec_hash(plain))
    # The ladder's own value listed again is not an extra arm.
    d["sweep"]["axes"] = {"steps": [12, 24]}
    assert parse_spec(d).sweep.axes_values("steps") == [24]


@pytest.mark.parametrize(
    "axes, where, words",
    [
        ({}, "sweep.axes", "sweeps nothing"),
        ({"steps": [0, 10]}, "sweep.axes.steps", "outside 1.."),
        ({"batch_size": [8, 8]}, "sweep.axes.batch_size", "repeat"),
        ({"steps": [24], "width": 48}, "", "sweep.axes.width=48 is not one of sweep.widths"),
        ({"steps": [24], "noise_scale_batches": -1}, "sweep.axes.noise_scale_batches", "greater than or equal"),
        ({"steps": [24], "depht": [2]}, "sweep.axes.depht", "unknown key"),
    ],
)
def test_spec_axes_are_validated(axes, where, words):
    d = tiny_spec_dict()
    d["sweep"]["axes"] = axes
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    assert any(p == where and words in m for p, m, _ in e.value.problems), e.value.problems


def test_target_depth_and_weight_decay_rule_are_validated():
    with pytest.raises(SpecError) as e:
        parse_spec(tiny_spec_dict(target={"depth": 0}, transfer={"weight_decay": "lambda"}))
    where = {p for p, _, _ in e.value.problems}
    assert {"target.depth", "transfer.weight_decay"} <= where


def test_a_results_table_with_bad_axis_values_is_refused():
    df = _table({"steps": [50]})
    df.loc[0, "steps"] = -5
    with pytest.raises(ResultsError, match="column `steps` must hold positive integers"):
        make_plan(standalone_spec(df, rule="mup", target_width=2048, model={"family": "mlp"}), df)


def test_axis_rows_stay_out_of_the_width_fits():
    """The arms at width 32 (other horizons) must not enter width 32's optimum."""
    df = _table({"steps": [50, 200, 400]}, noise=0.0)
    plan = make_plan(standalone_spec(df, rule="mup", target_width=2048, model={"family": "mlp"}), df)
    assert plan.diagnostics.optimum_by_width["32"]["lr"].value == pytest.approx(3e-3, rel=1e-6)
    assert plan.diagnostics.trials_by_width["32"]["ok"] == len(GRID) * 3


def test_an_axis_law_wider_than_its_prior_uses_the_prior_and_says_so():
    """Issue 37 item 4: steps 50/100/200 with the 200-step optimum on a noisy dip: the exponent's 95%
    interval is wider than the prior's range [-0.5, 0], so the fit says less than the prior: the prior's
    factor is used, the fit kept on record, and a warning says so. A tight fit stays the fit."""
    from hptransfer.transfer.axes import axis_law, axis_warnings

    x = [math.log(0.036), math.log(0.046), math.log(0.244)]
    law = axis_law("steps", [50, 100, 200], x, [0.35, 0.35, 0.35], [None] * 3, 100, 400)
    lo, hi = law["exponent_ci"]
    p_lo, p_hi = PRIORS["steps"].range
    assert hi - lo > p_hi - p_lo and law["wider_than_prior"] and law["basis"] == "prior"
    assert law["factor"] == pytest.approx(4 ** PRIORS["steps"].exponent) and law["factor_fitted"] > 4
    assert law["exponent_fitted"] == pytest.approx(math.log(0.244 / 0.036) / math.log(4), rel=0.3)
    assert any("wider than the prior's range" in w for w in axis_warnings(law))
    tight = axis_law(
        "steps", [50, 100, 200], [math.log(0.05 * (v / 100) ** -0.5) for v in (50, 100, 200)], [0.05] * 3, [None] * 3, 100, 400
    )
    assert tight["basis"] == "fit" and "wider_than_prior" not in tight and tight["factor"] == pytest.approx(0.5)


def test_an_axis_law_too_uncertain_far_from_its_values_is_bounded_toward_the_prior():
    """A fit narrower than the prior's range can still be too uncertain 64× beyond its base: its factor's
    interval spans more than ×/÷2, so the value in it nearest the prior's factor is used."""
    from hptransfer.transfer.axes import axis_law

    b = -0.3
    x = [math.log(0.05 * (v / 100) ** b) + w for v, w in zip((50, 100, 200), (0.02, -0.04, 0.02))]
    law = axis_law("steps", [50, 100, 200], x, [0.1] * 3, [None] * 3, 100, 6400)
    lo, hi = law["exponent_ci"]
    assert hi - lo < 0.5 and law["basis"] == "fit" and law["bounded"]
    f_lo, f_hi = law["factor_interval"]
    assert f_hi / f_lo > 4 and law["factor"] == pytest.approx(min(max(64 ** PRIORS["steps"].exponent, f_lo), f_hi))


def test_hpt_run_until_names_the_stages_it_can_stop_after(tmp_path):
    """`hpt run --until transfer` stops after the plan (tests/test_axes_run.py runs it end to end);
    anything else is refused before any work, naming the flag and the choices."""
    import pathlib

    from hptransfer.pipeline import run_study

    spec = pathlib.Path(__file__).parents[1] / "search_spaces" / "quickstart.yaml"
    r = CliRunner().invoke(app, ["run", str(spec), "--study-dir", str(tmp_path / "s"), "--until", "plan"])
    assert r.exit_code == 2 and "--until 'plan'" in r.output and "use --until transfer" in r.output, r.output
    assert not (tmp_path / "s").exists()
    with pytest.raises(ValueError, match="until='sweep'"):
        run_study(None, until="sweep")
