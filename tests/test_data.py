"""The offline corpus: a stable, disjoint split and batches that are a pure function of the step."""

import hashlib
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch

from hptransfer.data.stdlib_corpus import load_corpus, stdlib_files

# A fresh interpreter (another PYTHONHASHSEED) prints digests of the corpus and of its validation batches.
_DIGESTS = """
import hashlib, torch
from hptransfer.data.stdlib_corpus import load_corpus
c = load_corpus(0.1, 40)
vb = torch.cat([torch.cat([x, y], 1) for x, y in c.val_batches(3, 4, 32)])
print(*(hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in (c.train, c.val, vb)))
"""


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def other_process() -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    r = subprocess.run([sys.executable, "-c", _DIGESTS], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()


def _in_val(rel: str, fraction: float) -> bool:
    """The documented rule: a file goes to validation by a stable (SHA-256) hash of its path alone."""
    h = hashlib.sha256(f"split:{rel}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < fraction


def _file_bytes(path) -> bytes:
    return path.read_bytes().replace(b"\x00", b"") + b"\x00"  # NUL ends each file


def _parts(t: torch.Tensor) -> Counter:
    """The whole files a split holds (NUL-separated), as a multiset: some files have equal bytes."""
    return Counter(bytes(t.numpy()).split(b"\x00")[:-1])


def test_load_corpus_splits_whole_files_by_a_hash_of_their_path(other_process):
    files = stdlib_files()[:40]
    c = load_corpus(0.1, 40)
    val = [p for rel, p in files if _in_val(rel, 0.1)]
    train = [p for rel, p in files if not _in_val(rel, 0.1)]
    assert val and train  # both splits hold files
    # Each file whole, in exactly one split (the one its path hashes to), in listing order.
    assert bytes(c.val.numpy()) == b"".join(map(_file_bytes, val))
    assert bytes(c.train.numpy()) == b"".join(map(_file_bytes, train))
    assert (c.n_val_files, c.n_train_files) == (len(val), len(train))
    # The same split in another process (another PYTHONHASHSEED: no `hash()` anywhere).
    assert other_process[:2] == [_digest(c.train), _digest(c.val)]
    # A file's split depends on its path only, not on which other files are loaded ...
    more = load_corpus(0.1, 400)
    assert _parts(c.val) <= _parts(more.val) and _parts(c.train) <= _parts(more.train)
    assert not set(_parts(more.val)) & set(_parts(more.train)) - {b""}  # no file's bytes in both (empty files aside)
    # ... and the default 400 files split in roughly the stated proportion (binomial: 40 ± 6).
    assert 0.05 <= more.n_val_files / 400 <= 0.15


def test_batches_are_deterministic_and_shifted_by_one():
    c = load_corpus(0.1, 40)
    x1, y1 = c.batch("train", 7, 4, 32, seed=3)
    x2, y2 = c.batch("train", 7, 4, 32, seed=3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next byte
    x3, _ = c.batch("train", 8, 4, 32, seed=3)
    assert not torch.equal(x1, x3)
    assert x1.dtype == torch.int64 and int(x1.max()) < 256


def test_validation_batches_are_fixed_whatever_the_trial_seed(other_process):
    c = load_corpus(0.1, 40)
    torch.manual_seed(0)  # a trial seeds torch's global RNG (build_model) before it evaluates
    first = c.val_batches(3, 4, 32)
    torch.manual_seed(1)
    c.batch("train", 1, 4, 32, seed=1)
    again = c.val_batches(3, 4, 32)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    # ... and in another process
    assert other_process[2] == _digest(torch.cat([torch.cat([x, y], 1) for x, y in first]))
    # Drawn from the validation split (each window is a slice of it), three different batches.
    val = bytes(c.val.numpy())
    windows = [bytes(w.to(torch.uint8).numpy()) for x, y in first for w in torch.cat([x, y[:, -1:]], 1)]
    assert all(w in val for w in windows), "a validation window is not a slice of the validation split"
    assert not torch.equal(first[0][0], first[1][0]) and not torch.equal(first[1][0], first[2][0])


def test_corpus_is_real_python_source():
    c = load_corpus(0.1, 40)
    text = bytes(c.train[:20000].tolist()).decode("utf-8", "replace")
    assert "def " in text and "import " in text
