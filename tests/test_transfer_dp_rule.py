"""The `dp` transfer rule: (B, C, LR) from the spec's privacy budget, the σ√T table as evidence."""

import math

import pytest

from hptransfer.plan import load_plan, save_plan
from hptransfer.privacy import DPConfig
from hptransfer.spec import load_spec
from hptransfer.transfer.engine import make_plan
from hptransfer.transfer.rules import RULES, Evidence, Target
from hptransfer.transfer.synthetic import synthetic_sweep

from conftest import ROOT


def _ev():
    return Evidence(optima={32: {"lr": 3e-3}, 64: {"lr": 3e-3}}, fixed={}, base_width=32, parametrization="mup")


def test_dp_rule_takes_batch_from_cumulative_noise_and_scales_lr():
    cfg = DPConfig(epsilon=1.0, delta=1e-5, dataset_size=5000, epochs=4, batch_sizes=[16, 64, 256, 1024])
    res = RULES["dp"](_ev(), Target(width=64, steps=100, batch_size=16, proxy_steps=100, proxy_batch_size=16, dp=cfg))
    # Worked out beside the code, from Opacus' PRV accountant itself (get_noise_multiplier with
    # ε=1, δ=1e-5, sample_rate=B/5000, steps=T=⌈4·5000/B⌉; docs/RESEARCH.md, paper 1):
    #   B       16      64      256     1024
    #   T       1250    313     79      20
    #   σ       0.8276  1.1816  2.0312  3.8086
    #   σ√T     29.26   20.91   18.05   17.03
    # The smallest B within 5% of min σ√T = 17.03 (≤ 17.88): only B = 1024, with T = 20 ≥ min_steps.
    assert res.extras["dp"]["batch_size"] == 1024 and res.extras["dp"]["steps"] == 20
    assert res.extras["dp"]["noise_multiplier"] == pytest.approx(3.8086, rel=0.01)
    assert res.hyperparameters["lr"] == pytest.approx(3e-3 * math.sqrt(1024 / 16))  # = 0.024, Adam's √ rule
    assert any(h["name"] == "dp-lr-sqrt-batch" for h in res.heuristics)
    # The target's batch and steps are the DP choice, not the Target's 16 / 100.
    assert (res.target_batch_size, res.target_steps) == (1024, 20)
    assert res.extras["dp"]["lr_source"] == "sweep" and res.extras["dp"]["lr"] == res.hyperparameters["lr"]
    table = res.extras["dp"]["table"]
    assert {r["batch_size"] for r in table} == {16, 64, 256, 1024}


def test_dp_rule_without_a_budget_says_what_is_missing():
    with pytest.raises(ValueError, match="needs a `dp:` block"):
        RULES["dp"](_ev(), Target(width=64, steps=10, batch_size=16, proxy_steps=10, proxy_batch_size=16))


def test_shipped_dp_spec_gives_a_plan_with_the_noise_table(tmp_path):
    spec = load_spec(ROOT / "tests" / "data" / "dp_from_scratch.yaml")
    df = synthetic_sweep(spec.sweep.widths, spec.sweep.grid["lr"])
    plan = make_plan(spec, df)
    dp = plan.model_dump()["dp"]
    assert dp["batch_size"] in spec.dp.batch_sizes and len(dp["table"]) >= 2
    back = load_plan(save_plan(plan, tmp_path / "plan.yaml"))
    assert back.model_dump()["dp"]["batch_size"] == dp["batch_size"]
    # The plan is the DP plan: its target is (B, T) and its one LR is dp.lr moved to B by the √ rule.
    assert (plan.target.batch_size, plan.target.steps) == (dp["batch_size"], dp["steps"])
    assert (plan.target.batch_size, plan.target.steps) != (spec.target_batch_size, spec.target_steps)
    lr = spec.dp.lr * math.sqrt(dp["batch_size"] / spec.dp.lr_reference_batch)
    assert plan.hyperparameters["lr"] == pytest.approx(lr) and dp["lr"] == pytest.approx(lr)
    assert dp["lr_source"] == "dp.lr" and dp["lr_from"] == {"lr": spec.dp.lr, "batch_size": spec.dp.lr_reference_batch}
    assert any("lr from dp.lr" in n for n in plan.diagnostics.notes)


