"""The formula as a prior (issue 36 item 3, transfer/formula_prior.py): the ladder's LR and Step
Law's, precision-weighted in log η — moved toward the formula when the ladder's interval is wide, and
not when it is narrow — checked against a numerical posterior and through make_plan."""

import math

import numpy as np
import pytest

from hptransfer.transfer.engine import make_plan
from hptransfer.transfer.formula_prior import axis_log_sd, combine, ladder_log_sd
from hptransfer.transfer.results import standalone_spec
from hptransfer.transfer.synthetic import synthetic_sweep


@pytest.mark.parametrize("ladder_sd", [0.05, 0.3, 0.7, 3.0])
def test_combine_is_the_posterior_mean_of_log_lr(ladder_sd):
    """Prior N(log η_F, σ_F²) × likelihood N(log η_L, σ_L²), integrated on a grid: the closed form's
    mean and σ within 1e-3 (log units)."""
    lad, form, sf = 0.01, 0.04, 0.693
    x = np.linspace(math.log(1e-5), math.log(10.0), 200001)
    log_post = -((x - math.log(lad)) ** 2) / (2 * ladder_sd**2) - (x - math.log(form)) ** 2 / (2 * sf**2)
    p = np.exp(log_post - log_post.max())
    mean = float((x * p).sum() / p.sum())
    sd = float(math.sqrt(((x - mean) ** 2 * p).sum() / p.sum()))
    got = combine(lad, ladder_sd, form, sf)
    assert math.log(got["lr"]) == pytest.approx(mean, abs=1e-3)
    assert got["log_sd"] == pytest.approx(sd, abs=1e-3)
    assert got["factor"] == pytest.approx(got["lr"] / lad, rel=1e-12)


def test_a_wide_ladder_defers_to_the_formula_and_a_narrow_one_does_not():
    gap = math.log(0.04 / 0.01)
    wide = combine(0.01, 3.0, 0.04, 0.693)
    narrow = combine(0.01, 0.05, 0.04, 0.693)
    assert math.log(0.04 / wide["lr"]) < 0.06 * gap  # within 6% of the gap from the formula
    assert math.log(narrow["lr"] / 0.01) < 0.01 * gap  # moved less than 1% of the gap
    with pytest.raises(ValueError, match="positive"):
        combine(0.01, 0.1, -1.0, 0.693)


def test_axis_errors_from_a_fitted_interval_and_from_a_prior_range():
    fit = {"basis": "fit", "factor_interval": [0.5, 2.0], "base": 100, "target": 800}
    assert axis_log_sd(fit) == pytest.approx(math.log(4.0) / 2 / 1.96)
    prior = {"basis": "prior", "prior_range": [-0.5, 0.0], "exponent": -0.125, "base": 100, "target": 800}
    assert axis_log_sd(prior) == pytest.approx(0.5 * math.log(8.0) / math.sqrt(12))
    sd, parts = ladder_log_sd(0.3, 0.1, {"steps": fit})  # the width transfer's RMS error wins over log_se
    assert parts["width"] == 0.3 and sd == pytest.approx(math.hypot(0.3, axis_log_sd(fit)))
    assert ladder_log_sd(None, None, {})[0] is None


def _plan(target_steps=None, formula_prior="default"):
    """A clean llama ladder (3 widths, 3 seeds, noise 0.002) whose optimum (2e-2) is far from Step Law's."""
    grid = [2.0**k for k in range(-12, -3)]
    df = synthetic_sweep([32, 64, 128], grid, nu_inf=2e-2, noise=0.002, seeds=(0, 1, 2), rng_seed=3)
    spec = standalone_spec(
        df, rule="mup", target_width=1024, target_steps=target_steps, model={"family": "llama", "head_dim": 16}
    )
    if formula_prior != "default":
        spec = spec.model_copy(update={"transfer": spec.transfer.model_copy(update={"formula_prior": formula_prior})})
    return make_plan(spec, df)


