"""`data.corpus: files`: local JSONL / text / Parquet through `datasets`, a tokenizer trained here
and saved as a local folder, the prepared (memory-mapped) token files and their manifest, cache
reuse and invalidation, and a clear error for each kind of bad input."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hptransfer.data import DataError, TokenCorpus, check_size, open_corpus, prepare
from hptransfer.data.prepared import doc_bucket
from hptransfer.hyperparameters import Hyperparameters
from hptransfer.spec import SpecError, parse_spec

from conftest import tiny_spec_dict

VOCAB = 400


def _documents(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(20, 80))) + "." for _ in range(n)]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _train_tokenizer(out: Path, docs: list[str], vocab_size: int = VOCAB) -> Path:
    """A tiny BPE trained on the fly, saved as transformers saves any tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<eos>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    docs = _documents()
    for i in range(2):
        _write_jsonl(root / "data" / f"part{i}.jsonl", [{"text": d, "id": j} for j, d in enumerate(docs[i::2])])
    _train_tokenizer(root / "tokenizer", docs)
    return root


def _spec_dict(root: Path, cache: Path, **data) -> dict:
    return tiny_spec_dict(
        data={
            "corpus": "files",
            "paths": [str(root / "data" / "*.jsonl")],
            "tokenizer": str(root / "tokenizer"),
            "cache_dir": str(cache),
            "max_files": None,
            "eval_batches": 2,
            **data,
        }
    )


def _data(root: Path, cache: Path, **data):
    return parse_spec(_spec_dict(root, cache, **data)).data


def test_vocabulary_follows_the_tokenizer(corpus_dir, tmp_path):
    from hptransfer.models import build_model

    spec = parse_spec(_spec_dict(corpus_dir, tmp_path, **{}))
    assert spec.model.vocab_size == VOCAB
    model = build_model(spec.model, 32, base_width=16)
    assert model.embed.weight.shape[0] == VOCAB and model.lm_head.out_features == VOCAB
    # the byte default keeps 256
    assert parse_spec(tiny_spec_dict()).model.vocab == 256
    with pytest.raises(SpecError, match=re.escape("model.vocab_size=300 is smaller than data.tokenizer's vocabulary 400")):
        parse_spec({**_spec_dict(corpus_dir, tmp_path), "model": {**tiny_spec_dict()["model"], "vocab_size": 300}})


def test_prepare_writes_token_files_and_manifest(corpus_dir, tmp_path):
    from transformers import AutoTokenizer

    data = _data(corpus_dir, tmp_path)
    p = prepare(data)
    assert not p.reused and p.reason == "not prepared yet"
    m = p.manifest
    assert [Path(i["path"]).name for i in m["inputs"]] == ["part0.jsonl", "part1.jsonl"]
    assert all(len(i["sha256"]) == 64 for i in m["inputs"]) and len(m["tokenizer"]["sha256"]) == 64
    assert m["tokenizer"]["vocab_size"] == VOCAB and m["dtype"] == "uint16"
    # the split is the stable document hash, and the token counts are the tokenizer's
    docs = _documents()
    val = [d for d in docs if doc_bucket(d) < data.val_fraction]
    assert m["documents"] == {"train": len(docs) - len(val), "val": len(val)}
    tok = AutoTokenizer.from_pretrained(corpus_dir / "tokenizer")
    n_val = sum(len(tok(d, add_special_tokens=False)["input_ids"]) + 1 for d in val)  # + <eos> separator
    assert m["tokens"]["val"] == n_val
    c = TokenCorpus.open(p.folder, m)
    assert isinstance(c.train, np.memmap) and c.n_tokens == m["tokens"]
    assert (p.folder / "val.bin").stat().st_size == 2 * n_val


def test_batches_are_a_pure_function_of_step_and_seed(corpus_dir, tmp_path):
    c = open_corpus(_data(corpus_dir, tmp_path), seq_len=16)
    x1, y1 = c.batch("train", 7, 4, 16, seed=3)
    x2, y2 = open_corpus(_data(corpus_dir, tmp_path)).batch("train", 7, 4, 16, seed=3)  # reopened: the same
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1]) and x1.dtype == torch.int64
    assert int(x1.max()) < VOCAB and c.vocab_size == VOCAB
    assert not torch.equal(x1, c.batch("train", 8, 4, 16, seed=3)[0])
    # Validation batches are fixed whatever the trial's seed: a trial seeds torch's global RNG before
    # it evaluates, and another process reopens the files.
    torch.manual_seed(0)
    first = c.val_batches(3, 4, 16)
    torch.manual_seed(1)
    again = open_corpus(_data(corpus_dir, tmp_path)).val_batches(3, 4, 16)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    # Drawn from val.bin (each window is a slice of it), three different batches.
    slices = np.lib.stride_tricks.sliding_window_view(np.asarray(c.val), 17)
    windows = [torch.cat([x, y[:, -1:]], 1).numpy() for x, y in first]
    assert all((slices == w).all(1).any() for ws in windows for w in ws), "a window is not a slice of val.bin"
    assert not torch.equal(first[0][0], first[1][0]) and not torch.equal(first[1][0], first[2][0])


