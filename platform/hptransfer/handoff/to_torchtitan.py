"""optimizer.json as a torchtitan 0.3 `config_registry` module, checked with torchtitan's ConfigManager,
llama3 model and OptimizersContainer."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from hptransfer.handoff.groups import OptimizerSpec
from hptransfer.handoff.param_names import (
    Mults,
    check_failed,
    cosine_factor,
    grouped,
    importable,
    mismatches,
    schedule_note,
    translate,
)
from hptransfer.handoff.semantics import check_semantics, one_param_module
from hptransfer.io import write_atomic

# HF Llama name → torchtitan llama3 name: torchtitan's own Llama3StateDictAdapter.from_hf_map
# (torchtitan 0.3), copied so the file can be written without torchtitan; the check compares them.
TT_FROM_HF = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.qkv_linear.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.qkv_linear.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.qkv_linear.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}
# torchtitan's fused QKV (its shipped flavors): one parameter, exposed as wq/wk/wv in the state dict.
TT_FUSED_QKV = "layers.{}.attention.qkv_linear.wqkv.weight"


def _torchtitan_model_args(config: Any, fuse_qkv: bool) -> tuple[dict[str, Any] | None, str | None]:
    """torchtitan llama3 dimensions for an HF Llama config, or why it has none."""
    if getattr(config, "model_type", None) != "llama":
        return None, f"model_type {getattr(config, 'model_type', None)!r} has no torchtitan llama3 counterpart"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return None, "the HF config has attention/MLP biases, torchtitan's llama3 has none"
    dim, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or dim // heads
    if head_dim != dim // heads:
        return None, f"head_dim {head_dim} != hidden_size / heads; torchtitan's llama3 builder derives it"
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    if rope_type not in ("default", "llama3"):
        return None, f"rope_type {rope_type!r} has no torchtitan ComplexRoPE scaling"
    args = {
        "dim": dim,
        "n_layers": config.num_hidden_layers,
        "n_heads": heads,
        "n_kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "hidden_dim": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "norm_eps": float(config.rms_norm_eps),
        "rope_theta": theta,
        "rope_scaling": "llama" if rope_type == "llama3" else "none",
        "rope_scaling_args": {
            k: rope[k] for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings") if k in rope
        },
        "max_seq_len": config.max_position_embeddings,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "fuse_qkv": fuse_qkv,
    }
    return args, None


def torchtitan_values(values: dict[str, Mults]) -> tuple[dict[str, Mults], bool]:
    """optimizer.json's per-parameter values on torchtitan llama3 parameter names, and whether q/k/v
    can share torchtitan's fused wqkv (only where every layer's q, k and v agree)."""
    table = {k: (v,) for k, v in TT_FROM_HF.items()}
    tt, _ = translate(values, table)
    fused = {k: (TT_FUSED_QKV,) if ".qkv_linear.w" in v else (v,) for k, v in TT_FROM_HF.items()}
    tt_fused, conflicts = translate(values, fused)
    return (tt, False) if conflicts else (tt_fused, True)


def torchtitan_source(spec: OptimizerSpec, values: dict[str, Mults], model: dict[str, Any] | None, caveats: list[str]) -> str:
    """The config_registry module's text."""
    groups = [
        ("^" + "|".join(re.escape(n).replace("__N__", r"\d+") for n in names) + "$", *v) for names, v in grouped(values, "__N__")
    ]
    s = spec.schedule
    table = ",\n".join(f"    ({p!r}, {lr!r}, {wd!r}, {eps!r})" for p, lr, wd, eps in groups)
    head = "\n".join(f"- {c}" for c in caveats) or "- none"
    params = {
        "BETAS": tuple(spec.betas),
        "MAX_NORM": spec.grad_clip if spec.grad_clip > 0 else "inf",
        "WARMUP_STEPS": s.warmup_steps,
        "TOTAL_STEPS": s.total_steps,
        "MIN_LR_FACTOR": s.min_lr_rate,
    }
    consts = "\n".join(
        f"{k} = {v!r}" if v != "inf" else f'{k} = float("inf")  # grad_clip 0: torchtitan always clips' for k, v in params.items()
    )
    src = f'''"""torchtitan 0.3 config for an hptransfer hand-off (generated by `hpt handoff`).

    PYTHONPATH=DIR/trainers/torchtitan torchrun --nproc_per_node=N -m torchtitan.train \\
        --module hpt_handoff_config --config hpt_handoff

The µP (or SP) parametrization is in DIR/model (step-0 weights, loaded in HF format) and in
PARAM_GROUPS below: optimizer.json's groups on torchtitan's parameter names (torchtitan's
Llama3StateDictAdapter mapping), matched with re.search, first match wins, with each group's own
lr, weight_decay and eps. Set the data, tokenizer (hf_assets_path), batch and seq_len yourself.

Caveats:
{head}
"""

from dataclasses import replace
from pathlib import Path

from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, ParamGroupConfig
from torchtitan.trainer import Trainer

HANDOFF = Path(__file__).resolve().parents[2]  # this file is DIR/trainers/torchtitan/hpt_handoff_config.py
{consts}
# (torchtitan parameter regex, lr, weight_decay, eps)
PARAM_GROUPS = [
{table},
]
MODEL = {model!r}


def optimizer() -> OptimizersContainer.Config:
    return OptimizersContainer.Config(
        param_groups=[
            ParamGroupConfig(
                pattern=pattern,
                optimizer_name="AdamW",
                optimizer_kwargs={{"lr": lr, "betas": BETAS, "eps": eps, "weight_decay": wd}},
            )
            for pattern, lr, wd, eps in PARAM_GROUPS
        ]
    )


def lr_scheduler() -> LRSchedulersContainer.Config:
    # transformers' cosine-with-min-lr: the decay is the same; torchtitan's warmup is (t+1)/w, not t/w.
    return LRSchedulersContainer.Config(
        warmup_steps=WARMUP_STEPS, total_steps=TOTAL_STEPS, decay_ratio=None, decay_type="cosine", min_lr_factor=MIN_LR_FACTOR
    )
'''
    if model is None:
        return src
    return (
        src
        + '''

def model_spec():
    """torchtitan's llama3 model with DIR/model's dimensions (its own layer builder)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers, model_registry

    m = MODEL
    layers = _build_llama3_layers(
        n_layers=m["n_layers"],
        dim=m["dim"],
        n_heads=m["n_heads"],
        n_kv_heads=m["n_kv_heads"],
        hidden_dim=m["hidden_dim"],
        rope=ComplexRoPE.Config(
            dim=m["dim"] // m["n_heads"],
            max_seq_len=m["max_seq_len"],
            theta=m["rope_theta"],
            scaling=m["rope_scaling"],
            **{k if k != "factor" else "scaling_factor": v for k, v in m["rope_scaling_args"].items()},
        ),
        fuse_qkv=m["fuse_qkv"],
        attn_backend="flex",
    )
    for layer in layers:  # HF's rms_norm_eps (torchtitan's builder leaves its default)
        layer.attention_norm.eps = layer.ffn_norm.eps = m["norm_eps"]
    model = Llama3Model.Config(
        dim=m["dim"],
        vocab_size=m["vocab_size"],
        enable_weight_tying=m["tie_word_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=m["vocab_size"], embedding_dim=m["dim"]),
        norm=RMSNorm.Config(normalized_shape=m["dim"], eps=m["norm_eps"]),
        lm_head=Linear.Config(in_features=m["dim"], out_features=m["vocab_size"]),
        layers=layers,
    )
    return replace(model_registry("debugmodel"), flavor="hpt_handoff", model=model)


def hpt_handoff() -> Trainer.Config:
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()  # torchtitan's defaults for the rest; data and tokenizer are yours
    config.model_spec = model_spec()
    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=MODEL["vocab_size"]))
    config.optimizer = optimizer()
    config.lr_scheduler = lr_scheduler()
    config.training.steps = TOTAL_STEPS
    config.training.max_norm = MAX_NORM
    # The step-0 weights, µP's multipliers folded in: read once in HF format through torchtitan's adapter.
    config.checkpoint = replace(
        config.checkpoint,
        enable=True,
        initial_load_path=str(HANDOFF / "model"),
        initial_load_in_hf=True,
        initial_load_model_only=True,
    )
    return config
'''
    )


