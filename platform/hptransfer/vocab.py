"""The tokenizer a spec names, as far as the spec's validation needs it: `byte` (UTF-8 bytes,
vocabulary 256) or a local tokenizer folder loaded with `AutoTokenizer` (offline:
`local_files_only`): the folder's checks, its fingerprint and its vocabulary size, which the spec
copies into `model.vocab_size` when it is loaded (`fill_vocab_size`). A contract, below the data
stage (`hptransfer.data.tokenizer` encodes documents with it); transformers is imported only when a
folder is loaded.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from hptransfer.errors import DataError, Problem

BYTE = "byte"
BYTE_VOCAB = 256
# What AutoTokenizer reads from a folder; at least one of the first five must be there.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
)


def folder(path: str) -> Path:
    return Path(path).expanduser()


def folder_problem(path: str) -> str | None:
    """Why `path` is not a tokenizer folder (None when it is one)."""
    p = folder(path)
    try:
        exists = p.exists()
    except OSError as e:  # e.g. a name longer than the filesystem allows
        return f"{str(path)[:80]!r} is not a usable path ({e.strerror}); give a local tokenizer folder or `byte`"
    if not exists:
        return f"{p} not found; give a local tokenizer folder (what `tokenizer.save_pretrained(DIR)` writes) or `byte`"
    if not p.is_dir():
        return f"{p} is a file; give the folder that holds it (tokenizer.json with tokenizer_config.json)"
    if not any((p / n).is_file() for n in TOKENIZER_FILES[:5]):
        return (
            f"{p} is a folder without a tokenizer (none of {', '.join(TOKENIZER_FILES[:5])}); save one there "
            f"with `tokenizer.save_pretrained('{p}')`, or use tokenizer: byte"
        )
    return None


def fingerprint(path: str) -> str:
    """sha256 over the tokenizer files of a folder (names and bytes), not the model weights beside them."""
    h = hashlib.sha256()
    for name in sorted(n for n in TOKENIZER_FILES if (folder(path) / n).is_file()):
        h.update(name.encode() + b"\0" + (folder(path) / name).read_bytes() + b"\0")
    return h.hexdigest()


@lru_cache(maxsize=8)
def _auto(path: str, fp: str) -> Any:  # keyed by fingerprint: an edited folder loads again
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()  # "sequence longer than model_max_length": we cut windows ourselves
    return AutoTokenizer.from_pretrained(str(folder(path)), local_files_only=True)


def load_hf(path: str) -> Any:
    problem = folder_problem(path)
    if problem:
        raise DataError("data.tokenizer", [Problem("data.tokenizer", problem)])
    try:
        return _auto(str(folder(path)), fingerprint(path))
    except Exception as e:  # AutoTokenizer raises OSError, ValueError, KeyError, ... for broken folders
        raise DataError(
            "data.tokenizer",
            [
                Problem(
                    "data.tokenizer",
                    f"{folder(path)}: AutoTokenizer cannot load it ({type(e).__name__}: {e})",
                    fix="re-save it with tokenizer.save_pretrained(DIR)",
                )
            ],
        ) from None


def vocab_size(name: str) -> int:
    return BYTE_VOCAB if name == BYTE else len(load_hf(name))


def _absolute(name: str) -> str:
    return name if name == BYTE or folder(name).is_absolute() else str(Path.cwd() / name)


def fill_vocab_size(data: Any, tokenizer: str) -> Any:
    """A raw spec mapping with `model.vocab_size` set to the tokenizer's, unless given or unreadable
    (then `tokenizer_problems` reports why)."""
    model = data.get("model")
    given = model.get("vocab_size") if isinstance(model, dict) else getattr(model, "vocab_size", None)
    if given is not None or folder_problem(_absolute(tokenizer)):
        return data
    try:
        v = vocab_size(_absolute(tokenizer))
    except DataError:
        return data
    if model is None or isinstance(model, dict):
        return {**data, "model": {**(model or {}), "vocab_size": v}}
    return {**data, "model": model.model_copy(update={"vocab_size": v})}


def tokenizer_problems(name: str, model_vocab: int | None) -> list[str]:
    """Spec-level checks of data.tokenizer (messages name the YAML path)."""
    try:
        n = vocab_size(name)
    except DataError as e:
        return [str(p) for p in e.problems]
    if model_vocab is not None and model_vocab < n:
        return [
            f"model.vocab_size={model_vocab} is smaller than data.tokenizer's vocabulary {n}; remove "
            "model.vocab_size (it follows the tokenizer) or raise it"
        ]
    return []
