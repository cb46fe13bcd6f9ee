"""Family `hf`: how the width ladder maps onto a Hugging Face causal LM's config, per architecture.

A config (inline mapping with `model_type`, or a local config.json read when the spec is loaded)
fixes everything but the width. At width `w` the ladder sets:

    hidden size        = w
    FFN size           = round(ffn_mult · w)
    attention heads    = w / head_dim          (head_dim fixed: 1/√head_dim stays width-independent)
                       or n_heads, fixed       (head size w / n_heads grows: use attn_scale 1/d)
    KV heads           = heads / g             g = num_attention_heads / num_key_value_heads of the
                                               given config (its class defaults where not given):
                                               grouped-query attention keeps its group size
    layers             = depth,  positions = seq_len,  vocabulary = the tokenizer's

`ARCHITECTURES` names the config fields per `model_type`; any other causal LM uses `GENERIC` (the
llama-style names), keeping only the fields its config class has. µP needs every dimension that grows
to grow by the same factor (it compares a base and a 2× delta model): all of the above do.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from hptransfer.spec import ModelSpec


@dataclass(frozen=True)
class WidthFields:
    """Names of the config fields the ladder sets; None: the architecture has no such field
    (no `kv_heads`: every head has its own K/V; no `head_dim`: it is hidden / heads)."""

    hidden: str
    ffn: str
    heads: str
    kv_heads: str | None
    head_dim: str | None
    layers: str
    positions: str
    vocab: str = "vocab_size"


GENERIC = WidthFields(
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "max_position_embeddings",
)
ARCHITECTURES: dict[str, WidthFields] = {
    "llama": GENERIC,
    "mistral": GENERIC,
    "qwen2": WidthFields(
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        None,
        "num_hidden_layers",
        "max_position_embeddings",
    ),
    "gpt2": WidthFields("n_embd", "n_inner", "n_head", None, None, "n_layer", "n_positions"),
    "gpt_neox": WidthFields(
        "hidden_size", "intermediate_size", "num_attention_heads", None, None, "num_hidden_layers", "max_position_embeddings"
    ),
}

# Modules whose forward returns a plain tensor, per naming scheme (llama-likes, GPT-2's Conv1D
# blocks, GPT-NeoX, the `mlp` family): what the coordinate check hooks. Attention and decoder
# blocks return tuples and are left out.
COORD_CHECK_MODULES = re.compile(
    r"(embed_tokens|embed|prev_embed|[qkvo]_proj|gate_proj|up_proj|down_proj|hidden\.\d+|layernorm|norm|lm_head"
    r"|wte|wpe|c_attn|c_proj|c_fc|ln_\d+|ln_f"
    r"|embed_in|embed_out|query_key_value|dense|dense_h_to_4h|dense_4h_to_h)$"
)

# Set by hptransfer, never by the config: the cache is useless in training and a config's token ids
# may lie outside a smaller vocabulary.
_RUNTIME = {"use_cache": False}


def config_class(model_type: str) -> type[PretrainedConfig]:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


@lru_cache(maxsize=64)
def _defaults(model_type: str) -> dict[str, Any]:
    return config_class(model_type)().to_dict()


def is_causal_lm(model_type: str) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def width_fields(model_type: str) -> WidthFields:
    """The architecture's own table, or the generic one without the fields its config lacks."""
    if model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    have = _defaults(model_type)
    g = GENERIC
    return WidthFields(
        g.hidden,
        g.ffn,
        g.heads,
        g.kv_heads if g.kv_heads in have else None,
        g.head_dim if g.head_dim in have else None,
        g.layers,
        g.positions,
    )


def missing_fields(model_type: str) -> list[str]:
    """Ladder fields the architecture's config does not have (the generic table does not fit it)."""
    f, have = width_fields(model_type), _defaults(model_type)
    have = set(have) | set(getattr(config_class(model_type), "attribute_map", {}))
    return [n for n in (f.hidden, f.ffn, f.heads, f.layers, f.positions, f.vocab) if n not in have]


def unknown_keys(config: dict[str, Any]) -> list[str]:
    """Keys of an inline config that its config class does not know (typos)."""
    from transformers import PretrainedConfig

    cls = config_class(config["model_type"])
    known = set(_defaults(config["model_type"])) | set(getattr(cls, "attribute_map", {}))
    known |= set(PretrainedConfig().to_dict()) | set(width_fields(config["model_type"]).__dict__.values())
    return sorted(k for k in config if k not in known)


def gqa_group(config: dict[str, Any]) -> int | float:
    """Query heads per KV head in the given config (class defaults where it is silent); 1 without
    grouped-query attention. A float when the config's heads do not divide (an invalid config)."""
    f = width_fields(config["model_type"])
    if f.kv_heads is None:
        return 1
    merged = {**_defaults(config["model_type"]), **config}
    heads, kv = merged.get(f.heads), merged.get(f.kv_heads)
    if not heads or not kv:
        return 1
    return heads // kv if heads % kv == 0 else heads / kv


