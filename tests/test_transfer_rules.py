"""The contract every registered rule must pass, and recovery of known optima from synthetic sweeps."""

import itertools
import math

import numpy as np
import pytest

from hptransfer.plan import load_plan, save_plan
from hptransfer.spec import DEFAULT_HPS
from hptransfer.transfer.engine import make_plan, standalone_spec
from hptransfer.transfer.heuristics import adjust_for_batch_and_steps
from hptransfer.transfer.rules import RULES, Evidence, Target, group_multipliers
from hptransfer.transfer.schedule import sp_warmup_factor, steps_to_half, warmup_multiplier
from hptransfer.transfer.synthetic import synthetic_sweep, true_optimum

WIDTHS = [32, 64, 128, 256]
# `dp` picks its own batch size from the privacy budget (so no identity at the base width); it has
# its own contract in test_transfer_dp_rule.py.
ALL_RULES = sorted(r for r in RULES if r != "dp")
PARAM = {"sp-warmup": "sp"}  # the parametrization each rule is meant for (default mup)


def evidence(rule, slope=-0.5, wd=0.1, warmup=10.0):
    """Optima on an exact power law lr*(n) = 4e-3·(n/32)^slope."""
    return Evidence(
        optima={w: {"lr": 4e-3 * (w / 32) ** slope} for w in WIDTHS},
        fixed={"weight_decay": wd, "warmup_steps": warmup},
        base_width=32,
        parametrization=PARAM.get(rule, "mup"),
    )


def target(width, batch=16, steps=100, **kw):
    return Target(width=width, steps=steps, batch_size=batch, proxy_steps=100, proxy_batch_size=16, **kw)


@pytest.mark.parametrize("rule", ALL_RULES)
def test_identity_when_target_is_the_base_width(rule):
    ev = evidence(rule)
    res = RULES[rule](ev, target(32))
    assert res.hyperparameters == {**DEFAULT_HPS, **ev.fixed, **ev.optima[32]}
    assert res.heuristics == []
    assert all(v == 1.0 for g in res.param_group_multipliers.values() for v in g.values())
    assert warmup_multiplier(0, {"schedule": res.schedule}) == 1.0
    assert not res.warnings


@pytest.mark.parametrize("rule", ALL_RULES)
@pytest.mark.parametrize("slope", [-0.5, 0.3])
def test_direction_of_change_follows_the_trend(rule, slope):
    """Wider target: the LR stays between the widest optimum (no transfer of the trend) and the
    trend's extrapolation — never moves against the trend, never overshoots it."""
    res = RULES[rule](evidence(rule, slope), target(1024))
    widest, extrapolated = 4e-3 * (256 / 32) ** slope, 4e-3 * (1024 / 32) ** slope
    lo, hi = sorted([widest, extrapolated])
    assert lo * (1 - 1e-9) <= res.hyperparameters["lr"] <= hi * (1 + 1e-9)


@pytest.mark.parametrize("rule", ALL_RULES)
def test_batch_and_steps_heuristics_are_applied_and_flagged(rule):
    ev = evidence(rule)
    same = RULES[rule](ev, target(1024))
    big = RULES[rule](ev, target(1024, batch=64, steps=200))
    # Batch ×4 at the run's steps: √B at fixed samples (½) plus the horizon prior (−0.125) for the 4×
    # tokens (transfer/priors.py's derivation, written out here): 4^0.375, not √4.
    assert big.hyperparameters["lr"] == pytest.approx(4 ** (0.5 - 0.125) * same.hyperparameters["lr"], rel=1e-9)
    assert big.hyperparameters["warmup_steps"] == 2 * same.hyperparameters["warmup_steps"]
    assert {h["name"] for h in big.heuristics} >= {"adam-batch-lr", "warmup-fraction"}
    assert all(h["kind"] == "heuristic" and h["source"] for h in big.heuristics)
    if rule in ("mup-independent-wd", "sp-warmup"):  # η·λ held constant
        assert big.hyperparameters["lr"] * big.hyperparameters["weight_decay"] == pytest.approx(
            same.hyperparameters["lr"] * same.hyperparameters["weight_decay"]
        )
    else:
        assert big.hyperparameters["weight_decay"] == same.hyperparameters["weight_decay"]