def test_make_plan_combines_by_the_ladders_own_error():
    """The ladder's error is narrow at its own horizon and wide for a target 1000× longer (the horizon
    law is then the prior, its exponent range spread over log 1000): the first plan stays near the
    ladder's value, the second moves most of the way to Step Law's; `formula_prior: null` is the
    ladder alone."""
    near, far = _plan(), _plan(target_steps=100_000)
    alone = _plan(target_steps=100_000, formula_prior=None)
    for p in (near, far):
        fp = p.baselines["formula_prior"]
        assert fp["formula"] == "step_law" and fp["formula_log_sd"] == pytest.approx(0.693)
        assert p.hyperparameters["lr"] == pytest.approx(fp["lr"], rel=1e-9)
        assert fp["lr"] == pytest.approx(fp["ladder_lr"] * fp["factor"], rel=1e-9)
        assert any(h["name"] == "formula-prior-lr" for h in p.heuristics)
        assert any("as a prior" in n for n in p.diagnostics.notes)
    nf, ff = near.baselines["formula_prior"], far.baselines["formula_prior"]
    assert set(nf["ladder_log_sd_parts"]) == {"width"} and "axis steps" in ff["ladder_log_sd_parts"]
    assert nf["ladder_log_sd"] < 0.4 < 1.0 < ff["ladder_log_sd"], (nf["ladder_log_sd"], ff["ladder_log_sd"])
    assert nf["weight_ladder"] > 0.75 and ff["weight_ladder"] < 0.35
    # the moves as a share of the log gap between the ladder's and the formula's (hidden matrices') LR
    for fp, lo, hi in ((nf, 0.0, 0.25), (ff, 0.65, 1.0)):
        gap = math.log(fp["formula_lr"] / fp["ladder_hidden_lr"])
        assert abs(gap) > 0.5, gap  # far apart: a move is visible
        assert lo <= math.log(fp["factor"]) / gap <= hi, (fp["factor"], gap)
    assert "formula_prior" not in alone.baselines
    assert alone.hyperparameters["lr"] == pytest.approx(ff["ladder_lr"], rel=1e-9)


def test_mlp_plans_are_not_combined():
    grid = [2.0**k for k in range(-12, -3)]
    df = synthetic_sweep([32, 64, 128], grid, nu_inf=3e-3, noise=0.01, rng_seed=3)
    plan = make_plan(standalone_spec(df, rule="mup", target_width=1024, model={"family": "mlp"}), df)
    assert "formula_prior" not in plan.baselines


def test_spec_field_keeps_old_hashes_and_names_a_bad_value():
    import json

    from hptransfer.errors import SpecError
    from hptransfer.spec import parse_spec
    from hptransfer.spec.study import _unset_later_fields, spec_hash

    from conftest import tiny_spec_dict

    spec = parse_spec(tiny_spec_dict())
    assert spec.transfer.formula_prior.formula == "step_law"
    # at its default the field is left out of the hash: a study made before it keeps its spec_hash
    assert "formula_prior" not in json.loads(spec.model_dump_json(exclude=_unset_later_fields(spec)))["transfer"]
    off = parse_spec(tiny_spec_dict(transfer={"formula_prior": None}))
    assert off.transfer.formula_prior is None and spec_hash(off) != spec_hash(spec)
    with pytest.raises(SpecError) as e:
        parse_spec(tiny_spec_dict(transfer={"formula_prior": {"log_sd": 0, "formula": "chinchilla"}}))
    text = str(e.value)
    assert "transfer.formula_prior.log_sd" in text and "transfer.formula_prior.formula" in text, text


def test_the_report_shows_plan_ladder_and_formulas_side_by_side():
    from hptransfer.report.html import _lr_sources

    plan = _plan(target_steps=100_000)
    fp, html = plan.baselines["formula_prior"], _lr_sources(plan)
    assert "LR: plan, ladder and formulas" in html
    for value in (fp["hidden_lr"], fp["ladder_hidden_lr"], plan.baselines["step_law"]["lr"], plan.baselines["deepseek"]["lr"]):
        assert f"{value:.4g}" in html, (value, html)
    assert f"{fp['ladder_log_sd']:.2g}" in html and "weight" in html


def test_hpt_transfer_standalone_prints_the_combination_and_can_turn_it_off(tmp_path):
    from typer.testing import CliRunner

    from hptransfer.cli import app
    from hptransfer.plan import load_plan

    grid = [2.0**k for k in range(-12, -3)]
    path = tmp_path / "results.csv"
    synthetic_sweep([32, 64, 128], grid, nu_inf=2e-2, noise=0.002, seeds=(0, 1, 2), rng_seed=3).to_csv(path, index=False)
    base = ["transfer", "--results", str(path), "--rule", "mup", "--target-width", "1024", "--head-dim", "16"]
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "on.yaml")])
    assert r.exit_code == 0, r.output
    assert "ladder · formula → plan" in r.output and "as a prior" in r.output
    on = load_plan(tmp_path / "on.yaml")
    assert on.baselines["formula_prior"]["formula"] == "step_law"
    r = CliRunner().invoke(app, [*base, "--formula-prior", "none", "--out", str(tmp_path / "off.yaml")])
    assert r.exit_code == 0, r.output
    off = load_plan(tmp_path / "off.yaml")
    assert "formula_prior" not in off.baselines
    assert off.hyperparameters["lr"] == pytest.approx(on.baselines["formula_prior"]["ladder_lr"], rel=1e-9)
    r = CliRunner().invoke(app, [*base, "--formula-prior", "chinchilla"])
    assert r.exit_code == 2 and "transfer.formula_prior.formula" in r.output, r.output
