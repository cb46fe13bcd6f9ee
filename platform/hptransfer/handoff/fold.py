"""µP as a plain architecture: forward multipliers folded into the weights, their effect on training
moved into per-parameter LR / weight-decay / ε multipliers.

Derivation. A layer y = α·W·x trained by AdamW (p ← p·(1 − ηλ) − η·m̂/(√v̂ + ε)) with LR η, decoupled
weight decay λ and ε. Write W′ = α·W. Its gradient is g′ = g/α, so Adam's moments are m̂′ = m̂/α and
√v̂′ = √v̂/α, and with ε′ = ε/α the update direction is u′ = m̂/(√v̂ + α·ε′) = u, the same as W's.
W′ ← W′·(1 − η′λ′) − η′·u equals α·(W·(1 − ηλ) − η·u) iff η′ = α·η and η′λ′ = ηλ, i.e. λ′ = λ/α.
So the plain layer with initial weight α·W₀, LR multiplier α, weight-decay multiplier 1/α and ε
multiplier 1/α follows α × W's trajectory exactly (up to float rounding): the symmetry of the
abc-parametrizations (Tensor Programs V; Everett et al., arXiv 2407.05872).

Where α ≠ 1 in our models:
- the readout: µP's `MuReadout` computes W·(output_mult/width_mult · x), SP's `ScaledReadout`
  W·(output_mult · x); a bias is added after the product and keeps α = 1;
- attention (`model.attn_scale: 1/d`): logits are scaling·(W_q x)·k, rotary embeddings are linear in
  q, so f = scaling / the architecture's default is folded into the query projection (weight and
  bias). A fused QKV projection (GPT-2's `c_attn`, GPT-NeoX's `query_key_value`) holds q, k and v in one
  tensor, and a per-parameter multiplier cannot scale a third of it: refused, with what to do.
  A query norm after the projection (`q_norm`: Qwen3 per head, OLMo2 over all heads, Gemma3) would
  normalise a factor in q_proj away, so f goes on the norm's gain instead, where the gain multiplies
  its output elementwise (Qwen3, OLMo2: weight · RMSNorm(q); rotary embeddings come after it and are
  linear): gain × f, LR × f, weight decay / f, ε / f, and q_proj keeps α = 1. Gemma3's gain enters
  as (1 + weight), which no per-parameter scale turns into f × the output: refused, with what to do.
µP's own per-parameter LR and weight decay (MuAdamW: hidden matrices lr/m, wd·m, or wd unchanged
under `mup-standard-wd`) are read off the optimizer the large run builds and multiplied in.

Tied embeddings (GPT-2): the readout *is* the input embedding, and α cannot be folded into a
weight that is also read at α = 1. The folded model is untied: `lm_head.weight = α·E₀`, its own
parameter with the readout's multipliers; the embedding keeps its own. From step 0 on the two
evolve separately, which the tied ladder did not: the plan says so in `notes`.

Gradient clipping is not invariant under the fold: the global norm over the folded gradients weighs
the readout's gradient by 1/α. The large run clips the folded model exactly as a consumer's trainer
does (one code path), which differs from how the sweep's µP trials clipped when `grad_clip` > 0 and
some α ≠ 1; the plan's `notes` say so.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hptransfer.handoff.groups import OptimizerSpec, Schedule, SpWarmup, make_groups
from hptransfer.models.optim import ADAM_EPS, FINAL_LR_FRACTION


@dataclass
class Folded:
    """A plain model and how it was folded: per-parameter multipliers and what `load_handoff` needs to
    restore the µP form (readout kind, output_mult, width_mult, fold factor; attention folds)."""

    model: nn.Module
    mults: dict[str, tuple[float, float, float]]  # name → (lr_mult, wd_mult, eps_mult) relative to the global values
    readout: dict[str, Any]
    attn_scale_folded: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _fused_query(module: nn.Module) -> bool:
    return not isinstance(getattr(module, "q_proj", None), nn.Linear)


QUERY_NORMS = ("q_norm", "q_layernorm", "query_norm")  # a norm on the queries after their projection


def _query_norm(module: nn.Module) -> nn.Module | None:
    return next((m for a in QUERY_NORMS if isinstance(m := getattr(module, a, None), nn.Module)), None)


def _default_scalings(model: nn.Module) -> dict[str, float]:
    from hptransfer.models.handoff import _default_scalings as defaults

    return defaults(model) if hasattr(model, "config") else {}


def _plain_twin(model: nn.Module, untie: bool) -> nn.Module:
    """The same architecture without hptransfer or mup modules: an HF model rebuilt from its config
    (plain `nn.Linear` head, default attention scaling), else a copy with the head swapped."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.lm_head
    if hasattr(model, "config"):
        cfg = copy.deepcopy(model.config)
        if untie:
            cfg.tie_word_embeddings = False
        return type(model)(cfg)
    twin = copy.deepcopy(model)
    twin.lm_head = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
    return twin


