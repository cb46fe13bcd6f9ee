"""The DP rule: σ√T table against paper 1's reference figures, the batch/clip/LR rules, config
errors, and `hpt dp-plan` (real Opacus accountants throughout)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from hptransfer.dp import rule
from hptransfer.dp.accounting import NoiseRow, epsilon_spent, noise_multiplier, steps_for
from hptransfer.dp.plan import DPPlanError, dp_plan_for
from hptransfer.privacy import DPConfig

ROOT = Path(__file__).resolve().parents[1]

# docs/RESEARCH.md, paper 1: σ√T for N=50,000, E=8, δ=1e-5, RDP, epsilon_tolerance=0.001.
REFERENCE = {
    0.5: {256: 69.2, 1024: 64.9, 4096: 63.8, 16384: 64.3, 50000: 61.4},
    8.0: {256: 21.8, 1024: 13.3, 4096: 8.9, 16384: 6.8, 50000: 5.1},
}


@pytest.mark.parametrize("eps", sorted(REFERENCE))
def test_sigma_sqrt_t_matches_the_reference_table(eps):
    for b, want in REFERENCE[eps].items():
        t = steps_for(50_000, 8, b)
        s = noise_multiplier(eps, 1e-5, b / 50_000, t, "rdp", 0.001)
        assert s * math.sqrt(t) == pytest.approx(want, rel=0.01), (eps, b)
        assert epsilon_spent(s, b / 50_000, t, 1e-5, "rdp") <= eps


def _rows(values: dict[int, float | None], infeasible=()) -> list[NoiseRow]:
    return [
        NoiseRow(
            batch_size=b,
            sample_rate=b / 1000,
            steps=1,
            sigma=v,
            sigma_sqrt_t=v,
            sigma_over_b=None,
            feasible=v is not None and b not in infeasible,
        )
        for b, v in values.items()
    ]


def test_choose_batch_size_takes_the_smallest_b_on_the_plateau():
    plateau = _rows({16: 120.0, 64: 70.0, 256: 64.0, 1024: 62.0, 4096: 61.0})
    assert rule.choose_batch_size(plateau, 0.05) == 256  # 64 ≤ 1.05·61 = 64.05; 70 is not
    assert rule.choose_batch_size(plateau, 0.0) == 4096
    falling = _rows({16: 60.0, 64: 30.0, 256: 20.0, 1024: 12.0, 4096: 8.0})
    assert rule.choose_batch_size(falling, 0.05) == 4096
    # An infeasible minimum (too few steps) is not a candidate.
    assert rule.choose_batch_size(_rows({64: 70.0, 256: 66.0, 1000: 50.0}, infeasible=(1000,)), 0.05) == 256
    with pytest.raises(ValueError, match="no feasible batch size"):
        rule.choose_batch_size(_rows({64: None, 256: 66.0}, infeasible=(256,)), 0.05)


def test_clip_grid_moves_up_as_epsilon_falls_and_lr_scales_with_sqrt_b():
    factors = [0.5, 1.0, 2.0]
    loose, tight = rule.clip_grid(8.0, 2.0, factors), rule.clip_grid(0.5, 2.0, factors)
    assert loose == [1.0, 2.0, 4.0]  # no shift at ε ≥ ε_ref
    assert rule.clip_grid(16.0, 2.0, factors) == loose
    assert tight == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0])  # extended up to ×(8/0.5)^0.5 = ×4
    assert rule.clip_grid(1.0, 2.0, factors) == pytest.approx([1.0, 2.0, 4.0, 2 * 8**0.5, 4 * 8**0.5])  # only points above
    assert rule.clip_grid(0.5, 2.0, factors, exponent=0.0) == loose
    assert rule.lr_scale(256, 256) == 1.0 and rule.lr_scale(256, 1024) == pytest.approx(2.0)


def test_plan_follows_the_papers_directions_and_stays_within_budget():
    common = dict(dataset_size=50_000, epochs=8, accountant="rdp", batch_sizes=[256, 1024, 4096, 16384, 50000])
    tight, loose = dp_plan_for(DPConfig(epsilon=0.5, **common)), dp_plan_for(DPConfig(epsilon=8, **common))
    assert tight.batch_size < loose.batch_size  # tight ε: σ√T plateau → small B; loose: keep falling → large B
    assert loose.batch_size == 16384  # 50000 has T=8 < min_steps=20
    assert not next(r for r in loose.table if r.batch_size == 50000).feasible
    assert max(tight.clip_grid) > max(loose.clip_grid) and min(tight.clip_grid) == min(loose.clip_grid)
    assert tight.clip == loose.clip == 1.0  # the starting C is the unshifted reference
    for p in (tight, loose):
        assert p.epsilon_check <= p.config.epsilon
        assert p.steps == steps_for(50_000, 8, p.batch_size) and p.sample_rate == p.batch_size / 50_000
    with_lr = dp_plan_for(DPConfig(epsilon=8, lr=1e-3, lr_reference_batch=4096, **common))
    assert with_lr.lr == pytest.approx(1e-3 * math.sqrt(16384 / 4096))


def test_infeasible_plans_say_why():
    with pytest.raises(DPPlanError, match="min_steps=500"):
        dp_plan_for(DPConfig(epsilon=1, dataset_size=1000, epochs=1, min_steps=500, batch_sizes=[100, 1000], accountant="rdp"))
    with pytest.raises(DPPlanError, match="no noise multiplier"):
        dp_plan_for(DPConfig(epsilon=1e-7, dataset_size=1000, epochs=8, batch_sizes=[1000], min_steps=1, accountant="rdp"))


def test_config_reports_every_error_at_once():
    with pytest.raises(ValidationError) as e:
        DPConfig(epsilon=0, delta=0.01, dataset_size=1000, epochs=8, batch_sizes=[2000], lr=1e-3)
    fields = {err["loc"][0] for err in e.value.errors()}
    assert fields == {"epsilon", "delta", "batch_sizes"}
    assert "1/dataset_size" in str(e.value) and "2000" in str(e.value)
    with pytest.raises(ValidationError, match="lr_reference_batch"):
        DPConfig(epsilon=1, epochs=8, lr=1e-3)
    with pytest.raises(ValidationError, match="delta"):
        DPConfig(epsilon=1, epochs=8).with_dataset_size(200_000)  # derived N re-validates δ < 1/N
    assert DPConfig(epsilon=1, epochs=8, dataset_size=100).resolved_batch_sizes() == [16, 32, 64, 100]


def test_shipped_dp_spec_validates():
    data = yaml.safe_load((ROOT / "tests" / "data" / "dp_from_scratch.yaml").read_text())
    cfg = DPConfig.model_validate(data["dp"])
    assert cfg.epsilon == 1.0 and cfg.accountant == "prv"
    from hptransfer import spec
    from hptransfer.transfer.rules import RULES

    assert "dp" in spec.StudySpec.model_fields and "dp" in RULES
    loaded = spec.load_spec(ROOT / "tests" / "data" / "dp_from_scratch.yaml")
    assert DPConfig.model_validate(loaded.dp.model_dump(include=set(DPConfig.model_fields))) == cfg


# --- `hpt dp-plan` --------------------------------------------------------------------------------


def _invoke(*args: str):
    from typer.testing import CliRunner

    from hptransfer.cli import app

    return CliRunner().invoke(app, ["dp-plan", *args])


def test_cli_json_plan():
    r = _invoke(
        "--epsilon",
        "8",
        "--dataset-size",
        "50000",
        "--epochs",
        "8",
        "--accountant",
        "rdp",
        "--batch-sizes",
        "256,1024,4096,16384,50000",
        "--json",
    )
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["batch_size"] == 16384 and plan["epsilon_check"] <= 8
    assert [row["batch_size"] for row in plan["table"]] == [256, 1024, 4096, 16384, 50000]


def test_cli_table_marks_the_chosen_batch():
    r = _invoke("--epsilon", "1", "--dataset-size", "672", "--epochs", "8", "--accountant", "rdp", "--batch-sizes", "16,64,256")
    assert r.exit_code == 0, r.output
    assert "chosen" in r.output and "σ√T" in r.output and "clipping grid" in r.output


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--epsilon", "0"], "--epsilon=0.0"),
        (["--epsilon", "1", "--delta", "0.01"], "--delta=0.01"),
        (["--epsilon", "1e-7", "--batch-sizes", "1000", "--min-steps", "1"], "no noise multiplier"),
        (["--epsilon", "1", "--min-steps", "100000", "--batch-sizes", "100,1000"], "--min-steps=100000"),
    ],
)
def test_cli_infeasible_requests_exit_2(args, expect):
    r = _invoke("--dataset-size", "1000", "--epochs", "8", "--accountant", "rdp", *args)
    assert r.exit_code == 2, r.output
    assert expect in " ".join(r.output.split())