def check_torchtitan(path: Path, want: dict[str, Mults], spec: OptimizerSpec) -> list[str]:
    """Load the file with torchtitan's ConfigManager, build its llama3 model (meta device) and
    OptimizersContainer, and compare every parameter's group with `want`; returns notes."""
    import torch
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.config.manager import ConfigManager
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

    with importable(path.parent, path.stem):
        config = ConfigManager().parse_args(["--module", path.stem, "--config", "hpt_handoff"])
    model_cfg = config.model_spec.model
    adapter = Llama3StateDictAdapter(model_cfg, None)
    theirs = {k: adapter.from_hf_map.get(k) for k in TT_FROM_HF}
    if theirs != TT_FROM_HF:
        raise RuntimeError(f"torchtitan's Llama3StateDictAdapter maps HF names differently from ours: {theirs}")
    with torch.device("meta"):
        model = model_cfg.build()
    # "fused" is CUDA/CPU-only and the model is on meta: same groups, a device-agnostic implementation.
    container = OptimizersContainer(replace(config.optimizer, implementation="for-loop"), model_parts=[model])
    got = {}
    for opt in container.optimizers:
        for g in opt.param_groups:
            for n in g["param_names"]:
                got[n] = (g["lr"], g["weight_decay"], g["eps"])
    bad = mismatches(got, want)
    if bad:
        raise check_failed("torchtitan", bad)

    def make(p, lr, wd, eps):  # the file's optimizer setup (its factory and implementation) on one parameter
        group = config.optimizer.param_groups[0]
        one = replace(group, pattern="w", optimizer_kwargs={**group.optimizer_kwargs, "lr": lr, "weight_decay": wd, "eps": eps})
        return OptimizersContainer(replace(config.optimizer, param_groups=[one]), model_parts=[one_param_module(p)])

    check_semantics("torchtitan", make, spec.betas)
    scheds = config.lr_scheduler.build(optimizers=container, training_steps=config.training.steps)
    lam = scheds.schedulers[0].lr_lambdas[0]
    w = spec.schedule.warmup_steps
    after = max((abs(lam(t) - cosine_factor(spec, t)) for t in range(w, spec.schedule.total_steps)), default=0.0)
    if after > 1e-12:
        raise RuntimeError(f"torchtitan's cosine differs from transformers' after warmup by {after:.3g}")
    return []