@torch.no_grad()
def fold(model: nn.Module, optimizer: torch.optim.Optimizer, lr: float, weight_decay_mults: dict[int, float]) -> Folded:
    """`model` (µP or SP, as hptransfer builds it) as a plain model with per-parameter multipliers.

    `optimizer`: the optimizer hptransfer would train `model` with (MuAdamW's groups carry µP's LR
    scaling); `weight_decay_mults`: id(param) → its weight decay relative to the global value (read
    from an optimizer built with weight_decay 1, so it is defined when the plan's is 0)."""
    from hptransfer.models.depth import plain_gain
    from hptransfer.models.handoff import _query_rows, readout_record, readout_scale

    lr_of = {id(p): g["lr"] / lr for g in optimizer.param_groups for p in g["params"]}
    eps_of = {id(p): g["eps"] / ADAM_EPS for g in optimizer.param_groups for p in g["params"]}  # depth rules scale ε
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.lm_head
    kind, output_mult, width_mult = readout_scale(head)
    alpha_head = output_mult / width_mult
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = embed is not None and head.weight is embed.weight
    untie = tied and alpha_head != 1.0
    if tied and kind != "MuReadout" and alpha_head != 1.0:
        raise NotImplementedError(
            f"tied {kind} readout with output_mult={output_mult:g}: SP cannot fold it without untying; use output_mult=1"
        )

    # α per parameter name (duplicates kept: a tied head has its own name for the shared weight).
    named = dict(model.named_parameters(remove_duplicate=False))
    head_name = next(n for n, m in model.named_modules() if m is head)
    alpha = dict.fromkeys(named, 1.0)
    alpha[f"{head_name}.weight"] = alpha_head
    attn: dict[str, float] = {}
    query_norms: list[str] = []
    defaults = _default_scalings(model)
    for name, module in model.named_modules():
        if name not in defaults:
            continue
        f = float(module.scaling) / defaults[name]
        if abs(f - 1.0) <= 1e-12:
            continue
        if _fused_query(module):
            raise NotImplementedError(
                f"model.attn_scale=1/d on {type(module).__name__}: its queries share one fused QKV weight with keys and "
                "values, so the attention scale cannot be folded into a per-parameter multiplier for another trainer; "
                "use a family with a separate q_proj (llama, qwen2, mistral), or attn_scale: 1/sqrt(d) with a fixed head_dim"
            )
        qnorm = _query_norm(module)
        if qnorm is not None and not plain_gain(qnorm):
            family = type(model).__name__.removesuffix("ForCausalLM")
            raise NotImplementedError(
                f"model.attn_scale=1/d on {family}: {type(module).__name__}'s q_norm ({type(qnorm).__name__}) normalises "
                "the queries after q_proj, which removes an attention scale folded into q_proj, and its gain enters as "
                "(1 + weight), so the scale cannot be moved onto it as a per-parameter multiplier either; use "
                "attn_scale: 1/sqrt(d) with a fixed head_dim (model.head_dim, no n_heads), or a family whose q_norm is "
                "a plain gain (qwen3, olmo2) or that has none (llama, qwen2, mistral)"
            )
        proj = qnorm if qnorm is not None else _query_rows(module)[0]  # the last linear map on q before the logits
        pname = next(n for n, m in model.named_modules() if m is proj)
        for attr in ("weight", "bias"):
            if getattr(proj, attr, None) is not None:
                alpha[f"{pname}.{attr}"] = f
        attn[name] = f
        if qnorm is not None:
            query_norms.append(pname)

    twin = _plain_twin(model, untie)
    state = {n: (p.detach().double() * alpha[n]).to(p.dtype) if alpha[n] != 1.0 else p.detach().clone() for n, p in named.items()}
    twin_names = [n for n, _ in twin.named_parameters()]
    missing = sorted(set(twin_names) - set(state))
    if missing:
        raise RuntimeError(f"folding: the plain {type(twin).__name__} has parameters the model lacks: {missing[:3]}")
    # Parameters only: buffers (rotary inv_freq, masks) are the architecture's own, rebuilt by its constructor.
    twin.load_state_dict({n: state[n] for n in twin_names}, strict=False)
    twin.train(model.training)

    mults = {}
    for n in dict(twin.named_parameters()):
        src = named[n]
        a = alpha[n]
        mults[n] = (lr_of[id(src)] * a, weight_decay_mults[id(src)] / a, eps_of[id(src)] / a)
    notes = []
    if query_norms:
        notes.append(
            f"µP's attention scale is folded into the query norms' gains ({query_norms[0]}, ...), not into q_proj: "
            "the norm after q_proj would remove it there"
        )
    if untie:
        notes.append(
            "the µP readout was tied to the input embedding; the folded model is untied (lm_head.weight starts at "
            f"{alpha_head:.6g} × the embedding and trains on its own), which the tied ladder did not"
        )
    return Folded(
        model=twin,
        mults=mults,
        readout=readout_record(head, kind, output_mult, width_mult, alpha_head, tied=tied, untied_on_save=untie),
        attn_scale_folded=attn,
        notes=notes,
    )


