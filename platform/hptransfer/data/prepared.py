"""Prepared data: local files tokenized once into memory-mapped token files, reused while fresh.

    <data.cache_dir>/<key>/   key = sha256(paths, format, text_field, tokenizer, val_fraction, version)
        train.bin, val.bin    token ids, one flat array per split (uint8/16/32 by vocabulary size),
                              documents joined by the tokenizer's separator; read with numpy.memmap
        manifest.json         inputs (path, size, mtime, sha256, documents, tokens per split), the
                              tokenizer (folder, sha256 of its files, vocabulary, separator), the split
                              rule and the token counts

Split: a document goes to validation when the sha256 of its text, read as a number in [0, 1), is
below val_fraction — the same on every machine, in any file order, after any re-preparation, and a
duplicated document never straddles the split.

Fresh means: the globs match the same files, each with its recorded size and mtime or else its
recorded sha256, and the tokenizer's files hash the same. Anything else prepares again: `hpt data
prepare SPEC` up front, or the first sweep trial, coordinate check or large-run worker that opens it.
A lock file serialises preparers (two trials starting together prepare once); the new folder
replaces the old one by a rename.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hptransfer.data import tokenizer as tokenizers
from hptransfer.data.batches import VAL_SEED, window_starts
from hptransfer.data.errors import DataError
from hptransfer.data.files import documents, file_format, input_files, sha256_file
from hptransfer.io import write_json

if TYPE_CHECKING:
    from hptransfer.spec import DataSpec

PREP_VERSION = 1
MANIFEST, TRAIN_BIN, VAL_BIN = "manifest.json", "train.bin", "val.bin"
SPLIT_FILES = {"train": TRAIN_BIN, "val": VAL_BIN}


def cache_key(data: DataSpec) -> str:
    what = {
        "paths": list(data.paths),
        "format": data.format,
        "text_field": data.text_field,
        "tokenizer": data.tokenizer,
        "val_fraction": data.val_fraction,
        "version": PREP_VERSION,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def prepared_dir(data: DataSpec) -> Path:
    return Path(data.cache_dir).expanduser() / cache_key(data)


def doc_bucket(text: str) -> float:
    """A document's stable position in [0, 1)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint8 if vocab_size <= 1 << 8 else np.uint16 if vocab_size <= 1 << 16 else np.uint32)


@dataclass(frozen=True)
class Prepared:
    folder: Path
    manifest: dict[str, Any]
    reused: bool
    reason: str  # why it was prepared ("" when reused)


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def stale_reason(data: DataSpec, folder: Path, files: list[Path]) -> str | None:
    """Why the prepared folder cannot be used for these inputs (None: it can)."""
    m = read_manifest(folder)
    if m is None:
        return "not prepared yet"
    if m.get("version") != PREP_VERSION:
        return f"prepared by format version {m.get('version')}, this hptransfer writes {PREP_VERSION}"
    if any(not (folder / n).is_file() for n in SPLIT_FILES.values()):
        return "token files missing"
    recorded = {i["path"]: i for i in m["inputs"]}
    now = {str(f) for f in files}
    if now != set(recorded):
        added, removed = sorted(now - set(recorded)), sorted(set(recorded) - now)
        return f"input files changed (added {added[:3]}, removed {removed[:3]})"
    for f in files:
        r, st = recorded[str(f)], f.stat()
        if (st.st_size, st.st_mtime_ns) != (r["size"], r["mtime_ns"]) and sha256_file(f) != r["sha256"]:
            return f"{f} changed"
    tok = data.tokenizer
    if (
        tok != tokenizers.BYTE
        and tokenizers.folder_problem(tok) is None
        and tokenizers.fingerprint(tok) != m["tokenizer"]["sha256"]
    ):
        return f"the tokenizer in {tok} changed"
    return None


def prepare(data: DataSpec, *, force: bool = False, log: Callable[[str], None] | None = None) -> Prepared:
    """Tokenize `data`'s files into its prepared folder unless a fresh one is there (see the module
    docstring). Raises DataError listing every unusable input file."""
    files = input_files(data)
    folder = prepared_dir(data)
    with _locked(folder.parent / f"{folder.name}.lock"):
        reason = "--force" if force else stale_reason(data, folder, files)
        if reason is None:
            return Prepared(folder, read_manifest(folder) or {}, True, "")
        if log:
            log(f"preparing data ({reason}): {len(files)} file(s) → {folder}")
        return Prepared(folder, _write(data, files, folder), False, reason)


