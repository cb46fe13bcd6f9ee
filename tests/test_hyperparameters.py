"""Every tunable hyperparameter reaches the model: changing one changes what a sweep trial trains and
what the large run trains (inside a real Ray Train worker with DeepSpeed), not just a plan's text."""

from __future__ import annotations

import functools
import math
import sys

import pytest
import torch
from pydantic import ValidationError

from hptransfer.hyperparameters import APPLIED, DEFAULT_HPS, LOG_SCALE, TUNABLE, Hyperparameters
from hptransfer.spec import parse_spec

from conftest import tiny_spec_dict

# A value clearly different from the default for each tunable; grad_clip small enough to bind.
CHANGED = {
    "lr": 0.03,
    "weight_decay": 0.1,
    "warmup_steps": 3,
    "beta1": 0.5,
    "beta2": 0.9,
    "init_std": 0.05,
    "output_mult": 2.0,
    "grad_clip": 0.01,
}


def test_every_tunable_is_declared_once_with_scale_and_consumer():
    assert set(CHANGED) == TUNABLE  # a new tunable must be added to this test
    assert set(APPLIED.values()) <= {"optimizer", "init", "readout", "schedule", "clipping"}
    assert {"lr", "weight_decay", "init_std", "output_mult"} == LOG_SCALE
    assert Hyperparameters().as_dict() == DEFAULT_HPS
    for name, value in CHANGED.items():
        assert value != DEFAULT_HPS[name]


def test_out_of_range_hyperparameters_are_refused():
    cases = [
        ({"lr": 0}, "lr", "greater_than"),
        ({"beta1": 1.0}, "beta1", "less_than"),
        ({"grad_clip": -1}, "grad_clip", "greater_than_equal"),
        ({"lr": math.nan}, "lr", "finite_number"),
        ({"init_std": math.inf}, "init_std", "finite_number"),
        ({"lrr": 1}, "lrr", "extra_forbidden"),
    ]
    for bad, field, kind in cases:
        with pytest.raises(ValidationError) as e:
            Hyperparameters.of(bad)
        assert [(err["loc"], err["type"]) for err in e.value.errors()] == [((field,), kind)], bad
        assert field in str(e.value)


SPEC = tiny_spec_dict(
    model={"family": "llama", "head_dim": 8, "seq_len": 16, "depth": 1, "parametrization": "mup"},
    sweep={"widths": [16, 32], "grid": {"lr": [0.01]}, "steps": 4, "batch_size": 4},
    data={"max_files": 20, "eval_batches": 1},
)


def _snapshot_steps(model, optimizer, scheduler, step_fn, corpus, batch_size: int, seq_len: int, steps: int) -> dict:
    """Weights before and after each optimizer step, the LR of each step (per group), Adam's first
    moments (global L2 norm) and second moments (sum) after step 1, and the logits on a fixed batch
    after step 1. Any Adam (torch's, or DeepSpeed's ZeRO wrapper around it) and any model."""
    from hptransfer.models import lm_logits

    snap = lambda: {k: v.detach().float().cpu().clone() for k, v in model.named_parameters()}
    probe, _ = corpus.batch("val", 0, batch_size, seq_len, seed=0)
    out: dict = {"w": [snap()], "lr": []}
    for step in range(1, steps + 1):
        out["lr"].append(list(scheduler.get_last_lr()))
        step_fn(*corpus.batch("train", step, batch_size, seq_len, seed=0))
        out["w"].append(snap())
        if step == 1:
            adam = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed's ZeRO optimizer wraps the torch one
            states = [s for s in adam.state.values() if "exp_avg" in s]
            out["m1"] = math.sqrt(sum(float(s["exp_avg"].float().pow(2).sum()) for s in states))
            out["v1"] = sum(float(s["exp_avg_sq"].float().sum()) for s in states)
            with torch.no_grad():
                out["logits1"] = lm_logits(model, probe.to(next(model.parameters()).device)).float().cpu()
    return out


def _trial_steps(hps: Hyperparameters, steps: int = 2) -> dict:
    """`_snapshot_steps` of a width-32 trial as `train_proxy` trains it (training_setup, its clipping
    and schedule, the trial's batches)."""
    from hptransfer.data import open_corpus
    from hptransfer.models import lm_logits, training_setup
    from hptransfer.models.build import lm_loss

    spec = parse_spec(SPEC)
    run = training_setup(spec.model, 32, base_width=spec.base_width, hps=hps, total_steps=4, seed=0, rule="mup")
    sched = run.scheduler()

    def step(x, y):
        loss = lm_loss(lm_logits(run.model, x), y)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.clip_gradients()
        run.optimizer.step()
        sched.step()

    corpus = open_corpus(spec.data, seq_len=16)
    return _snapshot_steps(run.model, run.optimizer, sched, step, corpus, 4, 16, steps)