@pytest.mark.parametrize("rule", ALL_RULES)
def test_plan_serialisation_round_trip(rule, tmp_path):
    df = synthetic_sweep(WIDTHS, list(np.geomspace(1e-4, 1e-1, 13)), noise=0.003, seeds=(0, 1), diverge_above=lambda n: 3e-2)
    df["weight_decay"] = 0.1
    spec = standalone_spec(
        df, rule=rule, target_width=1024, target_batch_size=32, model={"family": "mlp", "parametrization": PARAM.get(rule, "mup")}
    )
    plan = make_plan(spec, df, {"mlflow_run_id": "abc"})
    path = save_plan(plan, tmp_path / "transfer_plan.yaml")
    back = load_plan(path)
    assert back == plan
    for k in ("lr", "weight_decay", "warmup_steps", "beta1", "beta2"):
        assert k in back.hyperparameters
    assert [warmup_multiplier(t, back) for t in (0, 50, 500)] == [warmup_multiplier(t, plan) for t in (0, 50, 500)]
    assert back.provenance["mlflow_run_id"] == "abc" and back.provenance["spec_hash"]


# --- recovery of a known optimum from noisy sweeps with diverged trials ---------------------------

GRID = list(np.geomspace(1e-4, 1e-1, 13))


@pytest.mark.parametrize("rule", ALL_RULES)
def test_each_rule_recovers_a_width_invariant_optimum(rule):
    """µP's promise: ν* the same at every width. Noise, 3 seeds, everything above 2e-2 diverges."""
    df = synthetic_sweep(
        [32, 64, 128, 256], GRID, nu_inf=3e-3, noise=0.004, seeds=(0, 1, 2), diverge_above=lambda n: 2e-2, rng_seed=7
    )
    spec = standalone_spec(df, rule=rule, target_width=2048, model={"family": "mlp", "parametrization": PARAM.get(rule, "mup")})
    plan = make_plan(spec, df)
    assert abs(math.log(plan.hyperparameters["lr"] / 3e-3)) < 0.25  # within ~25%; grid step is ×1.78
    assert plan.diagnostics.trials_by_width["32"]["diverged"] > 0


def test_power_law_recovers_a_drifting_optimum_that_mup_misses():
    truth = true_optimum(4096, 3e-3, power=-0.5, n0=64)
    df = synthetic_sweep(
        [32, 64, 128, 256, 512],
        GRID,
        nu_inf=3e-3,
        power=-0.5,
        n0=64,
        noise=0.003,
        seeds=(0, 1, 2),
        diverge_above=lambda n: 5e-2,
        rng_seed=3,
    )
    errs = {}
    for rule in ("power-law", "mup"):
        plan = make_plan(standalone_spec(df, rule=rule, target_width=4096, model={"family": "mlp"}), df)
        errs[rule] = abs(math.log(plan.hyperparameters["lr"] / truth))
        if rule == "mup":
            assert any("drifts with width" in w for w in plan.diagnostics.warnings)
    assert errs["power-law"] < 0.2 < errs["mup"]


# --- rule specifics -------------------------------------------------------------------------------


def test_mup_group_multipliers_hold_lr_times_wd_per_group():
    g = group_multipliers("mup", 8.0)
    assert g["hidden_matrices"] == {"lr": 1 / 8, "weight_decay": 8.0}
    assert g["readout"]["forward_multiplier"] == 1 / 8 and g["vectors_embeddings"]["lr"] == 1.0
    assert group_multipliers("sp", 8.0) == {"all": {"lr": 1.0, "weight_decay": 1.0}}


def test_sp_warmup_schedule_matches_paper3_formula():
    ev = evidence("sp-warmup", slope=0.0, wd=0.1)
    res = RULES["sp-warmup"](ev, target(1024, steps=100_000))
    s = res.schedule
    m, eta_lambda = 1024 / 256, 4e-3 * 0.1
    assert s["m"] == m and s["eta_lambda"] == pytest.approx(eta_lambda)
    assert s["timescale"] == pytest.approx(-1 / math.log(1 - eta_lambda))  # (1 − ηλ)^{2t} = exp(−2t/τ): τ ≈ 2499.5
    plan = {"schedule": s}
    for t in (0, 10, 1000, 5000):  # s_t = (1 + (m² − 1)(1 − ηλ)^{2t})^{−1/2}
        assert warmup_multiplier(t, plan) == pytest.approx((1 + (m * m - 1) * (1 - eta_lambda) ** (2 * t)) ** -0.5)
    assert warmup_multiplier(0, plan) == pytest.approx(1 / m)
    assert warmup_multiplier(s["steps_to_half"], plan) == pytest.approx(2**-0.5)
    # ≈ ln(m)/(ηλ) steps to reach 1/√2 (paper 3), up to the ln(m² − 1) vs 2 ln m difference
    assert s["steps_to_half"] == pytest.approx(math.log(m) / eta_lambda, rel=0.1)
    vals = [sp_warmup_factor(t, m, s["timescale"]) for t in range(0, 20_000, 500)]
    assert all(b >= a for a, b in itertools.pairwise(vals)) and vals[-1] > 0.99