def optimizer_spec(folded: Folded, plan: Any) -> OptimizerSpec:
    """optimizer.json for the plan's target: the global AdamW settings, the folded groups, the schedule."""
    hps = plan.hps
    sched = plan.schedule or {}
    sp = SpWarmup(m=float(sched["m"]), timescale=float(sched["timescale"])) if sched.get("kind") == "sp-warmup" else None
    notes = list(folded.notes)
    if hps.grad_clip > 0 and any(a != 1.0 for a in (folded.readout["folded_scale"], *folded.attn_scale_folded.values())):
        notes.append(
            "grad_clip applies to the folded model's global gradient norm, where the readout's gradient is 1/folded_scale "
            "times µP's: the same clipping as hptransfer's large run, not the sweep trials'"
        )
    return OptimizerSpec(
        lr=hps.lr,
        betas=(hps.beta1, hps.beta2),
        eps=ADAM_EPS,
        weight_decay=hps.weight_decay,
        grad_clip=hps.grad_clip,
        param_groups=make_groups(folded.mults),
        schedule=Schedule(
            warmup_steps=round(hps.warmup_steps), total_steps=plan.target.steps, min_lr_rate=FINAL_LR_FRACTION, sp_warmup=sp
        ),
        notes=notes,
    )


def fold_plan_target(plan: Any) -> tuple[Folded, OptimizerSpec]:
    """The plan's target at step 0 (the large run's seed, init and µP base shapes) folded into a plain
    model, with its optimizer.json."""
    from hptransfer.models import build_model, build_optimizer
    from hptransfer.models.depth import depth_scaling
    from hptransfer.models.setup import weight_decay_scaling

    hps = plan.hps
    model = build_model(plan.model, plan.target.width, base_width=plan.base_width, hps=hps, seed=plan.seed)
    scaling, depth = weight_decay_scaling(plan.rule), depth_scaling(plan.model)
    opt = build_optimizer(model, plan.model.parametrization, hps, scaling, depth)
    unit = build_optimizer(model, plan.model.parametrization, hps.model_copy(update={"weight_decay": 1.0}), scaling, depth)
    wd = {id(p): g["weight_decay"] for g in unit.param_groups for p in g["params"]}
    folded = fold(model, opt, hps.lr, wd)
    return folded, optimizer_spec(folded, plan)