def _assert_the_predicted_change(name: str, base: dict, changed: dict) -> None:
    """Each tunable changes the first steps by the direction and size its `applied` predicts. From the
    same init, µP's zero readout means that step 1 only moves the readout (every other gradient is
    exactly 0), so the hidden weights' step-2 update is Adam's first non-zero one: m̂/√v̂ =
    √(1+β2)/(1+β1)·sign(g)."""
    old, new = DEFAULT_HPS[name], CHANGED[name]
    w0, names = base["w"][0], list(base["w"][0])
    matrices = {n for n in names if w0[n].ndim >= 2}
    delta = lambda run, k: {n: run["w"][k][n] - run["w"][k - 1][n] for n in names}
    b1, c1, b2, c2 = delta(base, 1), delta(changed, 1), delta(base, 2), delta(changed, 2)
    still_at_step_1 = [n for n in names if float(b1[n].abs().max()) == 0.0]
    assert still_at_step_1 and all(n != "lm_head.weight" for n in still_at_step_1), "µP's zero readout: only it moves at step 1"
    norm = lambda d: math.sqrt(sum(float(d[n].pow(2).sum()) for n in still_at_step_1))
    close = lambda a, b, **tol: torch.testing.assert_close(a, b, **({"rtol": 1e-4, "atol": 1e-9} | tol))
    if APPLIED[name] == "init":  # embeddings and hidden matrices drawn ×new/old; norms stay 1, the readout 0
        for n in names:
            close(changed["w"][0][n], w0[n] * (new / old if n in matrices else 1.0))
    elif APPLIED[name] == "readout":  # the logits ×new/old (step 1 leaves both at the same weights: Adam is scale-free)
        scale = float(base["logits1"].abs().max())  # up to Adam's ε, which ×new/old gradients see differently
        close(changed["logits1"], base["logits1"] * new / old, rtol=1e-3, atol=1e-3 * scale)
    elif name == "lr":  # the first Adam step ×new/old, in every parameter group
        for n in names:
            close(c1[n], b1[n] * new / old)
    elif name == "weight_decay":  # AdamW's decoupled decay: matrices shrink by lr·λ (µP: η/m·λm), the rest as before
        for n in names:
            close(c1[n], b1[n] - (DEFAULT_HPS["lr"] * new if n in matrices else 0.0) * w0[n], atol=1e-8)
    elif APPLIED[name] == "schedule":  # linear warmup over 3 steps: step 0 at 0 (nothing moves), step 1 at 1/3
        assert changed["lr"][0] == [0.0] * len(base["lr"][0]) and all(float(c1[n].abs().max()) == 0.0 for n in names)
        assert changed["lr"][1] == pytest.approx([lr / new for lr in base["lr"][0]])  # base: the peak at step 0
    elif name == "beta1":  # m1 = (1−β1)·g; bias correction keeps step 1; the hidden weights' first step ×(1+β1)/(1+β1')
        assert changed["m1"] == pytest.approx(base["m1"] * (1 - new) / (1 - old), rel=1e-5)
        for n in names:
            close(c1[n], b1[n])
        assert norm(c2) == pytest.approx(norm(b2) * (1 + old) / (1 + new), rel=1e-3)
    elif name == "beta2":  # v1 = (1−β2)·g²; the hidden weights' first step ×√((1+β2')/(1+β2))
        assert changed["v1"] == pytest.approx(base["v1"] * (1 - new) / (1 - old), rel=1e-5)
        assert norm(c2) == pytest.approx(norm(b2) * math.sqrt((1 + new) / (1 + old)), rel=1e-3)
    elif APPLIED[name] == "clipping":  # Adam sees gradients of global norm `grad_clip`: m1 = (1−β1)·grad_clip
        assert base["m1"] > 10 * (1 - DEFAULT_HPS["beta1"]) * new, "the bound must bind for this check"
        assert changed["m1"] == pytest.approx((1 - DEFAULT_HPS["beta1"]) * new, rel=1e-4)
    else:
        raise AssertionError(f"no predicted change for {name!r}: add one here")


@functools.cache
def _default_trial_steps() -> dict:
    return _trial_steps(Hyperparameters())


