"""Handoff files from a plan: a DeepSpeed config, Hugging Face `TrainingArguments`, a torchtitan TOML.

Each export maps the plan's optimizer and schedule (AdamW; linear warmup then cosine to 10% of the
peak — `hptransfer.models.optim.lr_schedule`) onto the target framework's own names, and is checked
with that framework's own code before it is written: `DeepSpeedConfig` plus DeepSpeed's
`WarmupCosineLR`, `TrainingArguments(**json)`. torchtitan is not installed here; its TOML is
checked against the field names of torchtitan's `JobConfig` (torchtitan/config/job_config.py) and
parsed back with `tomllib`.

What a flat optimizer config cannot say — µP's per-group multipliers, sp-warmup's multiplicative
warmup — is returned as `caveats` (printed by `hpt export`) and kept in the file where the format
allows (DeepSpeed ignores an extra top-level `hptransfer` block; TOML gets comments).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import tomllib

from hptransfer.io import write_atomic, write_json
from hptransfer.models.optim import ADAM_EPS, FINAL_LR_FRACTION
from hptransfer.plan import TransferPlan

FORMATS = ("deepspeed", "hf", "torchtitan")


def _hp(plan: TransferPlan, name: str) -> float:
    """The plan's value, or the one default every stage uses (`Hyperparameters`)."""
    return float(getattr(plan.hps, name))


def _warmup(plan: TransferPlan) -> int:
    return round(_hp(plan, "warmup_steps"))


def caveats(plan: TransferPlan) -> list[str]:
    """What the exported optimizer settings do not carry by themselves."""
    out = []
    mults = plan.param_group_multipliers
    if any(abs(v - 1.0) > 1e-12 for g in mults.values() for v in g.values()):
        out.append(
            "per-parameter-group multipliers (µP) must be applied by the trainer: `hpt handoff PLAN --out DIR` writes "
            "the step-0 model with µP folded in and optimizer.json with per-parameter lr/weight_decay/eps groups any "
            f"trainer can apply (or build the model with `mup` and use MuAdamW): {json.dumps(mults)}"
        )
    if plan.schedule and plan.schedule.get("kind") == "sp-warmup" and plan.schedule.get("m", 1) > 1:
        s = plan.schedule
        out.append(
            f"multiply the LR schedule by the sp-warmup factor s_t = (1 + (m²−1)·exp(−2t/τ))^−1/2 with "
            f"m={s['m']:g}, τ={s['timescale']:.4g} steps (hptransfer.transfer.schedule.warmup_multiplier)"
        )
    if plan.target.batch_size % plan.train.workers:
        out.append(f"target batch {plan.target.batch_size} is not divisible by {plan.train.workers} workers")
    return out


# --- DeepSpeed ------------------------------------------------------------------------------------


def deepspeed_warmup_cosine(total: int, warmup: int, final_frac: float) -> dict[str, Any]:
    """`WarmupCosineLR` parameters giving `lr_schedule(s, total, warmup, final_frac)` (= HF's
    `cosine_with_min_lr`) at optimizer step s, except at `deepspeed_inexact_steps(warmup)`.

    DeepSpeed's engine steps its scheduler after each optimizer step, so step s runs at ratio(s − 1)
    (deepspeed/runtime/lr_schedules.py), where with W = max(2, warmup_num_steps), m = warmup_min_ratio
    and i = last_batch_iteration: ratio(i < 0) = 0; ratio(i < W) = m + (1 − m)·i/W;
    ratio(i ≥ W) = f + (1 − f)·(1 + cos(π·min(1, (i − W + 1)/(total_num_steps − W))))/2.
    A constructor argument `last_batch_iteration = k ≥ 0` leaves step 0 at the optimizer's LR (the
    peak) and runs step s ≥ 1 at ratio(k + s).

    - w = 0: k = 1, W = 2, total + 2 → step 0 at the peak, step s ≥ 1 at progress s/total. Exact.
    - w = 1: k = 0, W = 2, m = 1, total + 1 → step 1 at the peak, s ≥ 2 at (s − 1)/(total − 1);
      step 0 runs at the peak where ours runs at 0.
    - w ≥ 2: W = w, m = 1/w, total → step 0 at 0, step 1 at 1/w, steps s ≥ w + 1 exact. DeepSpeed's
      cosine numerator i − W + 1 forces W = w, and its linear warmup then reaches 1 only at i = W,
      one step after ours: steps 2..w run at (1/w + (1 − 1/w)(s − 1)/w) of the peak instead of s/w,
      lower by (s − 1)/w² (at most ≈ 1/w, at step w). No WarmupCosineLR setting matches them all."""
    base = {"warmup_type": "linear", "cos_min_ratio": final_frac}
    if warmup == 0:
        return {**base, "total_num_steps": total + 2, "warmup_num_steps": 2, "warmup_min_ratio": 1.0, "last_batch_iteration": 1}
    if warmup == 1:
        return {**base, "total_num_steps": total + 1, "warmup_num_steps": 2, "warmup_min_ratio": 1.0, "last_batch_iteration": 0}
    return {**base, "total_num_steps": total, "warmup_num_steps": warmup, "warmup_min_ratio": 1.0 / warmup}


