"""`model:`: the architecture of the ladder and the target (a family, or any Hugging Face config),
its parametrization and depth rule, and the checks of a config or tokenizer folder it names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hptransfer import architectures  # what validating an hf config and a tokenizer folder needs
from hptransfer.spec.base import BYTE_VOCAB, _Strict


class ModelSpec(_Strict):
    family: Literal["hf", "llama", "mlp"] = Field(
        "llama",
        description="`llama`: HF LlamaForCausalLM built from a fixed config; `hf`: any Hugging Face causal LM built from `config` (hptransfer.models.families says how width maps onto each architecture); `mlp`: a small per-position MLP LM for fast tests.",
    )
    config: dict[str, Any] | None = Field(
        None,
        description="family hf: the architecture, as an inline mapping with `model_type` and config fields (e.g. {model_type: qwen2, num_attention_heads: 4, num_key_value_heads: 1}) or the path of a local config.json (or its folder), read when the spec is loaded and kept inline in the plan. The ladder sets the width fields (hidden, FFN, heads, KV heads keeping this config's GQA group size, head size), the layer count (`depth`), positions (`seq_len`) and the vocabulary (the tokenizer's); everything else is used as given.",
    )
    depth: int = Field(
        2,
        ge=1,
        le=128,
        description="Number of transformer blocks (llama; hf, where it overrides the config's layer count) or hidden layers (mlp).",
    )
    head_dim: int = Field(
        16,
        ge=4,
        le=256,
        description="llama, hf: fixed head size; width = n_heads × head_dim, so attention scaling stays right as width grows.",
    )
    n_heads: int | None = Field(
        None,
        ge=1,
        description="hf: a fixed number of attention heads instead, so the head size width / n_heads grows with width (pair it with attn_scale: 1/d). Default: heads = width / head_dim.",
    )
    attn_scale: Literal["1/sqrt(d)", "1/d"] = Field(
        "1/sqrt(d)",
        description="hf: attention logits q·k/√d (standard) or q·k/d, µP's rule when the head size d grows (written √d_base/d: the base width is unchanged).",
    )
    ffn_mult: float = Field(4.0, gt=0, le=64, description="Feed-forward hidden size as a multiple of width.")
    seq_len: int = Field(64, ge=8, le=8192, description="Context length in tokens (bytes for the `byte` tokenizer).")
    parametrization: Literal["sp", "mup"] = Field(
        "mup",
        description="`mup`: µP via the `mup` package (MuReadout, or MuSharedReadout for tied embeddings; base shapes; MuAdamW); `sp`: standard parametrization.",
    )
    base_width: int | None = Field(
        None, ge=1, description="µP base width (width_mult = width / base_width). Default: the narrowest swept width."
    )
    hp_defaults: Literal["family", "package"] = Field(
        "family",
        description="Defaults of the hyperparameters the sweep neither fixes nor searches: `family`, the joint optimum measured for the family (llama under µP: output_mult 7, init_std 0.04; hptransfer.family_defaults says where each was measured), filled into sweep.fixed when the spec is loaded; `package`, Hyperparameters' own (output_mult 1, init_std 0.02). Families without a measurement keep the package's.",
    )
    vocab_size: int | None = Field(
        None,
        ge=2,
        le=10_000_000,
        description="Vocabulary size. Default: data.tokenizer's (256 for `byte`), filled in when the spec is loaded; a larger value pads the embedding.",
    )
    depth_parametrization: Literal["none", "depth-mup", "completep"] = Field(
        "none",
        description="How residual branches, hidden LRs and Adam's ε scale with depth L relative to `base_depth` "
        "(hptransfer.models.depth): `none` (standard residuals), `depth-mup` (branch ×(L/L_base)^-1/2, hidden LR "
        "×(L/L_base)^-1/2) or `completep` (branch ×L_base/L, hidden LR unchanged; arXiv 2505.01618). llama and hf only.",
    )
    base_depth: int | None = Field(
        None, ge=1, le=10_000, description="Depth the depth parametrization is relative to. Default: `depth`."
    )

    @field_validator("config", mode="before")
    @classmethod
    def _config(cls, v: Any) -> Any:
        if isinstance(v, (str, Path)):
            return _read_config_json(v)
        if isinstance(v, dict) and not isinstance(v.get("model_type"), str):
            raise ValueError("an inline model.config needs `model_type` (e.g. llama, mistral, qwen2, gpt2, gpt_neox)")
        return v

    @model_validator(mode="after")
    def _family(self) -> ModelSpec:
        if self.family == "mlp" and self.depth_parametrization != "none":
            raise ValueError(
                f"model.depth_parametrization={self.depth_parametrization!r} needs residual blocks whose branches end in a "
                "linear layer (family llama or hf); the mlp family's blocks end in a GELU: use depth_parametrization: none"
            )
        if self.family != "hf":
            given = [k for k in ("config", "n_heads") if getattr(self, k) is not None]
            given += ["attn_scale"] if self.attn_scale != "1/sqrt(d)" else []
            if given:
                raise ValueError(
                    f"model.{', model.'.join(given)} apply to family hf only (family is {self.family!r}); "
                    "remove them or set family: hf"
                )
            return self
        if self.config is None:
            raise ValueError(
                "family hf needs model.config: a mapping with model_type (e.g. {model_type: qwen2}) "
                "or the path of a local config.json"
            )
        problems = _hf_config_problems(self.config)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def at_depth(self, depth: int | None) -> ModelSpec:
        """This model with `depth` blocks, its depth rule still relative to this model's base depth."""
        if depth is None or depth == self.depth:
            return self
        return self.model_copy(update={"depth": depth, "base_depth": self.base_depth or self.depth})

    @property
    def vocab(self) -> int:
        """The vocabulary the model is built with."""
        return self.vocab_size or BYTE_VOCAB

    def width_problems(self, widths: list[int]) -> list[str]:
        """Why some widths cannot be built by this family (empty when all can)."""
        if self.family == "llama":
            bad = [w for w in widths if w % self.head_dim]
            return (
                [f"widths {bad} are not multiples of model.head_dim={self.head_dim}; llama width = n_heads × head_dim"]
                if bad
                else []
            )
        if self.family == "hf":
            return architectures.width_problems(self, widths)
        return []


