"""Build a byte-level causal LM of a given width under SP or µP.

µP (Tensor Programs V, via the `mup` package): the model's shapes are compared with a base model
(width = base_width) and a delta model (2 × base_width) so `mup` knows which dimensions grow; the
output layer is a `MuReadout` (multiplies its input by output_mult / width_mult, zero init), hidden
matrices get init std ∝ 1/√fan_in (`mup.init.normal_`), and `MuAdamW` divides their LR by
width_mult. SP uses the same hidden init (std ∝ 1/√fan_in, equal to µP at the base width) with a
plain `nn.Linear` readout and one global LR, so the two differ exactly where µP says they should.

Llama: width = n_heads × head_dim with head_dim fixed, so the 1/√head_dim attention scaling is
already width-independent (µP's 1/d rule matters only when head_dim itself grows).

Family `hf`: any Hugging Face causal LM, its config at each width from hptransfer.models.families.
The output layer becomes µP's readout: `MuReadout` (zero init), or `MuSharedReadout` when the config
ties embeddings (GPT-2): the readout *is* the input embedding, read through 1/width_mult. GPT-2's
`Conv1D` layers store weights transposed (in, out); µP's init and MuAdamW only use their width_mult,
which is the same for both dimensions of a hidden matrix here (every growing dimension grows by one
factor), and our SP init reads the fan-in from dimension 0 for them.

The vocabulary is `ModelSpec.vocab` (the tokenizer's, 256 for bytes).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from hptransfer.hyperparameters import Hyperparameters
from hptransfer.spec import BYTE_VOCAB, ModelSpec


class ScaledReadout(nn.Linear):
    """SP's readout with the tunable `output_mult` on its input (µP's MuReadout does the same and
    also divides by width_mult). A plain Linear when output_mult = 1."""

    def __init__(self, in_features: int, out_features: int, output_mult: float = 1.0):
        super().__init__(in_features, out_features, bias=False)
        self.output_mult = output_mult

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.output_mult)


class ByteMLP(nn.Module):
    """A per-position MLP LM over the current and previous byte: cheap, for fast tests."""

    def __init__(self, width: int, depth: int, vocab: int = BYTE_VOCAB, readout: nn.Module | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.prev_embed = nn.Embedding(vocab, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.lm_head = readout if readout is not None else nn.Linear(width, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        prev = torch.nn.functional.pad(input_ids[:, :-1], (1, 0))
        h = self.embed(input_ids) + self.prev_embed(prev)
        for layer in self.hidden:
            h = h + torch.nn.functional.gelu(layer(h))
        return self.lm_head(self.norm(h))


def _llama(spec: ModelSpec, width: int, readout: nn.Module | None):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=width,
        intermediate_size=round(spec.ffn_mult * width),
        num_hidden_layers=spec.depth,
        num_attention_heads=width // spec.head_dim,
        num_key_value_heads=width // spec.head_dim,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.seq_len,
        tie_word_embeddings=False,  # µP needs its own readout; tying also breaks Opacus ghost clipping
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    if readout is not None:
        model.lm_head = readout
    return model


def _hf(spec: ModelSpec, width: int):
    from transformers import AutoModelForCausalLM

    from hptransfer.models.families import hf_config

    return AutoModelForCausalLM.from_config(hf_config(spec, width), dtype=torch.float32)


def _hf_readout(model: nn.Module, width: int, vocab: int, mup: bool, output_mult: float) -> None:
    """Swap the HF head for µP's readout (tied: one sharing the input embedding) or SP's ScaledReadout."""
    old = model.get_output_embeddings()
    bias = getattr(old, "bias", None) is not None
    tied = old.weight is model.get_input_embeddings().weight
    if mup:
        from mup import MuReadout, MuSharedReadout

        head = (
            MuSharedReadout(model.get_input_embeddings().weight, bias=bias, output_mult=output_mult)
            if tied
            else MuReadout(width, vocab, bias=bias, readout_zero_init=True, output_mult=output_mult)
        )
    else:
        head = ScaledReadout(width, vocab, output_mult)
        if bias:
            head.bias = nn.Parameter(torch.zeros(vocab))
        if tied:
            head.weight = model.get_input_embeddings().weight
    model.set_output_embeddings(head)


def _raw(spec: ModelSpec, width: int, mup: bool, output_mult: float = 1.0):
    vocab = spec.vocab
    if spec.family == "hf":
        model = _hf(spec, width)
        _hf_readout(model, width, vocab, mup, output_mult)
        return model
    if mup:
        from mup import MuReadout

        readout = MuReadout(width, vocab, bias=False, readout_zero_init=True, output_mult=output_mult)
    else:
        readout = ScaledReadout(width, vocab, output_mult)
    if spec.family == "llama":
        return _llama(spec, width, readout)
    return ByteMLP(width, spec.depth, vocab=vocab, readout=readout)


@functools.lru_cache(maxsize=32)
def _base_and_delta_shapes(spec_json: str, base_width: int) -> tuple[dict, dict]:
    """The parameter shapes of the base (base_width) and delta (2 × base_width) models, built on the
    meta device. Cached per process: a sweep's reused trial process builds them once, not for every
    trial (two extra Llama constructions a trial: ~0.15 s each of a 3 s proxy trial on a busy core)."""
    from mup.shape import get_shapes

    spec = ModelSpec.model_validate_json(spec_json)
    with torch.device("meta"):
        return get_shapes(_raw(spec, base_width, True)), get_shapes(_raw(spec, 2 * base_width, True))


def _set_base_shapes(model: nn.Module, spec: ModelSpec, base_width: int, rescale_params: bool) -> None:
    """µP base shapes against a base (base_width) and a delta (2 × base_width) model: only their
    shapes are read (mup accepts shape dicts for both)."""
    from mup import set_base_shapes

    base, delta = _base_and_delta_shapes(spec.model_dump_json(), base_width)
    set_base_shapes(model, dict(base), delta=dict(delta), rescale_params=rescale_params)


def build_model(
    spec: ModelSpec, width: int, *, base_width: int, hps: Hyperparameters | None = None, seed: int | None = None
) -> nn.Module:
    """The model at `width` with the hyperparameters applied at construction (`init_std`,
    `output_mult`); under µP its base shapes are set (every parameter has `.infshape`)."""
    hps = hps or Hyperparameters()
    if seed is not None:
        torch.manual_seed(seed)
    mup = spec.parametrization == "mup"
    model = _raw(spec, width, mup, hps.output_mult)
    if mup:
        _set_base_shapes(model, spec, base_width, rescale_params=True)
    _init(model, hps.init_std, base_width, mup)
    from hptransfer.models.depth import depth_scaling, scale_branch_init

    if (depth := depth_scaling(spec)) is not None and not depth.identity:
        scale_branch_init(model, depth)  # the depth rule's branch multiplier, folded into the initial weights
    if spec.family == "hf":
        from hptransfer.models.families import apply_attn_scale

        apply_attn_scale(model, spec, base_width)
    return model


@torch.no_grad()
def _init(model: nn.Module, std: float, base_width: int, mup: bool) -> None:
    """Embeddings N(0, std); hidden matrices std·√(base_width / fan_in) (µP: mup's normal_, the same
    at the base width); µP readouts zero (a tied one is the embedding, initialised as such); biases 0."""
    from mup import MuReadout
    from mup.init import normal_ as mup_normal_
    from transformers.pytorch_utils import Conv1D

    embedding = getattr(model, "get_input_embeddings", lambda: None)()
    for module in model.modules():
        tied = embedding is not None and getattr(module, "weight", None) is embedding.weight and module is not embedding
        if tied:
            pass
        elif isinstance(module, MuReadout):
            if module.readout_zero_init:
                module.weight.zero_()
            else:
                mup_normal_(module.weight, std=std)
        elif isinstance(module, (nn.Linear, Conv1D)):
            fan_in = module.weight.shape[1 if isinstance(module, nn.Linear) else 0]  # Conv1D stores (in, out)
            if mup:
                mup_normal_(module.weight, std=std)  # std / √width_mult for matrix-like weights
            else:
                module.weight.normal_(0.0, std * math.sqrt(base_width / fan_in))
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
        if getattr(module, "bias", None) is not None and isinstance(module, (nn.Linear, Conv1D)):
            module.bias.zero_()


def lm_logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] from either family (HF models return an output object)."""
    out = model(input_ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def lm_loss(logits, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every token of the batch, computed in fp32 whatever the
    logits' dtype (bf16 runs). `logits`: [B, T, V], or an HF output holding them (`.logits`), as a
    model wrapped by Opacus returns. The one loss of sweep trials, the large runs and DP trials."""
    logits = logits if isinstance(logits, torch.Tensor) else logits.logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, batches, precision: str = "fp32") -> float:
    """Mean cross-entropy over (input, target) batches, in eval mode, on the model's device (the
    batches are moved there) and in `precision` (`bf16`: under autocast, as the trial trained)."""
    from hptransfer.models.device import autocast, module_device

    device = module_device(model)
    model.eval()
    total = 0.0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast(device, precision):
            logits = lm_logits(model, x)
        total += lm_loss(logits, y).item()
    model.train()
    return total / len(batches)


def param_count(model: nn.Module, non_embedding: bool = False) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if not (non_embedding and "embed" in n))
