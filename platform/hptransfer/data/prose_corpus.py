"""English prose that ships with the installed packages, as a byte-level corpus (vocabulary 256).

The private corpus of the DP fine-tuning regime (issue 26): a model pretrained on the standard
library's Python source (`stdlib_corpus`, the public corpus) is fine-tuned on text of a different
distribution. Each installed distribution's long description (the README that `pip` shows: the body
of `*.dist-info/METADATA`, markdown or reStructuredText, read with `importlib.metadata`) is one
document. Why these: they are on every machine that can run hptransfer (no download), they are
mostly English prose with some code blocks (a shifted distribution, not a disjoint alphabet, as
public → private fine-tuning is in practice), and there are enough of them (~150 documents, ~1.5 MB
in the project's environment). Licence texts were the alternative; they are few and repetitive.

Determinism: documents are keyed by the distribution's normalized name; the train/validation split
and the order are stable hashes of that key (as `stdlib_corpus` does with paths), so every machine
with the same packages (the same `constraints.txt`) gets the same bytes, whatever the order of the
directory listing or what the process has imported: only the interpreter's own site-packages are
read, not sys.path (`import ray` puts ray/thirdparty_files, with colorama's dist-info, on sys.path: a
Ray worker and its driver would read different corpora). hptransfer's own distribution is left out
(its README changes with every commit). Descriptions shorter than `MIN_BYTES` (stubs such as "UNKNOWN") are left out.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import re
import sysconfig

import torch

from hptransfer.data.stdlib_corpus import ByteCorpus, _bucket

MIN_BYTES = 500
_SEP = 0  # document boundary, as in stdlib_corpus
_EXCLUDE = {"hptransfer"}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _description(dist: md.Distribution) -> str:
    meta = dist.metadata
    # Metadata 2.1+ puts the description in the message body; older ones in a header field.
    body = meta.get_payload() if hasattr(meta, "get_payload") else None
    return (body or meta.get("Description") or "").strip()


def site_dirs() -> list[str]:
    """The interpreter's site-packages (the venv's): where the installed distributions are, whatever
    the process imported (see the module docstring)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(p for p in (paths["purelib"], paths["platlib"]) if p))


def prose_documents(min_bytes: int = MIN_BYTES) -> list[tuple[str, bytes]]:
    """(normalized distribution name, UTF-8 description) for every distribution installed in
    `site_dirs()` with a description of at least `min_bytes`, sorted by a stable hash of the name.
    The first of several installs of one name wins (as importlib's own lookup does)."""
    docs: dict[str, bytes] = {}
    for dist in md.distributions(path=site_dirs()):
        name = _normalized(dist.metadata.get("Name") or "")
        if not name or name in docs or name in _EXCLUDE:
            continue
        text = _description(dist).encode("utf-8", "replace").replace(b"\x00", b"")
        if len(text) >= min_bytes:
            docs[name] = text
    # Sorting by hash (not name) makes any prefix a fair sample of the installed packages.
    return sorted(docs.items(), key=lambda kv: _bucket("prose:" + kv[0]))


@functools.lru_cache(maxsize=4)
def load_prose_corpus(val_fraction: float = 0.1, max_files: int | None = 400) -> ByteCorpus:
    """The prose corpus: the same `ByteCorpus` type (and `batch`/`val_batches`) as `load_corpus`.
    Whole documents go to train or validation by a salted hash of the distribution name."""
    docs = prose_documents()
    if max_files:
        docs = docs[:max_files]
    train, val = [], []
    for name, text in docs:
        (val if _bucket("split:" + name) < val_fraction else train).append(text + bytes([_SEP]))
    if not train or not val:
        raise RuntimeError(
            f"prose corpus split is empty (train={len(train)}, val={len(val)} documents from "
            f"{len(docs)} installed distributions with a description of >= {MIN_BYTES} bytes); "
            "raise data.max_files or data.val_fraction, or use corpus: stdlib"
        )
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
    return ByteCorpus(as_tensor(train), as_tensor(val), len(train), len(val))
