"""The standard library's .py files as a byte-level corpus (vocabulary 256), no downloads.

Files go to train or validation by a stable hash of their path relative to the stdlib root, so the
split is the same on every machine with the same Python and does not depend on directory order.
Batches are a pure function of (split, step, seed): a resumed or re-run job sees the same data.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from hptransfer.data.batches import VAL_SEED, window_starts

VOCAB_SIZE = 256
_SEP = 0  # NUL never occurs in source text: it marks file boundaries.


def _bucket(rel_path: str) -> float:
    """A path's stable position in [0, 1)."""
    h = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path]]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = [
        (p.relative_to(root).as_posix(), p)
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts
    ]
    # Sorting by hash (not name) makes any prefix of the list a fair sample of the library.
    return sorted(files, key=lambda rp: _bucket(rp[0]))


@dataclass(frozen=True)
class ByteCorpus:
    train: torch.Tensor  # uint8, 1-D
    val: torch.Tensor
    n_train_files: int
    n_val_files: int
    vocab_size = VOCAB_SIZE  # the `byte` tokenizer (a class attribute, not a field)

    @property
    def n_tokens(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val)}

    def batch(self, split: str, step: int, batch_size: int, seq_len: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number `step` of `split`: (inputs, next-byte targets), int64 [batch_size, seq_len]."""
        data = self.train if split == "train" else self.val
        starts = window_starts(len(data), split, step, batch_size, seq_len, seed)
        idx = starts[:, None] + torch.arange(seq_len + 1)
        chunk = data[idx].long()
        return chunk[:, :-1], chunk[:, 1:]

    def val_batches(self, n: int, batch_size: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The fixed validation set every trial is scored on (independent of the trial's seed)."""
        return [self.batch("val", i, batch_size, seq_len, seed=VAL_SEED) for i in range(n)]


@functools.lru_cache(maxsize=4)
def load_corpus(val_fraction: float = 0.1, max_files: int | None = 400) -> ByteCorpus:
    files = stdlib_files()
    if max_files:
        files = files[:max_files]
    train, val = [], []
    for rel, path in files:
        # Re-hash with a salt so the train/val split is independent of the max_files prefix order.
        target = val if _bucket("split:" + rel) < val_fraction else train
        target.append(path.read_bytes().replace(b"\x00", b"") + bytes([_SEP]))
    if not train or not val:
        raise RuntimeError(
            f"stdlib corpus split is empty (train={len(train)}, val={len(val)} files); "
            "raise data.max_files or adjust data.val_fraction"
        )
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
    return ByteCorpus(as_tensor(train), as_tensor(val), len(train), len(val))
