"""The measured DP rules (issue 26, item 2): the predicted-loss batch rule on synthetic step curves,
C(ε) from a synthetic norm distribution, paper 1's re-weighting diagnostic, the new config/plan
fields and old plans. Pure functions; the plan tests use the RDP accountant on tiny N (fast)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import ValidationError

from hptransfer.dp import rule
from hptransfer.dp.accounting import NoiseRow
from hptransfer.dp.plan import DPEvidence, DPPlan, dp_plan_for
from hptransfer.dp.steps import (
    LossModel,
    StepPoint,
    best_lr_per_batch,
    fit_loss_model,
    fit_lr_law,
    noise_ratio,
    step_points_from_table,
)
from hptransfer.privacy import DPConfig

from conftest import ROOT

E, N = 4.0, 4096
# A σ√T table with paper 1's tight-ε shape (σ from Opacus' PRV accountant at ε = 2, δ = 1e-5,
# N = 4096, E = 4: benchmarks/results/dp_lm.json): σ√T falls all the way to B = 512, T = 32.
SIGMA = {32: 0.7922, 64: 0.9143, 128: 1.0986, 256: 1.3770, 512: 1.7920}


def _rows(sigma=SIGMA) -> list[NoiseRow]:
    out = []
    for b, s in sigma.items():
        t = math.ceil(E * N / b)
        out.append(
            NoiseRow(
                batch_size=b,
                sample_rate=b / N,
                steps=t,
                sigma=s,
                sigma_sqrt_t=s * math.sqrt(t),
                sigma_over_b=s / b,
                feasible=True,
            )
        )
    return out


def _model(a: float, alpha: float, kappa: float) -> LossModel:
    return LossModel(l_inf=2.8, a=a, alpha=alpha, kappa=kappa, n_points=10, rmse=0.0, steps_range=(32, 512))


def test_batch_rule_buys_steps_when_the_step_curve_demands_it_and_follows_sigma_sqrt_t_when_not():
    rows = _rows()
    sst = {r.batch_size: r.sigma_sqrt_t for r in rows}
    noise_best = min(sst, key=sst.get)
    assert noise_best == 512 and rule.choose_batch_size(rows, 0.05) == 512  # the σ√T rule: largest B, T = 32
    kappa = 5e4  # loss per ρ², ρ = σ√T/(E·N) ≈ 6e-4 here: penalties ≈ 0.01–0.02
    # Flat step curve (A = 0): only the noise term is left → exactly the σ√T minimum.
    b, preds, why = rule.choose_batch_size_predicted(rows, _model(0.0, 1.0, kappa), E, N)
    assert why["sigma_sqrt_t_choice"] == 512 and not why["moved"]
    assert b == noise_best
    assert [p["batch_size"] for p in preds] == [32, 64, 128, 256, 512]
    # A slow curve, A·T^-α = 0.05·T^-0.5: few steps cost little, so the σ√T choice stands. Worked out:
    # B=128: 0.0044 + κρ² 0.0288 = 0.0332; B=512: 0.0088 + 0.0191 = 0.0280 (above L_∞) → 512.
    assert rule.choose_batch_size_predicted(rows, _model(0.05, 0.5, kappa), E, N)[0] == 512
    # A steep curve (the step-limited task, about the fit to dp_lm.json): T = 32 costs 8.5·32^-1.3 = 0.094,
    # T = 128 only 0.016: B=128 0.0155 + 0.0288 = 0.0443 beats B=512 0.0939 + 0.0191 = 0.1131.
    b, preds, why = rule.choose_batch_size_predicted(rows, _model(8.5, 1.3, kappa), E, N)
    assert b == 128 and why["moved"] and why["predicted_gain"] == pytest.approx(0.1131 - 0.0443, abs=5e-4)
    p = {x["batch_size"]: x for x in preds}
    assert p[b]["predicted_loss"] == pytest.approx(p[b]["step_loss"] + p[b]["noise_penalty"])
    assert p[512]["step_loss"] > p[b]["step_loss"] and p[512]["noise_penalty"] < p[b]["noise_penalty"]
    # No noise cost at all: the most steps (smallest B).
    assert rule.choose_batch_size_predicted(rows, _model(8.5, 1.3, 0.0), E, N)[0] == 32
    # B without a valid σ is never a candidate, and none at all is a clear error.
    none = [r.model_copy(update={"sigma": None, "sigma_sqrt_t": None, "feasible": False}) for r in rows]
    with pytest.raises(ValueError, match="no feasible batch size"):
        rule.choose_batch_size_predicted(none, _model(1, 1, 1), E, N)


def test_fit_recovers_a_synthetic_law_and_the_plan_picks_by_it():
    truth = _model(8.5, 1.3, 5e4)
    # Noise-free trials at four T, private ones at two ε (the second ε: σ doubled, a tighter budget).
    pts = [StepPoint(steps=t, rho=0.0, loss=truth.step_loss(t)) for t in (32, 64, 128, 512)]
    for scale in (1.0, 2.0):
        for r in _rows():
            rho = noise_ratio(scale * r.sigma, r.steps, E, N)
            pts.append(StepPoint(steps=r.steps, rho=rho, loss=truth.predict(r.steps, rho)))
    m = fit_loss_model(pts)
    assert m.alpha == pytest.approx(1.3) and m.a == pytest.approx(8.5, rel=1e-6)
    assert m.kappa == pytest.approx(5e4, rel=1e-6) and m.l_inf == pytest.approx(2.8) and m.rmse < 1e-9
    assert len(m.boot) > 90 and m.as_dict()["bootstrap_refits"] == len(m.boot)
    # Exact data: every refit is the truth, so the steep curve's gain is certain and B moves to 128.
    b, _, why = rule.choose_batch_size_predicted(_rows(), m, E, N)
    assert b == 128 and why["moved"] and why["gain_interval"][0] > 0
    # Too little to identify a curve: a clear error saying what to add.
    with pytest.raises(ValueError, match="≥ 2 different step counts"):
        fit_loss_model([StepPoint(64, 0.0, 3.0)] * 3)


def test_a_gain_inside_the_fit_noise_keeps_the_sigma_sqrt_t_choice():
    """Cells of a mildly step-limited task measured with seed noise comparable to the gap between batch
    sizes: the point fit prefers a smaller B, but its bootstrap interval of the gain straddles 0, so
    the σ√T choice (B = 512) stands. The same curve measured without noise moves B down."""
    rows = _rows()
    truth = _model(0.2, 0.5, 5e4)  # B=128 truly 0.008 below B=512

    def cells(noise: float) -> list[StepPoint]:
        rng, out = np.random.default_rng(3), []
        for scale in (1.0, 2.0, 4.0):
            for r in rows:
                rho = noise_ratio(scale * r.sigma, r.steps, E, N)
                out.append(StepPoint(steps=r.steps, rho=rho, loss=truth.predict(r.steps, rho) + noise * rng.standard_normal()))
        return out

    exact = fit_loss_model(cells(0.0))
    b_exact, _, why_exact = rule.choose_batch_size_predicted(rows, exact, E, N)
    assert b_exact == 128 and why_exact["moved"] and why_exact["predicted_gain"] == pytest.approx(0.008, abs=5e-4)
    noisy = fit_loss_model(cells(0.02))
    b, _, why = rule.choose_batch_size_predicted(rows, noisy, E, N)
    assert b == 512 and not why["moved"] and why["sigma_sqrt_t_choice"] == 512
    assert why["predicted_best"] < 512  # the point fit moved B down; its interval did not clear 0
    assert why["gain_interval"][0] <= 0 < why["gain_interval"][1]


def test_step_points_and_lr_law_from_the_dp_sweep_table():
    rows = []
    for eps, sigma in ((math.inf, 0.0), (2.0, 1.0)):
        for b, t in ((64, 256), (256, 64)):
            for clip, lr, seeds in ((1.0, 0.01, (3.0, 3.2)), (4.0, 0.01, (3.5, 3.5)), (1.0, 0.02 * (b / 64) ** 0.5, (2.9, 3.1))):
                for seed, loss in enumerate(seeds):
                    loss += 0.1 * (b == 256) + 0.05 * (sigma > 0)
                    rows.append(
                        dict(
                            epsilon=eps,
                            batch_size=b,
                            clip=clip,
                            lr=lr,
                            seed=seed,
                            sigma=sigma,
                            steps=t,
                            val_loss=loss,
                            status="ok",
                        )
                    )
    rows.append(dict(epsilon=2.0, batch_size=64, clip=1.0, lr=0.1, seed=0, sigma=1.0, steps=256, val_loss=0.1, status="diverged"))
    df = pd.DataFrame(rows)
    pts = {(p.epsilon, p.batch_size): p for p in step_points_from_table(df, E, N)}
    assert set(pts) == {(math.inf, 64), (math.inf, 256), (2.0, 64), (2.0, 256)}
    assert pts[(math.inf, 64)].rho == 0.0 and pts[(math.inf, 64)].loss == pytest.approx(3.0)  # seed mean of the best (C, lr)
    assert pts[(2.0, 256)].rho == pytest.approx(1.0 * math.sqrt(64) / (E * N))
    assert pts[(2.0, 64)].loss == pytest.approx(3.05)  # the diverged row is not evidence
    bs, lrs = best_lr_per_batch(df)
    beta, lr_ref, b_ref = fit_lr_law(bs, lrs)
    assert beta == pytest.approx(0.5) and b_ref == 128 and lr_ref == pytest.approx(0.02 * 2**0.5)
    assert fit_lr_law([256], [0.01]) == (0.5, pytest.approx(0.01), 256)  # one B: the √ prior


def test_clip_moves_up_as_epsilon_falls_inside_the_measured_distribution():
    norms = np.random.default_rng(0).lognormal(mean=0.0, sigma=0.6, size=2000)
    cs = [rule.clip_from_norms(norms, e) for e in (16.0, 8.0, 2.0, 0.5, 0.1)]
    assert cs[0] == cs[1] == pytest.approx(np.quantile(norms, 0.02))  # at ε ≥ ε_ref: the low tail (q = 0.02)
    assert all(a < b for a, b in itertools.pairwise(cs[1:]))  # strictly up as ε falls
    assert cs[-1] < np.median(norms)  # the odds of staying unclipped ×(8/0.1)^½ ≈ 9: p ≈ 0.16, still the low tail
    # The odds form: p/(1−p) = q/(1−q)·(ε_ref/ε)^γ; with q = 1/2, at ε = 0.5 the odds are 4 → p = 0.8.
    assert rule.clip_quantile(0.5) == pytest.approx(0.02 / 0.98 * 4 / (1 + 0.02 / 0.98 * 4))
    assert rule.clip_quantile(0.5, quantile=0.5) == pytest.approx(0.8)
    assert rule.clip_quantile(8.0, quantile=0.5) == pytest.approx(0.5) and 0 < rule.clip_quantile(1e-9) < 1
    assert rule.clip_from_norms(norms, 0.5, exponent=0.0) == pytest.approx(cs[1])  # γ = 0: no move
    # A narrow distribution barely moves C; a wide one moves it far.
    narrow = np.random.default_rng(1).lognormal(0.0, 0.05, 2000)
    assert rule.clip_from_norms(narrow, 0.5) / rule.clip_from_norms(narrow, 8) < 1.1 < cs[3] / cs[1]
    with pytest.raises(ValueError, match="finite numbers"):
        rule.clip_from_norms([1.0, math.nan], 1.0)


def test_reweighting_on_two_classes():
    # Class "easy": small gradients (never clipped at C = 1); "hard": norms 2 and 4 → w = (1/2 + 1/4)/2.
    norms, labels = [0.5, 0.8, 2.0, 4.0], ["easy", "easy", "hard", "hard"]
    assert rule.reweighting(norms, labels, 1.0) == {"easy": 1.0, "hard": pytest.approx(0.375)}
    assert rule.reweighting(norms, labels, 10.0) == {"easy": 1.0, "hard": 1.0}  # no clipping: no re-weighting
    assert rule.reweighting([0.0], ["z"], 1.0) == {"z": 1.0}
    with pytest.raises(ValueError, match="differ in length"):
        rule.reweighting([1.0], [], 1.0)
    assert rule.norm_buckets([1, 2, 3, 4], 2) == ["q1", "q1", "q2", "q2"]


def _cfg(**kw) -> DPConfig:
    # RDP at a coarse search tolerance: σ in a fraction of a second (PRV would take seconds per B).
    base = dict(epsilon=2.0, dataset_size=2048, epochs=2, batch_sizes=[16, 256], accountant="rdp", epsilon_tolerance=0.2)
    return DPConfig(**{**base, **kw})


def test_plan_uses_the_measured_rules_and_says_when_it_cannot():
    steep = _model(50.0, 1.0, 0.0)  # no noise cost: the most steps
    plan = dp_plan_for(_cfg(), DPEvidence(loss_model=steep, source="synthetic"))
    assert plan.batch_rule == "predicted-loss" and plan.batch_size == 16
    assert len(plan.predictions) == 2 and plan.loss_model["alpha"] == 1.0
    assert any("σ√T rule (batch_rule: noise, T ≥ min_steps=20) would choose" in n for n in plan.notes)
    assert plan.batch_decision["moved"] and "taken as exact" in plan.batch_decision["why"]
    assert plan.epsilon_check <= 2.0 and plan.steps == 2 * 2048 // 16
    # No step curve: the σ√T rule, and the plan says why.
    fallback = dp_plan_for(_cfg())
    assert fallback.batch_rule == "noise" and any("fell back to the σ√T rule" in n for n in fallback.notes)
    assert dp_plan_for(_cfg(batch_rule="noise"), DPEvidence(loss_model=steep)).batch_size == fallback.batch_size
    # Measured norms: C is their quantile (q = 1/2 here: the median at ε ≥ 8), above the median at
    # ε = 2 < 8 (odds ×2: p = 2/3), with the diagnostic.
    norms = list(np.random.default_rng(0).lognormal(0.0, 0.6, 400))
    labels = ["a"] * 200 + ["b"] * 200
    p = dp_plan_for(_cfg(clip_quantile=0.5), DPEvidence(grad_norms=norms, grad_labels=labels, lr_law=(0.5, 0.01, 64)))
    assert p.clip_from == "measured norms" and p.clip > np.median(norms)
    assert p.clip_quantile == pytest.approx(2 / 3) and p.clipped_fraction == pytest.approx(1 / 3, abs=0.01)
    low = dp_plan_for(_cfg(), DPEvidence(grad_norms=norms))  # the default q: the low tail
    assert low.clip < np.quantile(norms, 0.1) and low.clipped_fraction > 0.9
    assert set(p.clip_reweighting) == {"a", "b"} and all(0 < w <= 1 for w in p.clip_reweighting.values())
    assert p.lr_law["lr_at_b"] == pytest.approx(0.01 * (p.batch_size / 64) ** 0.5)
    assert dp_plan_for(_cfg()).clip == 1.0 and dp_plan_for(_cfg()).clip_from == "clip_reference"


def test_new_fields_are_validated_with_the_field_named():
    with pytest.raises(ValidationError) as e:
        DPConfig(epsilon=1, epochs=1, batch_rule="sigma", clip_quantile=1.0)
    fields = {err["loc"][0] for err in e.value.errors()}
    assert fields == {"batch_rule", "clip_quantile"}
    assert "predicted-loss" in str(e.value) and "noise" in str(e.value)


def test_old_dp_plans_still_load():
    from hptransfer.plan import load_plan

    path = ROOT / "tests" / "data" / "old_plans" / "dp.yaml"
    old = load_plan(path)
    plan = DPPlan.model_validate(old.dp)
    assert plan.batch_rule == "noise" and plan.predictions == [] and plan.clip_from == "clip_reference"
    assert plan.clip == yaml.safe_load(path.read_text())["dp"]["clip"]
    assert DPConfig.model_validate(old.dp["config"]).batch_rule == "predicted-loss"  # the config's default


def test_the_dp_sweep_table_feeds_the_plan():
    from hptransfer.dp.plan import evidence_from_sweep

    truth = _model(8.5, 1.3, 5e4)
    cfg = _cfg(batch_sizes=[16, 64, 256])
    rows = []
    for eps in (math.inf, 2.0):
        for r in dp_plan_for(cfg).table:
            sigma = 0.0 if math.isinf(eps) else r.sigma
            loss = truth.predict(r.steps, noise_ratio(sigma, r.steps, cfg.epochs, 2048))
            for lr in (0.01, 0.03):
                bad = abs(math.log(lr / (0.01 * (r.batch_size / 16) ** 0.5)))  # best LR ∝ √B
                rows.append(
                    dict(
                        epsilon=eps,
                        batch_size=r.batch_size,
                        clip=1.0,
                        lr=lr,
                        seed=0,
                        sigma=sigma,
                        steps=r.steps,
                        val_loss=loss + bad,
                        status="ok",
                    )
                )
    ev = evidence_from_sweep(pd.DataFrame(rows), cfg)
    assert ev.loss_model is not None and ev.loss_model.n_points == 6 and "3 noise-free" in ev.source
    # The best grid LR per B (0.01 or 0.03, the nearer to 0.01·√(B/16) in log): 0.01 at B=16, 0.03 at
    # 64 and 256 — so the least-squares log-log slope is ln 3 / ln 16 (the B are ×4 apart), about
    # the rows' √B though only two LRs were tried, at B_ref = 64 (their geometric middle).
    assert ev.lr_law is not None
    beta, lr_ref, b_ref = ev.lr_law
    assert beta == pytest.approx(math.log(3) / math.log(16), rel=1e-9) and b_ref == 64
    assert lr_ref == pytest.approx((0.01 * 0.03 * 0.03) ** (1 / 3), rel=1e-9)
    assert dp_plan_for(cfg, ev).batch_rule == "predicted-loss"
    assert evidence_from_sweep(pd.DataFrame(rows[:2]), cfg).loss_model is None  # too thin to fit: no model


def test_the_noise_free_arm_is_the_same_run_without_noise():

    from hptransfer.dp.lm_task import run_dp_lm_finetune
    from hptransfer.dp.sweep import sweep_points
    from hptransfer.spec import load_spec

    spec = load_spec(ROOT / "tests" / "data" / "dp_from_scratch.yaml")
    pts = sweep_points(spec, [math.inf], 4096)  # no accountant: σ = 0
    assert {p["batch_size"] for p in pts} == set(spec.dp.batch_sizes)
    assert all(
        p["sigma"] == 0.0 and p["epsilon"] == math.inf and p["steps"] == math.ceil(4 * 4096 / p["batch_size"]) for p in pts
    )
    task = _tiny_lm_task()
    m = run_dp_lm_finetune(task, epsilon=math.inf, delta=1e-5, epochs=1, batch_size=16, clip=1.0, lr=0.01)
    assert m["sigma"] == 0.0 and m["dp/epsilon"] == math.inf and m["steps"] == 4
    assert m["val_loss"] < m["initial_val_loss"]  # it trains (on its own training sequences' first 8)
    # Against the private run of the same seed: the same model, the same Poisson batches, the same
    # clipping; only the noise differs (Opacus draws it from another generator than the sampler's).
    import torch
    from torch.utils.data import TensorDataset

    from hptransfer.dp.train import train_dp

    def run(sigma: float, eps: float, clip: float = 1.0):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        res = train_dp(
            model, TensorDataset(x, y), batch_size=16, steps=8, noise_multiplier=sigma, clip=clip, lr=0.05,
            target_epsilon=eps, delta=1e-5, accountant="rdp", seed=0,
        )  # fmt: skip
        return res, torch.cat([p.detach().flatten() for p in model.parameters()])

    free, w_free = run(0.0, math.inf)
    private, w_private = run(1.0, 50.0)
    again, w_again = run(0.0, math.inf)
    assert free.batch_sizes == private.batch_sizes and free.steps == private.steps == 8
    assert free.epsilon == math.inf and 0 < private.epsilon <= 50.0
    torch.testing.assert_close(w_again, w_free, rtol=0, atol=0)  # no noise drawn: the run repeats itself
    assert (w_private - w_free).abs().max() > 1e-3  # the private run's noise moved its weights
    _, w_tight = run(0.0, math.inf, clip=1e-3)
    assert (w_tight - w_free).abs().max() > 1e-4  # clipping at C is kept without the noise


def _tiny_lm_task():
    """64 random byte sequences for a width-16 µP byte MLP: a DP trial in a second."""
    import torch

    from hptransfer.dp.lm_task import LMTask
    from hptransfer.spec import ModelSpec

    seqs = torch.randint(0, 256, (64, 9), generator=torch.Generator().manual_seed(0))
    return LMTask(
        model=ModelSpec(family="mlp", depth=1, seq_len=8, parametrization="mup"),
        width=16,
        base_width=16,
        sequences=seqs,
        val=[(seqs[:8, :-1], seqs[:8, 1:])],
        fixed={"weight_decay": 0.0},
    )


def test_a_trial_uses_the_sigma_it_is_given_and_refuses_one_that_spends_more_than_epsilon():

    from hptransfer.dp.accounting import noise_multiplier
    from hptransfer.dp.lm_task import run_dp_lm_finetune
    from hptransfer.dp.train import PrivacyBudgetExceeded

    task = _tiny_lm_task()
    kw = {"epsilon": 4.0, "delta": 1e-4, "epochs": 1, "batch_size": 16, "clip": 1.0, "lr": 0.01, "accountant": "rdp"}
    own = noise_multiplier(4.0, 1e-4, 16 / 64, 4, "rdp")
    given = run_dp_lm_finetune(task, **kw, sigma=1.5 * own)  # more noise than needed: allowed, and used
    assert given["sigma"] == 1.5 * own and given["dp/epsilon"] < 4.0
    with pytest.raises(PrivacyBudgetExceeded, match="spends"):
        run_dp_lm_finetune(task, **kw, sigma=0.5 * own)


def test_the_transfer_rule_uses_the_dp_sweeps_evidence():
    from hptransfer.transfer.rules import RULES, Evidence, Target

    ev = Evidence(optima={32: {"lr": 3e-3}}, fixed={}, base_width=32, parametrization="mup")
    tgt = Target(width=64, steps=100, batch_size=16, proxy_steps=100, proxy_batch_size=16, dp=_cfg())
    plain = RULES["dp"](ev, tgt)
    assert plain.extras["dp"]["batch_rule"] == "noise" and plain.extras["dp"]["lr_source"] == "sweep"
    measured = DPEvidence(loss_model=_model(50.0, 1.0, 0.0), lr_law=(0.3, 0.01, 64), source="synthetic")
    res = RULES["dp"](ev, Target(**{**tgt.__dict__, "dp_evidence": measured}))
    d = res.extras["dp"]
    assert d["batch_rule"] == "predicted-loss" and res.target_batch_size == d["batch_size"] == 16
    assert d["lr_source"] == "dp-sweep" and res.hyperparameters["lr"] == pytest.approx(0.01 * (16 / 64) ** 0.3)


def test_per_example_gradient_norms_are_each_sequences_own_gradient():
    import torch

    from hptransfer.dp.lm_task import LMTask, lm_loss, per_example_grad_norms
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.models import training_setup
    from hptransfer.spec import ModelSpec

    seqs = torch.randint(0, 256, (4, 9), generator=torch.Generator().manual_seed(0))
    spec = ModelSpec(family="mlp", depth=1, seq_len=8, parametrization="mup")
    task = LMTask(model=spec, width=16, base_width=16, sequences=seqs, val=[], fixed={"weight_decay": 0.0})
    norms = per_example_grad_norms(task, seqs)
    # The same model, one sequence at a time, plain autograd.
    model = training_setup(
        spec, 16, base_width=16, hps=Hyperparameters.of({"weight_decay": 0.0}, {"lr": 1.0}), total_steps=1, seed=0, rule="dp"
    ).model
    for i, got in enumerate(norms):
        model.zero_grad()
        lm_loss(model(seqs[i : i + 1, :-1]), seqs[i : i + 1, 1:]).backward()
        want = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None))
        assert got == pytest.approx(want, rel=1e-4)
