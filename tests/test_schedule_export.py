"""The exported schedules give hptransfer's LR at every optimizer step. HF: `TrainingArguments` from
the exported JSON, then the real scheduler as `Trainer.create_scheduler` builds it. DeepSpeed:
`WarmupCosineLR` from the exported config, stepped after each optimizer step as DeepSpeed's engine
does (`_take_model_step`); it cannot express our warmup at a few steps, which the export documents
(`deepspeed_inexact_steps`) and this test pins down."""

import json
import math

import pytest
import torch

from hptransfer.models.optim import lr_schedule
from hptransfer.plan import TargetShape, TransferPlan
from hptransfer.spec import parse_spec
from hptransfer.transfer.exports import (
    deepspeed_config,
    deepspeed_inexact_steps,
    hf_training_args,
    validate_deepspeed,
    validate_hf,
)

from conftest import tiny_spec_dict

# (target steps, warmup_steps): no warmup, the 1-step edge, short and long warmups, a fractional
# warmup (rounded the same way everywhere), warmup = steps, warmup > steps.
CASES = [(20, 0), (50, 0), (20, 1), (20, 2), (20, 5), (50, 5), (50, 12.6), (10, 10), (6, 8)]
PEAK = 3e-3


def _plan(steps: int, warmup: float) -> TransferPlan:
    spec = parse_spec(tiny_spec_dict())
    return TransferPlan(
        study="schedule",
        rule="mup",
        model=spec.model,
        base_width=16,
        target=TargetShape(width=64, steps=steps, batch_size=8, seq_len=16),
        hyperparameters={"lr": PEAK, "warmup_steps": warmup},
        data=spec.data,
        train=spec.train,
    )


def _dummy_optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _lr_per_step(opt: torch.optim.Optimizer, scheduler, steps: int) -> list[float]:
    """The LR each optimizer step runs at, with the scheduler stepped after it (HF Trainer, DeepSpeed)."""
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return out


def _ours(plan: TransferPlan) -> list[float]:
    """What the large run applies (LambdaLR over lr_schedule; sp-warmup's factor aside)."""
    return [plan.hps.lr * lr_schedule(s, plan.target.steps, plan.hps.warmup_steps) for s in range(plan.target.steps)]


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-18)


@pytest.mark.parametrize(("steps", "warmup"), CASES)
def test_lr_schedule_is_transformers_cosine_with_min_lr(steps, warmup):
    from transformers.optimization import _get_cosine_schedule_with_warmup_lr_lambda as hf

    w = round(warmup)
    for s in range(steps + 1):
        assert lr_schedule(s, steps, warmup, 0.1) == hf(
            s, num_warmup_steps=w, num_training_steps=steps, num_cycles=0.5, min_lr_rate=0.1
        ), s
    assert lr_schedule(0, steps, warmup) == (0.0 if w else 1.0)  # the library's warmup: s/w, not (s+1)/w
    assert lr_schedule(steps + 5, steps, warmup) == pytest.approx(0.1)  # past the end: the floor (HF rises again)


@pytest.mark.parametrize(("steps", "warmup"), CASES)
def test_hf_export_gives_our_lr_at_every_step(steps, warmup, tmp_path):
    from transformers import TrainingArguments, get_scheduler

    plan = _plan(steps, warmup)
    kwargs = json.loads(json.dumps(hf_training_args(plan, output_dir=str(tmp_path))))
    validate_hf(kwargs)
    args = TrainingArguments(**kwargs)
    opt = _dummy_optimizer(args.learning_rate)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        opt,
        num_warmup_steps=args.get_warmup_steps(args.max_steps),
        num_training_steps=args.max_steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    got, ours = _lr_per_step(opt, scheduler, steps), _ours(plan)
    assert [s for s in range(steps) if not _same(got[s], ours[s])] == [], list(zip(got, ours))


@pytest.mark.parametrize(("steps", "warmup"), CASES)
def test_deepspeed_export_gives_our_lr_except_the_documented_warmup_steps(steps, warmup):
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    plan = _plan(steps, warmup)
    cfg = json.loads(json.dumps(deepspeed_config(plan)))
    validate_deepspeed(cfg)
    opt = _dummy_optimizer(cfg["optimizer"]["params"]["lr"])
    scheduler = WarmupCosineLR(opt, **cfg["scheduler"]["params"])
    got, ours = _lr_per_step(opt, scheduler, steps), _ours(plan)
    w = round(warmup)
    documented = [s for s in deepspeed_inexact_steps(w) if s < steps]
    assert [s for s in range(steps) if not _same(got[s], ours[s])] == documented, list(zip(got, ours))
    if w == 0:
        assert documented == []  # exact at every step
    elif w == 1:
        assert documented == [0] and got[0] == PEAK  # DeepSpeed takes step 0 at the peak, we at 0
    else:
        # Only warmup steps 2..w, where DeepSpeed runs lower by (s − 1)/w² of the peak.
        assert all(ours[s] - got[s] == pytest.approx(PEAK * (s - 1) / w**2) for s in documented)
    assert ("lr_schedule_note" in cfg["hptransfer"]) == bool(deepspeed_inexact_steps(w))
