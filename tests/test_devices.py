"""Devices and precision (issue 13): trials and the large run compute where their model is, batches and
evaluation follow it, bf16 autocast works in a trial (on the CPU too), the plan records the sweep's
precision and a large run in another one is warned. On a CPU box the device is checked with a model
on the `meta` device: a pre-hook sees where the first batch landed, then stops the run."""

from __future__ import annotations

import math

import pytest
import torch

from hptransfer.hyperparameters import Hyperparameters
from hptransfer.spec import parse_spec, spec_hash, sweep_hash
from hptransfer.sweep.trial import train_proxy

from conftest import tiny_spec_dict

HPS = Hyperparameters(lr=1e-2, warmup_steps=2)


def _spec(**sweep):
    return parse_spec(tiny_spec_dict(sweep={"steps": 4, **sweep}))


class _Seen(Exception):
    """Raised by the pre-hook once it has seen the first forward's input and parameter devices."""


def _first_forward_devices():
    """A global forward pre-hook: at the first module call, raise _Seen(input device, param device)."""

    def hook(module, args):
        x = next(a for a in args if isinstance(a, torch.Tensor))
        raise _Seen(x.device, next(module.parameters()).device)

    return torch.nn.modules.module.register_module_forward_pre_hook(hook)


def test_a_bf16_trial_computes_in_bf16_under_autocast_on_the_cpu():
    dtypes: dict[str, set] = {"fp32": set(), "bf16": set()}
    results = {}
    for precision in ("fp32", "bf16"):
        seen = dtypes[precision]
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, a, out, seen=seen: seen.add(out.dtype) if isinstance(m, torch.nn.Linear) else None
        )
        try:
            results[precision] = train_proxy(_spec(precision=precision), 16, HPS, seed=0, n_reports=1)
        finally:
            handle.remove()
    assert dtypes == {"fp32": {torch.float32}, "bf16": {torch.bfloat16}}
    fp32, bf16 = results["fp32"], results["bf16"]
    assert bf16["status"] == "ok" and math.isfinite(bf16["train_loss"]) and math.isfinite(bf16["val_loss"])
    assert bf16["train_loss"] != fp32["train_loss"]  # bf16 rounding shows, a little
    assert bf16["val_loss"] == pytest.approx(fp32["val_loss"], rel=0.02)


def test_a_trial_puts_its_model_and_batches_on_its_device():
    handle = _first_forward_devices()
    try:
        with pytest.raises(_Seen) as seen:
            train_proxy(_spec(), 16, HPS, seed=0, n_reports=1, device=torch.device("meta"))
    finally:
        handle.remove()
    assert seen.value.args == (torch.device("meta"), torch.device("meta"))


def test_evaluation_moves_batches_to_the_models_device():
    from hptransfer.models import build_model, evaluate

    spec = _spec()
    model = build_model(spec.model, 16, base_width=16, seed=0).to("meta")
    batches = [(torch.zeros(2, 16, dtype=torch.long), torch.zeros(2, 16, dtype=torch.long))]
    handle = _first_forward_devices()
    try:
        with pytest.raises(_Seen) as seen:
            evaluate(model, batches)
    finally:
        handle.remove()
    assert seen.value.args == (torch.device("meta"), torch.device("meta"))


def test_the_plan_records_the_sweeps_precision_and_the_large_run_warns_on_another():
    from hptransfer.plan import parse_plan, precision_mismatch
    from hptransfer.transfer.engine import make_plan, standalone_spec
    from hptransfer.transfer.synthetic import synthetic_sweep

    df = synthetic_sweep([32, 64], [1e-3, 3e-3, 1e-2, 3e-2])
    base = standalone_spec(df, rule="mup", target_width=256, model={"family": "mlp"})
    spec = base.model_copy(update={"sweep": base.sweep.model_copy(update={"precision": "bf16"})})
    assert make_plan(base, df).sweep_precision == "fp32"
    plan = make_plan(spec, df)
    assert plan.sweep_precision == "bf16" and plan.train.precision == "fp32"
    assert parse_plan(plan.model_dump(mode="json")).sweep_precision == "bf16"  # round trip

    assert precision_mismatch(plan.model_copy(update={"train": plan.train.model_copy(update={"precision": "bf16"})})) is None
    fp32_sweep = plan.model_copy(update={"sweep_precision": "fp32", "train": plan.train.model_copy(update={"precision": "bf16"})})
    assert precision_mismatch(fp32_sweep) == (
        "the sweep tuned in fp32 and the large run trains in bf16: the tuned LR may not carry over; "
        "set train.precision: fp32 or sweep.precision: bf16"
    )
    # A plan written before the field existed was tuned in fp32.
    old = {k: v for k, v in plan.model_dump(mode="json").items() if k != "sweep_precision"}
    assert parse_plan(old).sweep_precision == "fp32"


def test_precision_at_its_default_leaves_existing_hashes_alone():
    """Studies made before `precision` existed keep their spec and sweep hashes (results tables and
    trial markers carry them); a bf16 sweep is another sweep, a bf16 large run another spec."""
    plain = parse_spec(tiny_spec_dict())
    spelled = parse_spec(tiny_spec_dict(sweep={"precision": "fp32"}, train={"precision": "fp32"}))
    assert "precision" not in plain.model_dump_json(exclude={"sweep": {"precision"}, "train": {"precision"}})
    assert (spec_hash(plain), sweep_hash(plain)) == (spec_hash(spelled), sweep_hash(spelled))
    bf16_sweep = parse_spec(tiny_spec_dict(sweep={"precision": "bf16"}))
    bf16_train = parse_spec(tiny_spec_dict(train={"precision": "bf16"}))
    assert sweep_hash(bf16_sweep) != sweep_hash(plain)
    assert sweep_hash(bf16_train) == sweep_hash(plain) and spec_hash(bf16_train) != spec_hash(plain)


def test_exported_configs_follow_the_large_runs_precision():
    from hptransfer.transfer.engine import make_plan, standalone_spec
    from hptransfer.transfer.exports import deepspeed_config, hf_training_args
    from hptransfer.transfer.synthetic import synthetic_sweep

    df = synthetic_sweep([32, 64], [1e-3, 3e-3, 1e-2, 3e-2])
    plan = make_plan(standalone_spec(df, rule="mup", target_width=256, model={"family": "mlp"}), df)
    bf16 = plan.model_copy(update={"train": plan.train.model_copy(update={"precision": "bf16"})})
    assert deepspeed_config(plan)["bf16"]["enabled"] is False and hf_training_args(plan)["bf16"] is False
    assert deepspeed_config(bf16)["bf16"]["enabled"] is True and hf_training_args(bf16)["bf16"] is True