def test_prepared_data_is_reused_and_prepared_again_when_inputs_change(tmp_path):
    docs = _documents()
    root = tmp_path / "c"
    _write_jsonl(root / "data" / "a.jsonl", [{"text": d} for d in docs[:200]])
    _train_tokenizer(root / "tokenizer", docs)
    data = _data(root, tmp_path / "cache")
    first = prepare(data)
    assert prepare(data).reused
    os.utime(root / "data" / "a.jsonl", ns=(1, 1))  # touched, same bytes: the hash says unchanged
    assert prepare(data).reused
    _write_jsonl(root / "data" / "a.jsonl", [{"text": d} for d in docs[:150]])  # edited
    again = prepare(data)
    assert not again.reused and "a.jsonl changed" in again.reason and again.manifest["tokens"] != first.manifest["tokens"]
    _write_jsonl(root / "data" / "b.jsonl", [{"text": d} for d in docs[200:]])  # a new file matches the glob
    assert "input files changed" in prepare(data).reason
    _train_tokenizer(root / "tokenizer", docs, vocab_size=VOCAB - 50)  # another tokenizer in the same folder
    assert "tokenizer" in prepare(data).reason
    assert prepare(data).reused and prepare(data, force=True).reason == "--force"


def test_text_and_parquet_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = _documents(60)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("\n\n".join(docs[:30]))  # paragraphs are documents
    pq.write_table(pa.table({"body": docs[30:]}), tmp_path / "in" / "b.parquet")
    data = parse_spec(
        tiny_spec_dict(
            data={
                "corpus": "files",
                "paths": [str(tmp_path / "in" / "*")],
                "text_field": "body",
                "cache_dir": str(tmp_path / "cache"),
                "max_files": None,
            }
        )
    ).data
    m = prepare(data).manifest
    assert [(Path(i["path"]).name, i["format"], sum(i["documents"].values())) for i in m["inputs"]] == [
        ("a.txt", "text", 30),
        ("b.parquet", "parquet", 30),
    ]
    assert m["dtype"] == "uint8" and m["tokens"]["train"] + m["tokens"]["val"] == sum(len(d) + 1 for d in docs)


def test_sweep_trial_trains_on_local_files_with_the_tokenizer(corpus_dir, tmp_path):
    """Prepared on first use (nothing prepared before), then the trial trains on it."""
    from hptransfer.sweep.trial import train_proxy

    d = _spec_dict(corpus_dir, tmp_path / "fresh_cache")
    d["model"] = {
        "family": "hf",
        "config": {"model_type": "qwen2", "num_attention_heads": 2, "num_key_value_heads": 1},
        "head_dim": 16,
        "seq_len": 32,
        "depth": 1,
        "parametrization": "mup",
    }
    d["sweep"] = {**d["sweep"], "widths": [32, 64]}
    spec = parse_spec(d)
    m = train_proxy(spec, 32, Hyperparameters(lr=1e-2, warmup_steps=2), seed=0, n_reports=1)
    assert m["status"] == "ok" and np.isfinite(m["val_loss"]) and m["val_loss"] < np.log(VOCAB)
    assert list((tmp_path / "fresh_cache").glob("*/manifest.json"))


def _problems(data) -> str:
    with pytest.raises(DataError) as e:
        open_corpus(data, seq_len=16)
    return str(e.value)


def test_missing_files(corpus_dir, tmp_path):
    text = _problems(
        _data(corpus_dir, tmp_path, paths=[str(corpus_dir / "data" / "*.jsonl"), str(tmp_path / "nope" / "*.jsonl")])
    )
    assert "data.paths[1]: no file matches" in text and "nope" in text and "check the path" in text


@pytest.mark.parametrize(
    "case,rows,words",
    [
        ("absent text field", [{"content": "x"}] * 3, ["has no field 'text'", "content", "set data.text_field"]),
        ("empty text field", [{"text": ""}] * 3, ["every 'text' is empty"]),
        ("a row without text", [{"text": "a b"}, {"text": None}, {"text": "c d"}], ["missing or not text in row(s) [1]"]),
    ],
)
def test_bad_text_field(case, rows, words, tmp_path):
    bad = _write_jsonl(tmp_path / "in" / "bad.jsonl", rows)
    text = _problems(
        parse_spec(
            tiny_spec_dict(data={"corpus": "files", "paths": [str(bad)], "cache_dir": str(tmp_path), "max_files": None})
        ).data
    )
    assert str(bad) in text and all(w in text for w in words), text


def test_every_bad_file_is_reported_at_once(tmp_path):
    a = _write_jsonl(tmp_path / "in" / "a.jsonl", [{"body": "x"}])
    b = _write_jsonl(tmp_path / "in" / "b.jsonl", [{"text": ""}])
    text = _problems(
        parse_spec(
            tiny_spec_dict(
                data={
                    "corpus": "files",
                    "paths": [str(tmp_path / "in" / "*.jsonl")],
                    "cache_dir": str(tmp_path),
                    "max_files": None,
                }
            )
        ).data
    )
    assert "2 problem(s)" in text and str(a) in text and str(b) in text