@pytest.mark.parametrize("name", sorted(TUNABLE))
def test_changing_a_tunable_changes_the_trained_sweep_trial(name):
    from hptransfer.sweep.trial import train_proxy, trial_hps

    spec = parse_spec(SPEC)
    base = trial_hps(spec, {"lr": 0.01})
    fixed = {**spec.sweep.fixed, name: CHANGED[name]}  # the spec's own fixed values kept: only `name` differs
    changed = trial_hps(spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"fixed": fixed})}), {"lr": 0.01})
    if name == "lr":
        changed = trial_hps(spec, {"lr": CHANGED["lr"]})
    assert {k for k, v in changed.as_dict().items() if v != base.as_dict()[k]} == {name}
    a = train_proxy(spec, 32, base, seed=0, n_reports=1)
    b = train_proxy(spec, 32, changed, seed=0, n_reports=1)
    assert a["status"] == b["status"] == "ok"
    assert a["train_loss"] != b["train_loss"] and a["val_loss"] != b["val_loss"], (name, a, b)
    # By the size and in the direction the field's `applied` predicts (training_setup, as the trial uses it).
    assert Hyperparameters().as_dict() == DEFAULT_HPS and DEFAULT_HPS["warmup_steps"] == 0
    _assert_the_predicted_change(name, _default_trial_steps(), _trial_steps(Hyperparameters(**{name: CHANGED[name]})))


@pytest.mark.slow
def test_changing_a_tunable_changes_the_large_run(ray_local, tmp_path):
    from ray import cloudpickle
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from hptransfer.plan import TargetShape, TransferPlan

    spec = parse_spec(SPEC)

    # Defined here so Ray pickles it by value (a test module is not importable in a worker); the
    # helper it calls travels by value too (register_pickle_by_value below).
    def _large_run_steps(config: dict) -> None:
        """Inside a Ray Train worker: build each plan's engine exactly as the large run does, take 3 steps
        on the large run's data, save the `_snapshot_steps` of them."""
        from pathlib import Path

        from hptransfer.data import load_corpus
        from hptransfer.plan import TransferPlan
        from hptransfer.train.plain import build_engine, train_step

        for name, plan_dict in config["plans"].items():
            plan = TransferPlan.model_validate(plan_dict)
            engine, ds_cfg, _ = build_engine(plan, 1)
            corpus = load_corpus(plan.data.val_fraction, plan.data.max_files)
            step = functools.partial(train_step, engine, micro=ds_cfg["train_micro_batch_size_per_gpu"])
            B, T = plan.target.batch_size, plan.target.seq_len
            out = _snapshot_steps(engine.module, engine.optimizer, engine.lr_scheduler, step, corpus, B, T, 3)
            torch.save(out, Path(config["out"]) / f"{name}.pt")

    def plan(hps: dict) -> dict:
        return TransferPlan(
            study="hps",
            rule="mup",
            model=spec.model,
            base_width=16,
            target=TargetShape(width=32, steps=10, batch_size=4, seq_len=16),
            hyperparameters={**DEFAULT_HPS, **hps},
            data=spec.data,
            train=spec.train.model_copy(update={"workers": 1, "zero_stage": 1}),
        ).model_dump(mode="json")

    plans = {"default": plan({}), **{name: plan({name: value}) for name, value in CHANGED.items()}}
    this_module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(this_module)
    try:
        TorchTrainer(
            _large_run_steps,
            train_loop_config={"plans": plans, "out": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
            torch_config=TorchConfig(backend="gloo"),
        ).fit()
    finally:
        cloudpickle.unregister_pickle_by_value(this_module)
    ref = torch.load(tmp_path / "default.pt")
    flat = lambda run: torch.cat([w.flatten() for w in run["w"][-1].values()])
    for name in CHANGED:
        got = torch.load(tmp_path / f"{name}.pt")
        assert flat(got).shape == flat(ref).shape
        assert (flat(got) - flat(ref)).abs().max() > 1e-6, f"{name} did not change the large run's weights"
        # by the size and in the direction its `applied` predicts, inside DeepSpeed as in a trial
        _assert_the_predicted_change(name, ref, got)


def test_mup_standard_weight_decay_is_a_real_optimizer_option():
    """Rule `mup-standard-wd` trains with λ unchanged on hidden matrices (MuAdamW's own form is λ·m)."""
    from hptransfer.models import training_setup

    spec = parse_spec(SPEC)
    hps = Hyperparameters(lr=0.01, weight_decay=0.1)
    groups = {}
    for rule in ("mup", "mup-standard-wd"):
        run = training_setup(spec.model, 64, base_width=16, hps=hps, total_steps=4, seed=0, rule=rule)
        groups[rule] = sorted((round(g["lr"], 9), round(g["weight_decay"], 9)) for g in run.optimizer.param_groups)
    assert (round(0.01 / 4, 9), round(0.1 * 4, 9)) in groups["mup"]  # independent: lr/m, λ·m
    assert (round(0.01 / 4, 9), 0.1) in groups["mup-standard-wd"]  # standard: lr/m, λ
    assert (round(0.01 / 4, 9), round(0.1 * 4, 9)) not in groups["mup-standard-wd"]
