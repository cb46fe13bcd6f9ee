"""Training tokens, offline: Python's standard library or the installed packages' READMEs as bytes, or your local files (text, JSON
Lines, Parquet) tokenized once with `byte` or a local tokenizer (`hpt data prepare`).
`open_corpus(spec.data)` is the entry point."""

from hptransfer.data.corpus import Corpus, check_size, open_corpus
from hptransfer.data.errors import DataError
from hptransfer.data.prepared import TokenCorpus, prepare
from hptransfer.data.prose_corpus import load_prose_corpus
from hptransfer.data.stdlib_corpus import ByteCorpus, load_corpus

__all__ = [
    "ByteCorpus",
    "Corpus",
    "DataError",
    "TokenCorpus",
    "check_size",
    "load_corpus",
    "load_prose_corpus",
    "open_corpus",
    "prepare",
]
