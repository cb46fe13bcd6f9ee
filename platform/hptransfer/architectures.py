"""Family `hf`, as the spec sees it: which config fields the width ladder sets per architecture
(`model_type`), and the checks a spec's `model.config` and widths must pass. A contract, below the
models: validating a spec needs this table but not the model code (`hptransfer.models.families`
builds the configs from it). transformers is imported only inside the functions.

`ARCHITECTURES` names the config fields per `model_type`; any other causal LM uses `GENERIC` (the
llama-style names), keeping only the fields its config class has.
"""

from __future__ import annotations

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