def test_sp_warmup_timescale_parameter_and_zero_wd_fallback():
    ev = evidence("sp-warmup", slope=0.0, wd=0.1)
    res = RULES["sp-warmup"](ev, target(1024, warmup_timescale=50.0))
    assert res.schedule["timescale"] == 50.0 and res.schedule["timescale_source"] == "given"
    res = RULES["sp-warmup"](evidence("sp-warmup", slope=0.0, wd=0.0), target(1024, steps=1000))
    assert steps_to_half(res.schedule["m"], res.schedule["timescale"]) == pytest.approx(100)
    assert any("weight_decay > 0" in w for w in res.warnings)


def test_rules_warn_on_the_wrong_parametrization():
    ev_sp = Evidence(optima={32: {"lr": 1e-3}, 64: {"lr": 1e-3}}, fixed={}, base_width=32, parametrization="sp")
    assert any("not µP" in w for w in RULES["mup"](ev_sp, target(256)).warnings)
    ev_mup = Evidence(
        optima={32: {"lr": 1e-3}, 64: {"lr": 1e-3}}, fixed={"weight_decay": 0.1}, base_width=32, parametrization="mup"
    )
    assert any("µP already" in w for w in RULES["sp-warmup"](ev_mup, target(256)).warnings)


def test_heuristics_are_a_no_op_without_a_change():
    hps = {"lr": 1e-3, "weight_decay": 0.1, "warmup_steps": 10.0}
    assert adjust_for_batch_and_steps(hps, 16, 16, 100, 100, True) == (hps, [])


def test_mup_standard_wd_keeps_weight_decay_coupled_so_eta_lambda_shrinks():
    """Paper 3's comparison variant: hidden matrices lr/m with weight_decay ×1 (MuAdamW would apply
    ×m, so the trainer divides by m); `mup-independent-wd`/`mup` keep ×m, i.e. η·λ constant."""
    ev = evidence("mup-standard-wd", slope=0.0)
    std = RULES["mup-standard-wd"](ev, target(1024))
    ind = RULES["mup-independent-wd"](ev, target(1024))
    m = 1024 / 32
    assert std.param_group_multipliers["hidden_matrices"] == {"lr": 1 / m, "weight_decay": 1.0}
    assert ind.param_group_multipliers["hidden_matrices"] == {"lr": 1 / m, "weight_decay": m}
    g = std.param_group_multipliers["hidden_matrices"]
    assert g["lr"] * g["weight_decay"] == pytest.approx(1 / m)  # η·λ per hidden matrix shrinks as 1/m
    assert std.hyperparameters == ind.hyperparameters  # same optimum carried over
    assert any("divide" in n and "MuAdamW" in n for n in std.notes)
    sp = Evidence(optima=ev.optima, fixed=ev.fixed, base_width=32, parametrization="sp")
    assert any("not µP" in w for w in RULES["mup-standard-wd"](sp, target(1024)).warnings)


def _ev_noisy(optima, se=0.05, censored=None):
    return Evidence(
        optima={w: {"lr": v} for w, v in optima.items()},
        fixed={"weight_decay": 0.1},
        base_width=32,
        parametrization="mup",
        log_se={w: {"lr": se} for w in optima},
        censored={w: {"lr": c} for w, c in (censored or {}).items()},
    )


def test_power_law_takes_censored_widths_as_bounds():
    optima = {w: 4e-3 * (w / 32) ** -0.5 for w in WIDTHS}
    # Capped by divergence at half the trend: "ν* ≥ this" holds by many se, so it moves nothing.
    optima[256] = 0.5 * optima[256]
    res = RULES["power-law"](_ev_noisy(optima, censored={256: "lower"}), target(1024))
    assert res.hyperparameters["lr"] == pytest.approx(4e-3 * (1024 / 32) ** -0.5, rel=1e-6)
    assert any("censored widths [256] as bounds" in n for n in res.notes)
    # The same bound where the trend crosses it ("ν* ≥ 2× the trend") pulls the fit up.
    optima[256] = 4 * optima[256]
    pulled = RULES["power-law"](_ev_noisy(optima, censored={256: "lower"}), target(1024))
    assert pulled.hyperparameters["lr"] > 1.2 * res.hyperparameters["lr"]