def test_non_utf8_text(tmp_path):
    bad = tmp_path / "in" / "latin1.txt"
    bad.parent.mkdir()
    bad.write_bytes("caf\u00e9 au lait\n".encode("latin-1") * 50)
    text = _problems(
        parse_spec(
            tiny_spec_dict(data={"corpus": "files", "paths": [str(bad)], "cache_dir": str(tmp_path), "max_files": None})
        ).data
    )
    assert str(bad) in text and "not UTF-8 text: byte 3" in text and "iconv" in text


def test_folder_without_a_tokenizer(corpus_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError) as e:
        parse_spec(_spec_dict(corpus_dir, tmp_path, tokenizer=str(tmp_path / "empty")))
    assert "folder without a tokenizer" in str(e.value) and "save_pretrained" in str(e.value)
    with pytest.raises(SpecError, match="not found"):
        parse_spec(_spec_dict(corpus_dir, tmp_path, tokenizer=str(tmp_path / "missing")))


def test_corpus_too_small_for_the_steps_or_the_sequence(corpus_dir, tmp_path):
    data = _data(corpus_dir, tmp_path)
    c = open_corpus(data)
    with pytest.raises(DataError) as e:
        check_size(c, data, seq_len=16, steps=1_000_000, batch_size=64, what="each sweep trial")
    assert "too small for each sweep trial" in str(e.value) and "data.max_epochs=100" in str(e.value)
    with pytest.raises(DataError, match=re.escape("too few for one sequence of model.seq_len")):
        check_size(c, data, seq_len=8000)


def test_spec_rejects_file_settings_on_the_stdlib_corpus():
    with pytest.raises(SpecError, match="apply to corpus files"):
        parse_spec(tiny_spec_dict(data={"paths": ["x.jsonl"]}))
    with pytest.raises(SpecError, match=re.escape("needs data.paths")):
        parse_spec(tiny_spec_dict(data={"corpus": "files"}))


@pytest.mark.slow  # three `hpt` processes: ~13 s on 2 cores
def test_hpt_data_prepare_cli(corpus_dir, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec_dict(corpus_dir, tmp_path / "cache")))
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "hptransfer", "data", "prepare", str(spec), *a], capture_output=True, text=True
    )
    first, second = run(), run()
    assert first.returncode == 0 and "prepared" in first.stdout and "tokens train/val" in first.stdout, first.stderr
    assert second.returncode == 0 and second.stdout.startswith("reused"), second.stdout + second.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_spec_dict(corpus_dir, tmp_path / "cache", text_field="body")))
    r = subprocess.run([sys.executable, "-m", "hptransfer", "data", "prepare", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "part0.jsonl" in r.stderr and "set data.text_field" in r.stderr, r.stderr


@pytest.mark.slow
def test_hpt_run_end_to_end_on_jsonl_with_a_local_tokenizer(corpus_dir, tmp_path):
    """The whole pipeline (coord check, sweep, transfer, DeepSpeed large run, report) on local files."""
    d = _spec_dict(corpus_dir, tmp_path / "cache")
    d["name"] = "byo"
    d["model"] = {
        "family": "hf",
        "config": {"model_type": "qwen2", "num_attention_heads": 2, "num_key_value_heads": 1},
        "head_dim": 16,
        "seq_len": 32,
        "depth": 1,
        "parametrization": "mup",
    }
    d["sweep"] = {**d["sweep"], "widths": [32, 64], "grid": {"lr": [0.003, 0.03]}, "steps": 8, "noise_seeds": 0}
    d["target"] = {"width": 128, "steps": 4, "batch_size": 8}
    d["train"] = {**d["train"], "eval_every": 2}
    spec = tmp_path / "byo.yaml"
    spec.write_text(yaml.safe_dump(d))
    r = subprocess.run(
        [sys.executable, "-m", "hptransfer", "run", str(spec), "-o", str(tmp_path / "study")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    final = json.loads((tmp_path / "study" / "train" / "train_metrics.json").read_text())["final"]
    assert final["status"] == "ok" and np.isfinite(final["val_loss"])
    cfg = json.loads((tmp_path / "study" / "train" / "hf_model" / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["vocab_size"] == VOCAB and cfg["hidden_size"] == 128


def test_readme_example_spec_validates(corpus_dir, tmp_path):
    """README's "Bring your own model and data" spec, pointed at this test's files and tokenizer."""
    from conftest import ROOT

    text = (ROOT / "README.md").read_text().split("## Bring your own model and data", 1)[1]
    d = yaml.safe_load(text.split("```yaml", 1)[1].split("```", 1)[0])
    d["data"].update(
        paths=[str(corpus_dir / "data" / "*.jsonl")], tokenizer=str(corpus_dir / "tokenizer"), cache_dir=str(tmp_path)
    )
    spec = parse_spec(d)
    assert spec.model.family == "hf" and spec.model.vocab_size == VOCAB and spec.data.corpus == "files"
