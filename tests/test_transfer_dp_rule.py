"""The `dp` transfer rule: (B, C, LR) from the spec's privacy budget, the σ√T table as evidence."""

import math

import pytest

from hptransfer.privacy import DPConfig
from hptransfer.dp.plan import dp_plan_for
from hptransfer.spec import load_spec
from hptransfer.transfer.engine import make_plan
from hptransfer.plan import load_plan, save_plan
from hptransfer.transfer.rules import RULES, Evidence, Target
from hptransfer.transfer.synthetic import synthetic_sweep

from conftest import ROOT


def _ev():
    return Evidence(optima={32: {"lr": 3e-3}, 64: {"lr": 3e-3}}, fixed={}, base_width=32, parametrization="mup")


def test_dp_rule_takes_batch_from_cumulative_noise_and_scales_lr():
    cfg = DPConfig(epsilon=1.0, delta=1e-5, dataset_size=5000, epochs=4, batch_sizes=[16, 64, 256, 1024])
    res = RULES["dp"](_ev(), Target(width=64, steps=100, batch_size=16, proxy_steps=100, proxy_batch_size=16, dp=cfg))
    want = dp_plan_for(cfg)
    assert res.extras["dp"]["batch_size"] == want.batch_size
    assert res.extras["dp"]["noise_multiplier"] == pytest.approx(want.noise_multiplier)
    assert res.hyperparameters["lr"] == pytest.approx(3e-3 * math.sqrt(want.batch_size / 16))
    assert any(h["name"] == "dp-lr-sqrt-batch" for h in res.heuristics)
    table = res.extras["dp"]["table"]
    assert {r["batch_size"] for r in table} == {16, 64, 256, 1024}


def test_dp_rule_without_a_budget_says_what_is_missing():
    with pytest.raises(ValueError, match="needs a `dp:` block"):
        RULES["dp"](_ev(), Target(width=64, steps=10, batch_size=16, proxy_steps=10, proxy_batch_size=16))


def test_shipped_dp_spec_gives_a_plan_with_the_noise_table(tmp_path):
    spec = load_spec(ROOT / "search_spaces" / "dp-finetune.yaml")
    df = synthetic_sweep(spec.sweep.widths, spec.sweep.grid["lr"])
    plan = make_plan(spec, df)
    dp = plan.model_dump()["dp"]
    assert dp["batch_size"] in spec.dp.batch_sizes and len(dp["table"]) >= 2
    back = load_plan(save_plan(plan, tmp_path / "plan.yaml"))
    assert back.model_dump()["dp"]["batch_size"] == dp["batch_size"]