def _lm_spec(**dp):
    from hptransfer.spec import parse_spec

    from conftest import tiny_spec_dict

    return parse_spec(
        tiny_spec_dict(
            name="dp-lm",
            model={"family": "mlp", "depth": 1, "seq_len": 16},
            transfer={"rule": "dp"},
            target={"width": 32, "steps": 7, "batch_size": 8},
            dp={
                "epsilon": 2.0,
                "delta": 1e-4,
                "dataset_size": 2048,
                "epochs": 2,
                "batch_sizes": [64, 256],
                "min_steps": 8,
                "accountant": "rdp",
                **dp,
            },
        )
    )


def _sweep():
    return synthetic_sweep([16, 32], [0.003, 0.03, 0.3], nu_inf=0.03)


def test_without_dp_lr_the_sweep_optimum_moves_to_b_and_the_plan_says_so():
    spec = _lm_spec()
    plan = make_plan(spec, _sweep())
    dp = plan.dp
    assert (plan.target.batch_size, plan.target.steps) == (dp["batch_size"], dp["steps"])
    sweep_lr = plan.diagnostics.optimum_by_width["32"]["lr"].value
    want = sweep_lr * math.sqrt(dp["batch_size"] / spec.sweep.batch_size)
    assert plan.hyperparameters["lr"] == pytest.approx(want) and dp["lr"] == pytest.approx(want)
    assert dp["lr_source"] == "sweep" and dp["lr_from"]["batch_size"] == spec.sweep.batch_size
    assert any("lr from sweep" in n and "set dp.lr" in n for n in plan.diagnostics.notes)
    # Baselines are about the run that will happen: the DP (B, T).
    assert plan.baselines and plan.schedule["base"]["warmup_steps"] == pytest.approx(round(2 * dp["steps"] / 12))


def test_dp_lr_wins_over_the_sweep_optimum():
    plan = make_plan(_lm_spec(lr=1e-3, lr_reference_batch=16), _sweep())
    b = plan.dp["batch_size"]
    assert plan.hyperparameters["lr"] == pytest.approx(1e-3 * math.sqrt(b / 16))
    assert plan.dp["lr_source"] == "dp.lr"


def test_null_dataset_size_is_the_number_of_private_sequences():
    from hptransfer.dp.lm import sequence_count

    spec = _lm_spec(dataset_size=None, delta=1e-6, batch_sizes=[1024, 4096])
    n = sequence_count(spec.data, spec.model.seq_len)
    plan = make_plan(spec, _sweep())
    assert plan.dp["config"]["dataset_size"] == n
    assert plan.dp["sample_rate"] == pytest.approx(plan.target.batch_size / n)


@pytest.mark.parametrize(
    "dp, where, text",
    [
        ({"dataset_size": None, "delta": 0.01, "batch_sizes": [1024]}, "dp.delta", "must be < 1/dataset_size"),
        (
            {"dataset_size": None, "delta": 1e-6, "epochs": 0.01, "batch_sizes": [1024], "min_steps": 50},
            "",
            "min_steps=50 exceeds",
        ),
        ({"epsilon": 1e-7, "batch_sizes": [2048], "min_steps": 1}, "", "no noise multiplier"),
    ],
)
def test_bad_budgets_are_dp_errors_naming_the_fix(dp, where, text):
    from hptransfer.errors import DPError

    with pytest.raises(DPError) as e:
        make_plan(_lm_spec(**dp), _sweep())
    assert any(p.where == where and text in str(p) for p in e.value.problems), e.value
