"""The large run's hand-off folder: Hugging Face weights that give the run's logits without
hptransfer, plus what hptransfer needs to continue µP training from them.

Why a fold. µP's readout (`mup.MuReadout`) computes `W · (output_mult · x / width_mult)`, and SP's
`ScaledReadout` computes `W · (output_mult · x)`; `save_pretrained` stores only `W`, and a plain
`from_pretrained` rebuilds the head as `nn.Linear` computing `W · x` — logits `width_mult /
output_mult` times too large (16× for the quickstart: loss 23.4 instead of 2.84). Since
`W · (c·x) = (c·W) · x`, we save `c·W` with `c = output_mult / width_mult` (SP: `output_mult`) and
any consumer (`from_pretrained`, vLLM, lm-eval-harness) computes the run's logits. A bias is added
after the product, so it is saved as it is.

Tied embeddings (`MuSharedReadout`, the readout weight *is* the input embedding): folding `c` into
the shared matrix would also scale the embeddings, so a folded tied model is saved *untied*
(`tie_word_embeddings: false`, its own `lm_head.weight = c·E`); `load_handoff` ties it again.

µP's attention scale (`model.attn_scale: 1/d`, hf family) sets each attention module's `.scaling`
to √d_base/d, which `from_pretrained` rebuilds as the architecture's default (1/√d). Since the
logits are `scaling · (W_q x)·k` and rotary embeddings are linear in q, the ratio f = scaling /
default is folded into the query projection (`q_proj`, GPT-2's fused `c_attn` columns, GPT-NeoX's
fused `query_key_value` rows); `load_handoff` divides it back out and restores `.scaling`.

The folder also holds `mup_base_shapes.bsh` (mup's own format, from the live model's `infshape`s),
`hptransfer_handoff.json` (readout kind, output_mult, width_mult, the fold factor) and the plan
(`transfer_plan.yaml`), so `load_handoff` rebuilds the µP readout with the un-folded weight and sets
base shapes with `rescale_params=False`: µP training continues where it stopped, and its logits
equal plain transformers' logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hptransfer.io import write_json, write_yaml
from hptransfer.layout import PLAN_FILE  # the plan, named as in a study folder
from hptransfer.spec import ModelSpec

HANDOFF_FILE = "hptransfer_handoff.json"
BASE_SHAPES_FILE = "mup_base_shapes.bsh"
HANDOFF_VERSION = 1


def readout_scale(head: nn.Module) -> tuple[str, float, float]:
    """(kind, output_mult, width_mult) of a readout: what multiplies its input before `W`."""
    from mup import MuReadout

    if isinstance(head, MuReadout):
        assert hasattr(head.weight, "infshape"), "µP readout without base shapes: did you forget `set_base_shapes`?"
        return "MuReadout", float(head.output_mult), float(head.width_mult())
    if type(head) is nn.Linear:
        return "Linear", 1.0, 1.0
    if isinstance(head, nn.Linear) and hasattr(head, "output_mult"):
        return type(head).__name__, float(head.output_mult), 1.0  # SP's ScaledReadout: W · (output_mult · x)
    raise TypeError(
        f"cannot fold readout {type(head).__name__}: handoff knows nn.Linear, MuReadout and "
        "Linear subclasses that multiply their input by `output_mult`"
    )


def _tied(model: nn.Module) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def _default_scalings(model: nn.Module) -> dict[str, float]:
    """Each attention module's `.scaling` as `from_pretrained` would build it (the same class and
    config, on the meta device: shapes only)."""
    with torch.device("meta"):
        fresh = type(model)(model.config)
    return {n: float(m.scaling) for n, m in fresh.named_modules() if isinstance(getattr(m, "scaling", None), float)}


def _query_rows(module: nn.Module) -> tuple[nn.Module, Any]:
    """(the module holding the query projection, an index selecting the query part of its output)."""
    if isinstance(getattr(module, "q_proj", None), nn.Linear):
        return module.q_proj, slice(None)
    if hasattr(module, "c_attn") and hasattr(module, "split_size"):  # GPT-2 Conv1D: weight [in, 3·embed], q first
        return module.c_attn, slice(0, module.split_size)
    qkv = getattr(module, "query_key_value", None)
    if isinstance(qkv, nn.Linear) and hasattr(module, "head_size"):  # GPT-NeoX: rows [heads, 3·head_size], q first
        hs = int(module.head_size)
        idx = torch.arange(qkv.out_features).view(-1, 3 * hs)[:, :hs].reshape(-1)
        return qkv, idx
    raise NotImplementedError(
        f"cannot fold the attention scale of {type(module).__name__} into its query projection "
        "(handoff knows q_proj, GPT-2's c_attn and GPT-NeoX's query_key_value); use attn_scale: 1/sqrt(d)"
    )


def _scale_queries(model: nn.Module, factors: dict[str, float], state: dict[str, torch.Tensor] | None = None) -> None:
    """Multiply each named attention module's query projection by its factor: in `state` (the
    tensors to save) when given, else in place in the model."""
    modules = dict(model.named_modules())
    for name, f in factors.items():
        proj, idx = _query_rows(modules[name])
        pname = next(n for n, m in model.named_modules() if m is proj)
        conv1d = type(proj).__name__ == "Conv1D"  # weight stored [in, out]
        for attr in ("weight", "bias"):
            t = getattr(proj, attr, None)
            if t is None:
                continue
            key = f"{pname}.{attr}"
            new = (state[key] if state is not None else t.detach()).clone().double()
            if attr == "weight" and conv1d:
                new[:, idx] *= f
            else:
                new[idx] *= f
            if state is not None:
                state[key] = new.to(t.dtype)
            else:
                with torch.no_grad():
                    t.copy_(new.to(t.dtype))


def save_handoff(
    model: nn.Module,
    out_dir: str | Path,
    *,
    spec_model: ModelSpec,
    width: int,
    base_width: int,
    plan_dict: dict[str, Any] | None = None,
    folded: Any = None,
) -> Path | None:
    """Write `out_dir` so that plain `AutoModelForCausalLM.from_pretrained(out_dir)` gives `model`'s
    logits, and `load_handoff(out_dir)` gives back the µP model. The live model is not changed.

    `folded`: `model` is already the plain, folded form (`hptransfer.handoff.fold.Folded`, as the large
    run trains it): its weights are saved as they are, with the fold's record so `load_handoff` can
    restore the µP form (base shapes from a µP twin built on the meta device).

    Models without `save_pretrained` (the `mlp` family's ByteMLP) have no Hugging Face form:
    nothing is written and None is returned."""
    if not hasattr(model, "save_pretrained"):
        return None
    out = Path(out_dir)
    if folded is not None:
        return _save_folded(model, out, folded, spec_model=spec_model, width=width, base_width=base_width, plan_dict=plan_dict)
    head = model.get_output_embeddings()
    kind, output_mult, width_mult = readout_scale(head)
    if kind == "MuReadout" and abs(width_mult - width / base_width) > 1e-9 * width_mult:
        raise ValueError(
            f"readout width_mult {width_mult:g} != width / base_width = {width}/{base_width}; "
            "pass the run's target width and base width"
        )
    scale = output_mult / width_mult
    tied = _tied(model)
    untie = tied and scale != 1.0
    if untie and kind != "MuReadout":
        raise NotImplementedError(
            f"tied {kind} readout with output_mult={output_mult:g}: cannot fold without "
            "untying; use output_mult=1 or untied embeddings"
        )
    state = model.state_dict()
    key = next(n for n, m in model.named_modules() if m is head) + ".weight"
    w = head.weight.detach()
    state[key] = (w.double() * scale).to(w.dtype)  # a new tensor: no longer shares the embedding
    defaults = _default_scalings(model)
    attn = {
        n: float(m.scaling) / defaults[n]
        for n, m in model.named_modules()
        if n in defaults and abs(float(m.scaling) / defaults[n] - 1.0) > 1e-12
    }
    _scale_queries(model, attn, state)
    tie_before = getattr(model.config, "tie_word_embeddings", False)
    try:
        model.config.tie_word_embeddings = tie_before and not untie
        model.save_pretrained(str(out), state_dict=state)
    finally:
        model.config.tie_word_embeddings = tie_before
    readout = readout_record(head, kind, output_mult, width_mult, scale, tied=tied, untied_on_save=untie)
    _write_meta(out, model, readout, attn, spec_model=spec_model, width=width, base_width=base_width, plan_dict=plan_dict)
    return out


def readout_record(
    head: nn.Module, kind: str, output_mult: float, width_mult: float, folded_scale: float, *, tied: bool, untied_on_save: bool
) -> dict[str, Any]:
    """The readout's entry of `hptransfer_handoff.json` (what `load_handoff` undoes), one form for
    the saved hand-off and the fold (`handoff.fold`)."""
    return {
        "kind": kind,
        "output_mult": output_mult,
        "width_mult": width_mult,
        "folded_scale": folded_scale,
        "bias": head.bias is not None,
        "tied": tied,
        "untied_on_save": untied_on_save,
    }


def _write_meta(
    out: Path,
    mup_shapes: Any,
    readout: dict[str, Any],
    attn: dict[str, float],
    *,
    spec_model: ModelSpec,
    width: int,
    base_width: int,
    plan_dict: dict[str, Any] | None,
) -> None:
    """The files beside the weights: µP base shapes (`mup_shapes`: a µP model, or its parameters'
    `infshape`s by name), the plan, and
    `hptransfer_handoff.json` (what was folded, so `load_handoff` can undo it)."""
    bsh = out / BASE_SHAPES_FILE
    bsh.unlink(missing_ok=True)
    if readout["kind"] == "MuReadout":
        from mup.shape import save_base_shapes

        save_base_shapes(mup_shapes, str(bsh))  # the µP model's base shapes, keyed by parameter name
    if plan_dict is not None:
        write_yaml(out / PLAN_FILE, plan_dict)
    write_json(
        out / HANDOFF_FILE,
        {
            "version": HANDOFF_VERSION,
            "note": "lm_head.weight holds folded_scale × the µP readout weight: plain transformers gives the run's "
            "logits. hptransfer.models.handoff.load_handoff(dir) restores the µP readout for further training.",
            "model": spec_model.model_dump(mode="json"),
            "width": width,
            "base_width": base_width,
            "readout": readout,
            "attn_scale_folded": attn,  # attention module → scaling / default, folded into its queries
            "base_shapes": BASE_SHAPES_FILE if readout["kind"] == "MuReadout" else None,
            "plan": PLAN_FILE if plan_dict is not None else None,
        },
    )


def _save_folded(
    model: nn.Module,
    out: Path,
    folded: Any,
    *,
    spec_model: ModelSpec,
    width: int,
    base_width: int,
    plan_dict: dict[str, Any] | None,
) -> Path:
    """A model trained in the folded form: saved as it is (nothing to fold), with the fold's record."""
    model.save_pretrained(str(out))
    readout = dict(folded.readout)
    shapes = None
    if readout["kind"] == "MuReadout":
        from mup.shape import get_infshapes

        from hptransfer.models import build_model

        with torch.device("meta"):  # only the base shapes are read
            twin = build_model(spec_model, width, base_width=base_width)
        shapes = get_infshapes(twin)
        if readout["untied_on_save"]:  # untied at step 0: the readout is its own parameter, shaped as the embedding
            head = twin.get_output_embeddings()
            head_name = next(n for n, m in twin.named_modules() if m is head)
            embed_name = next(n for n, p in twin.named_parameters() if p is head.weight)
            shapes[f"{head_name}.weight"] = shapes[embed_name]
    if readout["untied_on_save"]:
        readout.update(tied=False, untied_on_save=False, untied_at_step0=True)  # trained untied: restore an untied MuReadout
    _write_meta(
        out,
        shapes,
        readout,
        dict(folded.attn_scale_folded),
        spec_model=spec_model,
        width=width,
        base_width=base_width,
        plan_dict=plan_dict,
    )
    return out


def read_handoff(out_dir: str | Path) -> dict[str, Any]:
    path = Path(out_dir) / HANDOFF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {out_dir} was not written by save_handoff (a folder from an older "
            "hptransfer holds an un-folded lm_head); re-export it from the run's checkpoint"
        )
    meta = json.loads(path.read_text())
    if meta.get("version") != HANDOFF_VERSION:
        raise ValueError(f"{path}: handoff version {meta.get('version')!r}, this hptransfer reads {HANDOFF_VERSION}")
    return meta


def _unfolded_readout(model: nn.Module, r: dict[str, Any]) -> nn.Module:
    """The run's readout module, holding `saved / folded_scale`."""
    from mup import MuReadout, MuSharedReadout

    saved = model.get_output_embeddings()
    weight = (saved.weight.detach().double() / r["folded_scale"]).to(saved.weight.dtype)
    if r["untied_on_save"]:
        embed = model.get_input_embeddings().weight
        if not torch.allclose(weight, embed.detach(), rtol=1e-4, atol=1e-6):
            raise ValueError("handoff says the readout was tied, but lm_head / folded_scale differs from the embedding")
        model.config.tie_word_embeddings = True
        return MuSharedReadout(embed, bias=r["bias"], output_mult=r["output_mult"])
    if r["kind"] == "MuReadout":
        head = MuReadout(saved.in_features, saved.out_features, bias=r["bias"], output_mult=r["output_mult"])
    else:
        from hptransfer.models.build import ScaledReadout

        head = ScaledReadout(saved.in_features, saved.out_features, r["output_mult"])
    head = head.to(dtype=saved.weight.dtype, device=saved.weight.device)
    with torch.no_grad():
        head.weight.copy_(weight)
        if r["bias"]:
            head.bias.copy_(saved.bias)
    return head


def load_handoff(out_dir: str | Path) -> nn.Module:
    """The model `save_handoff` wrote, as the run had it: µP readout with the un-folded weight and
    base shapes set (`rescale_params=False`), ready for `build_optimizer`. Its logits equal plain
    transformers' logits on the same folder. Returned in eval mode, as `from_pretrained` returns it."""
    from transformers import AutoModelForCausalLM

    meta = read_handoff(out_dir)
    r = meta["readout"]
    model = AutoModelForCausalLM.from_pretrained(str(out_dir))
    attn = meta.get("attn_scale_folded") or {}
    if attn:  # the run's parametrization: un-folded queries, µP's attention scale
        _scale_queries(model, {n: 1.0 / f for n, f in attn.items()})
        modules = dict(model.named_modules())
        for n, f in attn.items():
            modules[n].scaling *= f
    if r["kind"] != "Linear":
        model.set_output_embeddings(_unfolded_readout(model, r).train(model.training))
    if r["kind"] == "MuReadout":
        from mup import set_base_shapes

        set_base_shapes(model, str(Path(out_dir) / meta["base_shapes"]), rescale_params=False)
        wm = model.get_output_embeddings().width_mult()
        assert abs(wm - r["width_mult"]) <= 1e-9 * wm, f"base shapes give width_mult {wm}, handoff says {r['width_mult']}"
    return model