def deepspeed_inexact_steps(warmup: int) -> list[int]:
    """Optimizer steps (0-based) where `deepspeed_warmup_cosine` cannot give `lr_schedule`'s LR."""
    return [0] if warmup == 1 else list(range(2, warmup + 1))


def _deepspeed_schedule_note(warmup: int) -> str:
    steps = deepspeed_inexact_steps(warmup)
    which = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}..{steps[-1]}"
    return (
        f"WarmupCosineLR matches hptransfer's lr_schedule (= HF cosine_with_min_lr) at every optimizer step "
        f"except {which} (0-based), which DeepSpeed's warmup cannot express "
        "(hptransfer.transfer.exports.deepspeed_warmup_cosine); for an exact match pass "
        "lr_scheduler=LambdaLR(opt, lr_schedule) to deepspeed.initialize and drop `scheduler`"
    )


def deepspeed_config(plan: TransferPlan) -> dict[str, Any]:
    """A DeepSpeed config. Only `train_batch_size` and accumulation 1 are given, so DeepSpeed derives
    the micro batch from the world size at launch (train = micro × accumulation × world)."""
    warm = _warmup(plan)
    cpu = plan.train.gpus_per_worker == 0
    return {
        "train_batch_size": plan.target.batch_size,
        "gradient_accumulation_steps": 1,
        "steps_per_print": plan.train.eval_every,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": _hp(plan, "lr"),
                "betas": [_hp(plan, "beta1"), _hp(plan, "beta2")],
                "eps": ADAM_EPS,
                "weight_decay": _hp(plan, "weight_decay"),
                # On CPU, torch's AdamW avoids DeepSpeed JIT-compiling fused_adam (~40 s).
                **({"torch_adam": True} if cpu else {}),
            },
        },
        "scheduler": {"type": "WarmupCosineLR", "params": deepspeed_warmup_cosine(plan.target.steps, warm, FINAL_LR_FRACTION)},
        "gradient_clipping": _hp(plan, "grad_clip"),  # sweep trials do not clip
        "zero_optimization": {"stage": plan.train.zero_stage},
        "bf16": {"enabled": plan.train.precision == "bf16"},  # the large run's own precision
        "hptransfer": {
            "study": plan.study,
            "rule": plan.rule,
            "param_group_multipliers": plan.param_group_multipliers,
            "schedule": plan.schedule,
            **({"lr_schedule_note": _deepspeed_schedule_note(warm)} if deepspeed_inexact_steps(warm) else {}),
        },
    }


def validate_deepspeed(cfg: dict[str, Any]) -> None:
    """DeepSpeed's own parser (no process group needed) and its scheduler class on a dummy optimizer."""
    import torch
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    DeepSpeedConfig(json.loads(json.dumps(cfg)))
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg["optimizer"]["params"]["lr"])
    WarmupCosineLR(opt, **cfg["scheduler"]["params"])


# --- Hugging Face ---------------------------------------------------------------------------------