def heads_at(spec: ModelSpec, width: int) -> tuple[int, int]:
    """(attention heads, head size) at `width`."""
    if spec.n_heads:
        return spec.n_heads, width // spec.n_heads
    return width // spec.head_dim, spec.head_dim


def width_problems(spec: ModelSpec, widths: list[int]) -> list[str]:
    """Why some widths cannot be built (empty when all can): heads must divide the width and the
    GQA group must divide the heads."""
    group = gqa_group(spec.config)  # type: ignore[arg-type]
    if spec.n_heads:
        bad = [w for w in widths if w % spec.n_heads]
        errs = [f"widths {bad} are not multiples of model.n_heads={spec.n_heads}; head size = width / n_heads"] if bad else []
        if spec.n_heads % group:
            errs.append(
                f"model.n_heads={spec.n_heads} is not a multiple of the config's GQA group size {group} "
                "(num_attention_heads / num_key_value_heads); choose n_heads divisible by it"
            )
        return errs
    step = spec.head_dim * group
    bad = [w for w in widths if w % step]
    if not bad:
        return []
    why = "hf width = n_heads × head_dim" + (
        f" with n_heads a multiple of the GQA group size {group} (num_attention_heads / num_key_value_heads of model.config)"
        if group != 1
        else ""
    )
    return [
        f"widths {bad} are not multiples of model.head_dim={spec.head_dim}"
        + (f" × {group} = {step}" if group != 1 else "")
        + f"; {why}"
    ]


def width_overrides(spec: ModelSpec, width: int) -> dict[str, Any]:
    """The config fields the ladder sets at `width` (see the module docstring)."""
    cfg = spec.config
    assert isinstance(cfg, dict), "family hf needs model.config (a mapping once the spec is loaded)"
    f = width_fields(cfg["model_type"])
    heads, head_dim = heads_at(spec, width)
    out: dict[str, Any] = {
        f.hidden: width,
        f.ffn: round(spec.ffn_mult * width),
        f.heads: heads,
        f.layers: spec.depth,
        f.positions: spec.seq_len,
        f.vocab: spec.vocab,
    }
    if f.kv_heads:
        out[f.kv_heads] = heads // int(gqa_group(cfg))
    if f.head_dim:
        out[f.head_dim] = head_dim
    return out


def hf_config(spec: ModelSpec, width: int) -> PretrainedConfig:
    """The Hugging Face config of `spec` at `width`: the given fields, the ladder's, then runtime ones.
    Special-token ids outside the vocabulary (a config written for another tokenizer) are dropped, and
    so is a per-layer `layer_types` list of another length than `depth`."""
    given = {k: v for k, v in dict(spec.config).items() if k != "model_type"}  # type: ignore[arg-type]
    if isinstance(given.get("layer_types"), list) and len(given["layer_types"]) != spec.depth:
        del given["layer_types"]  # written for another depth (a saved config.json): the config derives it again
    fields = {**given, **width_overrides(spec, width), **_RUNTIME}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        ids = fields.get(key, _defaults(spec.config["model_type"]).get(key))  # type: ignore[index]
        if ids is not None and any(i >= spec.vocab for i in (ids if isinstance(ids, list) else [ids])):
            fields[key] = None
    from transformers import AutoConfig

    return AutoConfig.for_model(spec.config["model_type"], **fields)  # type: ignore[index]


def attention_head_size(module: Any) -> int | None:
    """Head size of an attention module that exposes `.scaling` (transformers 5), else None."""
    if not isinstance(getattr(module, "scaling", None), float):
        return None
    d = getattr(module, "head_dim", None) or getattr(module, "head_size", None)
    return int(d) if d else None


def apply_attn_scale(model: Any, spec: ModelSpec, base_width: int) -> int:
    """`attn_scale: 1/d`: attention logits q·k/d instead of q·k/√d (µP, Tensor Programs V §J.1:
    q and k become correlated during training, so their dot product grows ∝ d, not √d). Written as
    √d_base / d, which equals 1/√d at the base head size, so the base model is unchanged; any other
    factor of the architecture (GPT-2's 1/layer) is kept. Returns how many modules were scaled."""
    if spec.attn_scale != "1/d":
        return 0
    d_base = heads_at(spec, base_width)[1]
    n = 0
    for module in model.modules():
        d = attention_head_size(module)
        if d:
            module.scaling *= math.sqrt(d_base / d)
            n += 1
    if n == 0:
        raise ValueError(
            f"model.attn_scale=1/d: no attention module of {type(model).__name__} exposes `.scaling`; "
            "use attn_scale: 1/sqrt(d) with a fixed head_dim"
        )
    return n
