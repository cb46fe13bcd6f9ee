"""The private examples of DP language-model training, and Opacus' per-example gradients for µP.

**Examples.** One private example is one fixed-length sequence of `seq_len + 1` tokens cut from the
training split of the study's corpus (`data.open_corpus`: the stdlib bytes, or your own text, JSONL or
Parquet files tokenized by `hpt data prepare`): inputs are its first `seq_len` tokens,
targets the next-token shift. Sequences are consecutive and do not overlap, so every token of the
corpus belongs to at most one example: the DP guarantee is per sequence (not per document or per
author, which would need grouping by document). N is the number of such sequences, or the first
`dp.dataset_size` of them when the spec sets it (so N is what the accountant assumed).

**The starting model.** A fresh model (`models.training_setup`), or with `dp.init_from` the weights
of a model handed off by an earlier study (`models.handoff`: Hugging Face weights with µP's readout
multiplier folded in). `load_init_from` copies them into the plan's model and unfolds the readout with
the plan's own multiplier, so the model starts computing exactly the handed-off model's logits
whatever base width either study used.

**MuReadout.** Opacus looks up a per-example gradient rule by the module's exact type. µP's
`MuReadout` (a `nn.Linear` subclass whose forward scales its input by output_mult / width_mult)
would otherwise go to Opacus' functorch fallback, which re-runs its forward on parameters without
µP's `infshape` and fails. `register_mu_readout` adds the linear rule applied to the scaled input.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hptransfer.spec import DataSpec


def sequence_count(data: DataSpec, seq_len: int) -> int:
    """M, the number of non-overlapping sequences of `seq_len + 1` tokens in the corpus' training
    split: the largest N a DP plan may assume."""
    from hptransfer.data import open_corpus

    return open_corpus(data).n_tokens["train"] // (seq_len + 1)


def private_sequences(data: DataSpec, seq_len: int, n: int, split: str = "train") -> torch.Tensor:
    """The N private examples, int64 [n, seq_len + 1]: the first `n` non-overlapping sequences of
    `split` in corpus order. Raises ValueError when the corpus has fewer."""
    import numpy as np

    from hptransfer.data import open_corpus

    corpus = open_corpus(data)
    m = corpus.n_tokens[split] // (seq_len + 1)
    if n > m:
        where = "the corpus" if split == "train" else f"the corpus' {split} split"
        raise ValueError(f"{where} has {m} sequences of {seq_len + 1} tokens, fewer than N={n}")
    tokens = (corpus.train if split == "train" else corpus.val)[
        : n * (seq_len + 1)
    ]  # a uint8 tensor (stdlib) or a memory-mapped array (files)
    tokens = tokens if isinstance(tokens, torch.Tensor) else torch.from_numpy(np.asarray(tokens).astype(np.int64))
    return tokens.long().view(n, seq_len + 1)


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def check_init_from(folder: str | Path, model: torch.nn.Module) -> list[str]:
    """Why `folder` cannot start `model` (the plan's, e.g. built on the meta device): empty when it
    can. Compares tensor names and shapes from the safetensors headers; loads no weights."""
    from safetensors import safe_open

    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return [f"{folder} is not a folder; give an earlier study's train/hf_model"]
    files = _weight_files(folder)
    if not files:
        return [
            f"{folder} holds no *.safetensors weights (the `mlp` family has no Hugging Face form; hand off a llama or hf model)"
        ]
    shapes = {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})  # noqa: SIM118
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing, extra = sorted(set(want) - set(shapes)), sorted(set(shapes) - set(want))
    wrong = [f"{k}: {shapes[k]} vs the plan's {want[k]}" for k in sorted(set(want) & set(shapes)) if shapes[k] != want[k]]
    out = []
    if missing:
        out.append(f"the plan's model has tensors the handed-off model lacks: {missing[:4]}")
    if extra:
        out.append(f"the handed-off model has tensors the plan's lacks: {extra[:4]}")
    if wrong:
        out.append("shapes differ: " + "; ".join(wrong[:4]))
    return out


@torch.no_grad()
def load_init_from(model: torch.nn.Module, folder: str | Path) -> None:
    """Copy the handed-off weights in `folder` into `model` (strict), unfolding the readout: the
    file holds c·W, the plan's readout multiplies its input by its own c′, so it gets c·W / c′."""
    from safetensors.torch import load_file

    from hptransfer.models.handoff import readout_scale

    state = {}
    for f in _weight_files(Path(folder).expanduser()):
        state.update(load_file(str(f)))
    head = model.get_output_embeddings()
    _, output_mult, width_mult = readout_scale(head)
    key = next(n for n, m in model.named_modules() if m is head) + ".weight"
    state[key] = (state[key].double() / (output_mult / width_mult)).to(state[key].dtype)
    model.load_state_dict(state, strict=True)


_REGISTERED = False


def register_mu_readout() -> None:
    """Teach Opacus µP's readout (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from mup import MuReadout
    from opacus.grad_sample.utils import register_grad_sampler

    @register_grad_sampler(MuReadout)
    def _mu_readout(layer, activations, backprops):
        # forward: W · (output_mult · x / width_mult) (+ b); the linear rule on that input.
        x = activations[0].to(backprops.dtype) * (layer.output_mult / layer.width_mult())
        out = {}
        if layer.weight.requires_grad:
            out[layer.weight] = torch.einsum("n...i,n...j->nij", backprops, x)
        if layer.bias is not None and layer.bias.requires_grad:
            out[layer.bias] = torch.einsum("n...k->nk", backprops)
        return out

    _REGISTERED = True
