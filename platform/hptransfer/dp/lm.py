"""The private examples of DP language-model training, and Opacus' per-example gradients for µP.

**Examples.** One private example is one fixed-length sequence of `seq_len + 1` tokens cut from the
training split of the study's corpus (`data.load_corpus`): inputs are its first `seq_len` tokens,
targets the next-token shift. Sequences are consecutive and do not overlap, so every token of the
corpus belongs to at most one example: the DP guarantee is per sequence (not per document or per
author, which would need grouping by document). N is the number of such sequences, or the first
`dp.dataset_size` of them when the spec sets it (so N is what the accountant assumed).

**MuReadout.** Opacus looks up a per-example gradient rule by the module's exact type. µP's
`MuReadout` (a `nn.Linear` subclass whose forward scales its input by output_mult / width_mult)
would otherwise go to Opacus' functorch fallback, which re-runs its forward on parameters without
µP's `infshape` and fails. `register_mu_readout` adds the linear rule applied to the scaled input.
"""

from __future__ import annotations

import torch

from hptransfer.spec import DataSpec


def _train_tokens(data: DataSpec) -> torch.Tensor:
    from hptransfer.data import load_corpus

    return load_corpus(data.val_fraction, data.max_files).train


def sequence_count(data: DataSpec, seq_len: int) -> int:
    """M, the number of non-overlapping sequences of `seq_len + 1` tokens in the corpus' training
    split: the largest N a DP plan may assume."""
    return len(_train_tokens(data)) // (seq_len + 1)


def private_sequences(data: DataSpec, seq_len: int, n: int) -> torch.Tensor:
    """The N private examples, int64 [n, seq_len + 1]: the first `n` sequences in corpus order.
    Raises ValueError when the corpus has fewer."""
    train, m = _train_tokens(data), sequence_count(data, seq_len)
    if n > m:
        raise ValueError(f"the corpus has {m} sequences of {seq_len + 1} tokens, fewer than N={n}")
    return train[: n * (seq_len + 1)].long().view(n, seq_len + 1)


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
