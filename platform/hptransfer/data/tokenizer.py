"""Tokenizers: `byte` (UTF-8 bytes, vocabulary 256, today's default) or a local tokenizer folder
loaded with `AutoTokenizer` (offline: `local_files_only`). The model's vocabulary follows it: the
spec fills `model.vocab_size` from `len(tokenizer)` when it is loaded (`fill_vocab_size`, in
`hptransfer.vocab` with the folder checks the spec runs; re-exported here).

Documents are joined with a separator token: NUL for `byte` (as the stdlib corpus does), else the
tokenizer's end-of-sequence token (none when it has none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hptransfer.vocab import (  # noqa: F401  (re-exported: the data stage's names)
    BYTE,
    BYTE_VOCAB,
    TOKENIZER_FILES,
    fill_vocab_size,
    fingerprint,
    folder,
    folder_problem,
    load_hf,
    tokenizer_problems,
    vocab_size,
)

BYTE_SEPARATOR = 0  # NUL: removed from the text, so it only ever marks a document boundary


@dataclass(frozen=True)
class Tokenizer:
    name: str  # "byte" or the folder
    vocab_size: int
    separator: int | None  # token between documents
    fingerprint: str  # sha256 of what decides the token ids
    encode: Callable[[list[str]], list[list[int]]]  # documents → ids, no special tokens


def load(name: str) -> Tokenizer:
    if name == BYTE:
        return Tokenizer(
            BYTE, BYTE_VOCAB, BYTE_SEPARATOR, BYTE, lambda docs: [list(d.replace("\x00", "").encode("utf-8")) for d in docs]
        )
    tok = load_hf(name)
    sep = tok.eos_token_id
    return Tokenizer(
        str(folder(name)), len(tok), sep, fingerprint(name), lambda docs: tok(docs, add_special_tokens=False)["input_ids"]
    )
