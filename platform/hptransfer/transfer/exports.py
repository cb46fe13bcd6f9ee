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
import tomllib
from pathlib import Path
from typing import Any

from hptransfer.io import write_atomic, write_json
from hptransfer.transfer.plan import TransferPlan

FORMATS = ("deepspeed", "hf", "torchtitan")
FINAL_LR_FRACTION = 0.1  # lr_schedule's cosine floor (hptransfer.models.optim.lr_schedule)
ADAM_EPS = 1e-8  # build_optimizer's eps


def _hp(plan: TransferPlan, name: str, default: float) -> float:
    return float(plan.hyperparameters.get(name, default))


def _warmup(plan: TransferPlan) -> int:
    return int(round(_hp(plan, "warmup_steps", 0)))


def caveats(plan: TransferPlan) -> list[str]:
    """What the exported optimizer settings do not carry by themselves."""
    out = []
    mults = plan.param_group_multipliers
    if any(abs(v - 1.0) > 1e-12 for g in mults.values() for v in g.values()):
        out.append("per-parameter-group multipliers (µP) must be applied by the trainer: build the model with "
                   f"`mup` and use MuAdamW, or set per-group lr/weight_decay yourself: {json.dumps(mults)}")
    if plan.schedule and plan.schedule.get("kind") == "sp-warmup" and plan.schedule.get("m", 1) > 1:
        s = plan.schedule
        out.append(f"multiply the LR schedule by the sp-warmup factor s_t = (1 + (m²−1)·exp(−2t/τ))^−1/2 with "
                   f"m={s['m']:g}, τ={s['timescale']:.4g} steps (hptransfer.transfer.schedule.warmup_multiplier)")
    if plan.target.batch_size % plan.train.workers:
        out.append(f"target batch {plan.target.batch_size} is not divisible by {plan.train.workers} workers")
    return out


# --- DeepSpeed ------------------------------------------------------------------------------------

def deepspeed_config(plan: TransferPlan) -> dict[str, Any]:
    """A DeepSpeed config. Only `train_batch_size` and accumulation 1 are given, so DeepSpeed derives
    the micro batch from the world size at launch (train = micro × accumulation × world)."""
    warm = _warmup(plan)
    cpu = plan.train.gpus_per_worker == 0
    return {
        "train_batch_size": plan.target.batch_size,
        "gradient_accumulation_steps": 1,
        "steps_per_print": plan.train.eval_every,
        "optimizer": {"type": "AdamW", "params": {
            "lr": _hp(plan, "lr", 1e-2), "betas": [_hp(plan, "beta1", 0.9), _hp(plan, "beta2", 0.98)],
            "eps": ADAM_EPS, "weight_decay": _hp(plan, "weight_decay", 0.0),
            # On CPU, torch's AdamW avoids DeepSpeed JIT-compiling fused_adam (~40 s).
            **({"torch_adam": True} if cpu else {})}},
        "scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": plan.target.steps,
            # DeepSpeed requires ≥ 1 warmup step; with min ratio 1 that one step is at the peak.
            "warmup_num_steps": max(1, warm), "warmup_min_ratio": 0.0 if warm else 1.0,
            "warmup_type": "linear", "cos_min_ratio": FINAL_LR_FRACTION}},
        "gradient_clipping": _hp(plan, "grad_clip", 0.0),  # sweep trials do not clip
        "zero_optimization": {"stage": plan.train.zero_stage},
        "bf16": {"enabled": not cpu},
        "hptransfer": {"study": plan.study, "rule": plan.rule, "param_group_multipliers": plan.param_group_multipliers,
                       "schedule": plan.schedule},
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
        "learning_rate": _hp(plan, "lr", 1e-2),
        "weight_decay": _hp(plan, "weight_decay", 0.0),
        "adam_beta1": _hp(plan, "beta1", 0.9),
        "adam_beta2": _hp(plan, "beta2", 0.98),
        "adam_epsilon": ADAM_EPS,
        "optim": "adamw_torch",
        "max_steps": plan.target.steps,
        "warmup_steps": _warmup(plan),
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": FINAL_LR_FRACTION},
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": 1,
        "max_grad_norm": _hp(plan, "grad_clip", 0.0),  # sweep trials do not clip; clipping moves the optimum
        "seed": plan.seed,
        "bf16": plan.train.gpus_per_worker > 0,
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
        "optimizer": {"name": "AdamW", "lr": _hp(plan, "lr", 1e-2), "beta1": _hp(plan, "beta1", 0.9),
                      "beta2": _hp(plan, "beta2", 0.98), "eps": ADAM_EPS,
                      "weight_decay": _hp(plan, "weight_decay", 0.0)},
        "lr_scheduler": {"warmup_steps": _warmup(plan), "decay_type": "cosine", "lr_min": FINAL_LR_FRACTION},
        "training": {"local_batch_size": max(1, plan.target.batch_size // plan.train.workers),
                     "global_batch_size": plan.target.batch_size, "seq_len": plan.target.seq_len,
                     "steps": plan.target.steps, "seed": plan.seed, "max_norm": _hp(plan, "grad_clip", 0.0)},
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
    lines = [f"# torchtitan config from hptransfer plan `{plan.study}` (rule {plan.rule}).",
             f"# Register model flavor {cfg['model']['flavor']!r}: dim={plan.target.width}, n_layers={m.depth}, "
             f"n_heads={plan.target.width // m.head_dim}, ffn={int(round(m.ffn_mult * plan.target.width))}, vocab=256."]
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