def hf_training_args(plan: TransferPlan, output_dir: str = "outputs") -> dict[str, Any]:
    """Keyword arguments of `transformers.TrainingArguments`."""
    per_device = max(1, plan.target.batch_size // plan.train.workers)
    return {
        "output_dir": output_dir,
        "learning_rate": _hp(plan, "lr"),
        "weight_decay": _hp(plan, "weight_decay"),
        "adam_beta1": _hp(plan, "beta1"),
        "adam_beta2": _hp(plan, "beta2"),
        "adam_epsilon": ADAM_EPS,
        "optim": "adamw_torch",
        "max_steps": plan.target.steps,
        "warmup_steps": _warmup(plan),
        "lr_scheduler_type": "cosine_with_min_lr",  # lr_schedule is this scheduler's formula, step for step
        "lr_scheduler_kwargs": {"min_lr_rate": FINAL_LR_FRACTION},
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": 1,
        "max_grad_norm": _hp(plan, "grad_clip"),  # sweep trials do not clip; clipping moves the optimum
        "seed": plan.seed,
        "bf16": plan.train.precision == "bf16",
        "logging_steps": plan.train.eval_every,
        "report_to": "none",
    }


def validate_hf(kwargs: dict[str, Any]) -> None:
    from transformers import TrainingArguments

    TrainingArguments(**json.loads(json.dumps(kwargs)))


# --- torchtitan -----------------------------------------------------------------------------------

# The JobConfig fields we write, by section (torchtitan/config/job_config.py).
TORCHTITAN_FIELDS = {
    "job": {"dump_folder", "description"},
    "model": {"name", "flavor"},
    "optimizer": {"name", "lr", "beta1", "beta2", "eps", "weight_decay"},
    "lr_scheduler": {"warmup_steps", "decay_ratio", "decay_type", "lr_min"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "steps", "seed", "max_norm"},
}


def torchtitan_config(plan: TransferPlan) -> dict[str, dict[str, Any]]:
    return {
        "job": {"dump_folder": "./outputs", "description": f"hptransfer plan {plan.study} (rule {plan.rule})"},
        "model": {"name": "llama3", "flavor": f"hptransfer_{plan.study}"},
        "optimizer": {
            "name": "AdamW",
            "lr": _hp(plan, "lr"),
            "beta1": _hp(plan, "beta1"),
            "beta2": _hp(plan, "beta2"),
            "eps": ADAM_EPS,
            "weight_decay": _hp(plan, "weight_decay"),
        },
        "lr_scheduler": {"warmup_steps": _warmup(plan), "decay_type": "cosine", "lr_min": FINAL_LR_FRACTION},
        "training": {
            "local_batch_size": max(1, plan.target.batch_size // plan.train.workers),
            "global_batch_size": plan.target.batch_size,
            "seq_len": plan.target.seq_len,
            "steps": plan.target.steps,
            "seed": plan.seed,
            "max_norm": _hp(plan, "grad_clip"),
        },
    }


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"TOML export: non-finite value {v}")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    raise TypeError(f"TOML export: unsupported value {v!r}")


def torchtitan_toml(plan: TransferPlan) -> str:
    cfg = torchtitan_config(plan)
    m = plan.model
    lines = [
        f"# torchtitan config from hptransfer plan `{plan.study}` (rule {plan.rule}).",
        f"# Register model flavor {cfg['model']['flavor']!r}: dim={plan.target.width}, n_layers={m.depth}, "
        f"n_heads={plan.target.width // m.head_dim}, ffn={int(round(m.ffn_mult * plan.target.width))}, vocab=256.",
    ]
    lines += [f"# NOTE: {c}" for c in caveats(plan)]
    for section, kv in cfg.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in kv.items()]
    return "\n".join(lines) + "\n"


def validate_torchtitan(text: str) -> None:
    data = tomllib.loads(text)
    unknown = {f"{s}.{k}" for s, kv in data.items() for k in kv if k not in TORCHTITAN_FIELDS.get(s, ())}
    if unknown:
        raise ValueError(f"fields unknown to torchtitan's JobConfig: {sorted(unknown)}")


# --- one entry point ------------------------------------------------------------------------------

SUFFIXES = {"deepspeed": "deepspeed.json", "hf": "hf_training_args.json", "torchtitan": "torchtitan.toml"}


def default_out(plan_path: str | Path, to: str) -> Path:
    """transfer_plan.yaml → transfer_plan.deepspeed.json (etc.) beside it."""
    return Path(f"{Path(plan_path).with_suffix('')}.{SUFFIXES[to]}")


def export_plan(plan: TransferPlan, to: str, out: str | Path) -> Path:
    """Build, validate with the framework's own code, then write atomically."""
    if to not in FORMATS:
        raise ValueError(f"unknown export format {to!r}; choose one of {list(FORMATS)}")
    if to == "deepspeed":
        cfg = deepspeed_config(plan)
        validate_deepspeed(cfg)
        return write_json(out, cfg)
    if to == "hf":
        kw = hf_training_args(plan, output_dir=str(Path(out).parent / "hf_outputs"))
        validate_hf(kw)
        return write_json(out, kw)
    text = torchtitan_toml(plan)
    validate_torchtitan(text)
    return write_atomic(out, text)