def _write(data: DataSpec, files: list[Path], folder: Path) -> dict[str, Any]:
    tok = tokenizers.load(data.tokenizer)
    dtype = token_dtype(tok.vocab_size)
    tmp = folder.parent / f"{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    inputs, problems = [], []
    try:
        with contextlib.ExitStack() as stack:
            outs = {split: stack.enter_context(open(tmp / name, "wb")) for split, name in SPLIT_FILES.items()}
            for f in files:
                try:
                    inputs.append(_tokenize_file(f, data, tok, dtype, outs))
                except DataError as e:  # keep going: every file's problems are reported at once
                    problems += e.problems
        if problems:
            raise DataError("data.paths", problems)
        manifest = {
            "version": PREP_VERSION,
            "created": dt.datetime.now().isoformat(timespec="seconds"),
            "inputs": inputs,
            "format": data.format,
            "text_field": data.text_field,
            "tokenizer": {"name": tok.name, "sha256": tok.fingerprint, "vocab_size": tok.vocab_size, "separator": tok.separator},
            "split": {
                "val_fraction": data.val_fraction,
                "rule": "validation iff sha256(document text)[:8] / 2**64 < val_fraction",
            },
            "dtype": dtype.name,
            "tokens": {s: sum(i["tokens"][s] for i in inputs) for s in SPLIT_FILES},
            "documents": {s: sum(i["documents"][s] for i in inputs) for s in SPLIT_FILES},
        }
        write_json(tmp / MANIFEST, manifest)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tokenize_file(f: Path, data: DataSpec, tok: tokenizers.Tokenizer, dtype: np.dtype, outs: dict) -> dict[str, Any]:
    st = f.stat()
    tokens, docs = dict.fromkeys(SPLIT_FILES, 0), dict.fromkeys(SPLIT_FILES, 0)
    for batch in documents(f, data):
        parts: dict[str, list[list[int]]] = {s: [] for s in SPLIT_FILES}
        for text, ids in zip(batch, tok.encode(batch)):
            split = "val" if doc_bucket(text) < data.val_fraction else "train"
            parts[split].append(ids if tok.separator is None else [*ids, tok.separator])
        for split, seqs in parts.items():
            if seqs:
                arr = np.fromiter((t for s in seqs for t in s), dtype=dtype)
                arr.tofile(outs[split])
                tokens[split] += len(arr)
                docs[split] += len(seqs)
    return {
        "path": str(f),
        "format": file_format(f, data),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": sha256_file(f),
        "documents": docs,
        "tokens": tokens,
    }


@dataclass(frozen=True)
class TokenCorpus:
    """A prepared corpus: the same interface as the stdlib's ByteCorpus (`batch`, `val_batches`,
    `vocab_size`, `n_tokens`), over memory-mapped token files shared by every process that opens them."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    folder: Path

    @classmethod
    def open(cls, folder: Path, manifest: dict[str, Any]) -> TokenCorpus:
        dtype = np.dtype(manifest["dtype"])

        def mm(name: str) -> np.ndarray:
            path = folder / name
            return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)

        return cls(mm(TRAIN_BIN), mm(VAL_BIN), int(manifest["tokenizer"]["vocab_size"]), folder)

    @property
    def n_tokens(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val)}

    def batch(self, split: str, step: int, batch_size: int, seq_len: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number `step` of `split`: (inputs, next-token targets), int64 [batch_size, seq_len]."""
        data = self.train if split == "train" else self.val
        starts = window_starts(len(data), split, step, batch_size, seq_len, seed)
        chunk = torch.from_numpy(np.stack([data[s : s + seq_len + 1] for s in starts.tolist()]).astype(np.int64))
        return chunk[:, :-1], chunk[:, 1:]

    def val_batches(self, n: int, batch_size: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The fixed validation set every trial is scored on (independent of the trial's seed)."""
        return [self.batch("val", i, batch_size, seq_len, seed=VAL_SEED) for i in range(n)]
