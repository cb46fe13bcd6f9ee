"""The private corpus of DP fine-tuning: installed packages' READMEs as bytes, split like the stdlib corpus."""

import hashlib
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch

from hptransfer.data import open_corpus
from hptransfer.data.prose_corpus import load_prose_corpus, prose_documents
from hptransfer.data.stdlib_corpus import ByteCorpus, load_corpus
from hptransfer.spec import DataSpec

_DIGESTS = """
import hashlib
from hptransfer.data.prose_corpus import load_prose_corpus
c = load_prose_corpus(0.1, 400)
print(*(hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in (c.train, c.val)))
"""


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def _docs(t: torch.Tensor) -> Counter:
    return Counter(bytes(t.numpy()).split(b"\x00")[:-1])


def _unigram(t: torch.Tensor) -> torch.Tensor:
    h = torch.bincount(t.long(), minlength=256).double()
    return h / h.sum()


@pytest.fixture(scope="module")
def prose() -> ByteCorpus:
    return load_prose_corpus(0.1, 400)


def test_same_bytes_in_another_process(prose):
    # Another PYTHONHASHSEED and a fresh importlib scan: no `hash()`, no listing order in the result.
    env = {**os.environ, "PYTHONHASHSEED": "4321"}
    r = subprocess.run([sys.executable, "-c", _DIGESTS], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [_digest(prose.train), _digest(prose.val)]


def test_what_the_process_imported_does_not_change_the_documents():
    # `import ray` puts ray/thirdparty_files (colorama's dist-info) on sys.path: a Ray worker and its
    # driver would read different corpora if the scan followed sys.path.
    before = prose_documents()
    import ray  # noqa: F401

    assert any(p.endswith("thirdparty_files") for p in sys.path)  # the trap is still there to avoid
    assert prose_documents() == before


def test_whole_documents_in_one_split_each_by_a_hash_of_the_name(prose):
    docs = prose_documents()
    names = [n for n, _ in docs]
    assert len(set(names)) == len(names) and "hptransfer" not in names
    val, train = _docs(prose.val), _docs(prose.train)
    assert not set(val) & set(train)  # disjoint
    assert sum(val.values()) == prose.n_val_files and sum(train.values()) == prose.n_train_files
    assert prose.n_train_files + prose.n_val_files == len(docs)
    # A smaller prefix keeps each document in the split it had (the split hashes the name, not the position).
    few = load_prose_corpus(0.1, 40)
    assert _docs(few.val) <= val and _docs(few.train) <= train


def test_non_trivial_size_and_a_different_distribution_from_the_stdlib(prose):
    assert prose.n_train_files >= 50 and prose.n_val_files >= 3
    assert prose.n_tokens["train"] >= 300_000 and prose.n_tokens["val"] >= 10_000
    text = bytes(prose.train[:200_000].numpy()).decode("utf-8", "replace")
    assert " the " in text and "install" in text.lower()  # English about packages
    stdlib = load_corpus(0.1, 400)
    p, s = _unigram(prose.train), _unigram(stdlib.train)
    tv_between = 0.5 * (p - s).abs().sum().item()
    tv_within = max(0.5 * (p - _unigram(prose.val)).abs().sum().item(), 0.5 * (s - _unigram(stdlib.val)).abs().sum().item())
    # Measured: 0.26 between the corpora, 0.06 between a corpus' own splits.
    assert tv_between > 2 * tv_within and tv_between > 0.15
    # Measured: spaces are 12% of prose bytes vs 29% of Python source (indentation), `_` 0.5% vs 1.5%.
    assert p[ord(" ")] < 0.6 * s[ord(" ")] and p[ord("_")] < 0.6 * s[ord("_")]


def test_spec_option_opens_the_same_corpus(prose):
    c = open_corpus(DataSpec(corpus="prose"), seq_len=64)
    assert isinstance(c, ByteCorpus) and c.vocab_size == 256
    assert _digest(c.train) == _digest(prose.train)
    x, y = c.batch("train", 3, 4, 64, seed=1)
    assert x.shape == (4, 64) and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="corpus is 'prose'"):
        DataSpec(corpus="prose", paths=("x.txt",))
