"""`open_corpus(data)`: the one way training code gets its tokens, whatever the corpus.

`stdlib`: Python's standard library as bytes, in memory. `prose`: the installed packages' READMEs
as bytes, in memory (the private corpus of DP fine-tuning). `files`: the prepared token files of your
local files (prepared here on first use, or again when an input changed). Either way the object has
`batch(split, step, B, T, seed)`, `val_batches(n, B, T)`, `vocab_size` and `n_tokens`; batches are a
pure function of (split, step, seed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hptransfer.data.errors import DataError
from hptransfer.data.prepared import TokenCorpus, prepare
from hptransfer.data.prose_corpus import load_prose_corpus
from hptransfer.data.stdlib_corpus import ByteCorpus, load_corpus
from hptransfer.errors import Problem

if TYPE_CHECKING:
    from hptransfer.spec import DataSpec

Corpus = ByteCorpus | TokenCorpus


def open_corpus(data: DataSpec, *, seq_len: int | None = None, steps: int | None = None, batch_size: int | None = None) -> Corpus:
    """The corpus `data` describes. With `seq_len` (and `steps`, `batch_size`), checks it is large
    enough for that run (`check_size`)."""
    if data.corpus == "stdlib":
        corpus: Corpus = load_corpus(data.val_fraction, data.max_files)
    elif data.corpus == "prose":
        corpus = load_prose_corpus(data.val_fraction, data.max_files)
    else:
        from hptransfer import logs

        p = prepare(data, log=logs.progress)
        corpus = TokenCorpus.open(p.folder, p.manifest)
    if seq_len is not None:
        check_size(corpus, data, seq_len=seq_len, steps=steps, batch_size=batch_size)
    return corpus


def check_size(
    corpus: Corpus,
    data: DataSpec,
    *,
    seq_len: int,
    steps: int | None = None,
    batch_size: int | None = None,
    what: str = "the run",
) -> None:
    """Each split must hold more than one window of seq_len + 1 tokens, and `steps × batch_size ×
    seq_len` must not pass over the training tokens more than `data.max_epochs` times."""
    n = corpus.n_tokens
    where = "data.paths" if data.corpus == "files" else "data.max_files"
    problems = []
    for split, fix in (
        ("train", "add documents or lower model.seq_len"),
        ("val", "add documents, raise data.val_fraction or lower model.seq_len"),
    ):
        if n[split] <= seq_len + 1:
            problems.append(
                Problem(
                    where,
                    f"the {'training' if split == 'train' else 'validation'} split has "
                    f"{n[split]} tokens, too few for one sequence of model.seq_len + 1 = {seq_len + 1}",
                    fix=fix,
                )
            )
    if not problems and steps and batch_size:
        need = steps * batch_size * seq_len
        epochs = need / n["train"]
        if epochs > data.max_epochs:
            problems.append(
                Problem(
                    where,
                    f"the corpus is too small for {what}: steps × batch_size × seq_len = "
                    f"{steps} × {batch_size} × {seq_len} = {need:,} tokens is {epochs:.0f} passes over "
                    f"its {n['train']:,} training tokens, above data.max_epochs={data.max_epochs:g}",
                    fix="add documents, train fewer steps, or raise data.max_epochs deliberately",
                )
            )
    if problems:
        raise DataError(str(getattr(corpus, "folder", "corpus")), problems)
