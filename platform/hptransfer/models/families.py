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

`ARCHITECTURES` (in `hptransfer.architectures`, with the spec's checks) names the config fields per
`model_type`; any other causal LM uses `GENERIC` (the llama-style names), keeping only the fields its
config class has. µP needs every dimension that grows to grow by the same factor (it compares a base
and a 2× delta model): all of the above do.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

# The ladder's field table lives one layer down, with the spec's checks that read it; re-exported
# here, where the spec's error message tells a user to extend it.
from hptransfer.architectures import ARCHITECTURES, GENERIC, WidthFields, _defaults, gqa_group, heads_at, width_fields

__all__ = ["ARCHITECTURES", "COORD_CHECK_MODULES", "GENERIC", "WidthFields", "apply_attn_scale", "hf_config", "width_overrides"]

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from hptransfer.spec import ModelSpec


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
