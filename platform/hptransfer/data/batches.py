"""Random windows: a batch is a pure function of (split, step, seed), so a resumed or re-run job,
and any number of workers each taking its slice, see the same data."""

from __future__ import annotations

import torch

VAL_SEED = 12345  # the fixed validation set every trial is scored on, whatever the trial's seed


def window_starts(n_tokens: int, split: str, step: int, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """Start offsets of batch `step`'s windows of seq_len + 1 tokens (inputs and next-token targets)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 2 + (split != "train"))
    return torch.randint(0, n_tokens - seq_len - 1, (batch_size,), generator=g)
