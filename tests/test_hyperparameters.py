"""Every tunable hyperparameter reaches the model: changing one changes what a sweep trial trains and
what the large run trains (inside a real Ray Train worker with DeepSpeed), not just a plan's text."""

from __future__ import annotations

import math

import pytest
import torch

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
    for bad in ({"lr": 0}, {"beta1": 1.0}, {"grad_clip": -1}, {"lr": math.nan}, {"init_std": math.inf}, {"lrr": 1}):
        with pytest.raises(Exception):
            Hyperparameters.of(bad)


SPEC = tiny_spec_dict(
    model={"family": "llama", "head_dim": 8, "seq_len": 16, "depth": 1, "parametrization": "mup"},
    sweep={"widths": [16, 32], "grid": {"lr": [0.01]}, "steps": 4, "batch_size": 4},
    data={"max_files": 20, "eval_batches": 1},
)


@pytest.mark.parametrize("name", sorted(TUNABLE))
def test_changing_a_tunable_changes_the_trained_sweep_trial(name):
    from hptransfer.sweep.trial import train_proxy, trial_hps

    spec = parse_spec(SPEC)
    base = trial_hps(spec, {"lr": 0.01})
    changed = trial_hps(
        spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"fixed": {name: CHANGED[name]}})}),
        {"lr": CHANGED["lr"] if name == "lr" else 0.01},
    )
    assert getattr(changed, name) == CHANGED[name]
    a = train_proxy(spec, 32, base, seed=0, n_reports=1)
    b = train_proxy(spec, 32, changed, seed=0, n_reports=1)
    assert a["status"] == b["status"] == "ok"
    assert a["train_loss"] != b["train_loss"] and a["val_loss"] != b["val_loss"], (name, a, b)


@pytest.mark.slow
def test_changing_a_tunable_changes_the_large_run(ray_local, tmp_path):
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from hptransfer.plan import TargetShape, TransferPlan

    spec = parse_spec(SPEC)

    # Defined here so Ray pickles it by value (a test module is not importable in a worker).
    def _large_run_weights(config: dict) -> None:
        """Inside a Ray Train worker: build each plan's engine exactly as the large run does, take 3 steps
        on the large run's data, save the flat weights."""
        from pathlib import Path

        from hptransfer.data import load_corpus
        from hptransfer.plan import TransferPlan
        from hptransfer.train.plain import build_engine, train_step

        for name, plan_dict in config["plans"].items():
            plan = TransferPlan.model_validate(plan_dict)
            engine, ds_cfg, _ = build_engine(plan, 1)
            corpus = load_corpus(plan.data.val_fraction, plan.data.max_files)
            for step in range(1, 4):
                x, y = corpus.batch("train", step, plan.target.batch_size, plan.target.seq_len, seed=plan.seed)
                train_step(engine, x, y, ds_cfg["train_micro_batch_size_per_gpu"])
            flat = torch.cat([p.detach().flatten().float() for p in engine.module.parameters()])
            torch.save(flat, Path(config["out"]) / f"{name}.pt")

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
    TorchTrainer(
        _large_run_weights,
        train_loop_config={"plans": plans, "out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
    ).fit()
    ref = torch.load(tmp_path / "default.pt")
    for name in CHANGED:
        got = torch.load(tmp_path / f"{name}.pt")
        assert got.shape == ref.shape
        assert (got - ref).abs().max() > 1e-6, f"{name} did not change the large run's weights"


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