def test_power_law_extrapolates_only_a_significant_slope():
    rng = np.random.default_rng(0)
    noise = {w: float(e) for w, e in zip(WIDTHS, 0.3 * rng.standard_normal(len(WIDTHS)))}
    flat = {w: 4e-3 * math.exp(noise[w]) for w in WIDTHS}  # no trend, scatter 0.3 ≫ se 0.05
    res = RULES["power-law"](_ev_noisy(flat), target(4096))
    assert res.hyperparameters["lr"] == flat[256]  # the widest uncensored optimum, as is
    assert any("slope not significant" in n for n in res.notes)
    two = RULES["power-law"](_ev_noisy({32: 4e-3, 64: 3e-3, 128: 1e-2}, censored={128: "lower"}), target(4096))
    assert two.hyperparameters["lr"] == 3e-3 and any("too few to fit a slope" in n for n in two.notes)


def test_power_law_extrapolation_is_bounded_by_its_prediction_interval():
    optima = {w: 4e-3 * (w / 32) ** -0.5 for w in WIDTHS}
    tight = RULES["power-law"](_ev_noisy(optima, se=0.02), target(4096))
    assert tight.hyperparameters["lr"] == pytest.approx(4e-3 * (4096 / 32) ** -0.5, rel=1e-6)
    assert not tight.warnings
    # Same slope measured with errors of 0.4: significant (|b|/se > 2), but the 95% interval at
    # 16× beyond the ladder spans more than ×/÷2: use its end nearest the widest optimum.
    loose = RULES["power-law"](_ev_noisy({w: 4e-3 * (w / 32) ** -1.5 for w in WIDTHS}, se=0.4), target(4096))
    widest, trend = 4e-3 * (256 / 32) ** -1.5, 4e-3 * (4096 / 32) ** -1.5
    assert trend < loose.hyperparameters["lr"] < widest
    assert any("uncertain by more than" in w for w in loose.warnings)


@pytest.mark.parametrize("rng_seed", range(4))
def test_power_law_recovers_a_clean_1_over_width_drift_8x_beyond_the_ladder(rng_seed):
    """The optimum halves per width doubling (ν* = 2^−7 at 32 → 2^−13 at 2048), 4 widths, 3 seeds,
    0.3% loss noise, a ×2 LR grid: the fit's 95% interval at 8× is just over ×/÷2 (the optima's se
    are floored at a quarter grid step), and the guard used to jump to the interval's end (2^−12).
    Recovered within half a grid step (×2^0.5)."""
    grid = [2.0**-k for k in range(2, 15)]
    truth = true_optimum(2048, 2**-7, power=-1.0, n0=32)
    assert math.log2(truth) == pytest.approx(-13, abs=1e-12)
    df = synthetic_sweep(
        [32, 64, 128, 256], grid, nu_inf=2**-7, power=-1.0, n0=32, noise=0.0066, seeds=(0, 1, 2), rng_seed=rng_seed
    )
    plan = make_plan(standalone_spec(df, rule="power-law", target_width=2048, model={"family": "mlp"}), df)
    assert abs(math.log2(plan.hyperparameters["lr"] / truth)) < 0.5, plan.diagnostics.notes


def test_sp_warmup_caps_a_timescale_longer_than_the_run():
    ev = evidence("sp-warmup", slope=0.0, wd=0.1)
    res = RULES["sp-warmup"](ev, target(1024, steps=1000))  # τ = 1/(ηλ) ≈ 2500 steps: 1/√2 at ≈ 3385
    s = res.schedule
    assert s["timescale_uncapped"] == pytest.approx(-1 / math.log(1 - 4e-3 * 0.1))  # τ = −1/ln(1 − ηλ) ≈ 2499.5
    # capped so that t½ = τ·ln(m² − 1)/2 = 1000 steps, m = 1024/256 = 4: τ = 2·1000/ln 15
    assert s["timescale"] == pytest.approx(2000 / math.log(15))
    assert s["steps_to_half"] == pytest.approx(1000) and steps_to_half(s["m"], s["timescale"]) == pytest.approx(1000)
    assert warmup_multiplier(1000, {"schedule": s}) == pytest.approx(2**-0.5)
    assert "capped" in s["timescale_source"] and any("capped the timescale" in w for w in res.warnings)
    given = RULES["sp-warmup"](ev, target(1024, steps=1000, warmup_timescale=1e5))  # a given one too
    assert given.schedule["timescale"] < 1e5 and any("capped" in w for w in given.warnings)