def write_torchtitan(out: Path, spec: OptimizerSpec, hf_values: dict[str, Mults], config: Any) -> tuple[Path, list[str]]:
    notes: list[str] = []
    caveats = []
    if spec.schedule.warmup_steps > 0:
        caveats.append(
            "torchtitan's linear warmup is (t+1)/w at step t, transformers' t/w: one step ahead during warmup "
            "(the cosine after it is the same)"
        )
    caveats += schedule_note(spec, "torchtitan")
    if spec.grad_clip == 0:
        caveats.append("grad_clip 0: torchtitan always clips, so max_norm is inf")
    model, why = _torchtitan_model_args(config, fuse_qkv=True)
    tt_values, fuse = hf_values, True
    if model is not None:
        try:
            tt_values, fuse = torchtitan_values(hf_values)
            model["fuse_qkv"] = fuse
        except KeyError as e:
            model, why = None, f"HF parameter {e} has no torchtitan llama3 name"
    if model is None:
        tt_values = hf_values
        caveats.append(
            f"{why}: PARAM_GROUPS use the HF names (a torchtitan model with these names needs them translated); "
            "no Trainer.Config is written and the groups were not checked on a torchtitan model"
        )
    elif not fuse:
        caveats.append("q/k/v multipliers differ (attention scale folded into q_proj): the model is built with unfused wq/wk/wv")
    path = out / "torchtitan" / "hpt_handoff_config.py"
    write_atomic(path, torchtitan_source(spec, tt_values, model, caveats))
    notes += [f"torchtitan: {c}" for c in caveats]
    if model is None:
        return path, notes
    try:
        import torchtitan.trainer  # noqa: F401
    except ImportError as e:
        return path, [*notes, f"torchtitan: not installed here ({e.name}); {path.name} was written but NOT checked"]
    except Exception as e:  # a broken install (e.g. a triton that does not match torch) must not stop the hand-off
        return path, [*notes, f"torchtitan: import failed ({type(e).__name__}: {e}); {path.name} was written but NOT checked"]
    notes += check_torchtitan(path, tt_values, spec)
    return path, notes