def _read_config_json(v: str | Path) -> dict[str, Any]:
    path = Path(v).expanduser()
    try:
        path = path / "config.json" if path.is_dir() else path
        found = path.is_file()
    except OSError as e:  # e.g. a name longer than the filesystem allows
        raise ValueError(
            f"{str(v)[:80]!r} is not a usable path ({e.strerror}); give a local config.json "
            "(or its folder) or an inline mapping with model_type"
        ) from None
    if not found:
        raise ValueError(
            f"{path.resolve()} not found; give a local config.json (or its folder) or an inline mapping with model_type"
        )
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ValueError(f"{path} has no `model_type`; it must be a Hugging Face config.json")
    return data


def _hf_config_problems(config: dict[str, Any]) -> list[str]:
    mt = config["model_type"]
    try:
        cls = architectures.config_class(mt)
    except KeyError:
        return [
            f"model.config.model_type={mt!r} is unknown to transformers; check the spelling (llama, mistral, "
            "qwen2, gpt2, gpt_neox, ...) or upgrade transformers"
        ]
    if not architectures.is_causal_lm(mt):
        return [f"model.config.model_type={mt!r} is not a causal LM (AutoModelForCausalLM cannot build it)"]
    errs = []
    if "transformers_version" not in config and "architectures" not in config:  # written by hand: catch typos
        unknown = architectures.unknown_keys(config)
        if unknown:
            errs.append(f"model.config has keys {unknown} that {cls.__name__} does not know (typo?)")
    missing = architectures.missing_fields(mt)
    if missing:
        errs.append(
            f"model.config.model_type={mt!r} has no config fields {missing} for the width ladder to set; "
            "add its field names to hptransfer.models.families.ARCHITECTURES"
        )
    group = architectures.gqa_group(config)
    if group != int(group):
        errs.append(f"model.config: num_attention_heads is not a multiple of num_key_value_heads (group size {group:g})")
    return errs
