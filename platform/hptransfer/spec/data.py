"""`data:`: the corpus every trial and the large run read, and how it is split and tokenized."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from hptransfer.spec.base import _Strict


class DataSpec(_Strict):
    corpus: Literal["stdlib", "prose", "files"] = Field(
        "stdlib",
        description="`stdlib`: the .py files of Python's standard library (ships with every Python); `prose`: the long descriptions (READMEs, English markdown/rst) of the installed Python packages, a different distribution (the private corpus of DP fine-tuning); `files`: your local files (`paths`), read through Hugging Face `datasets` and tokenized once by `hpt data prepare`.",
    )
    paths: tuple[str, ...] = Field(
        (),
        description="corpus files: glob patterns of the input files (`**` recurses); relative ones are resolved against the folder hpt runs in.",
    )
    format: Literal["text", "jsonl", "parquet"] | None = Field(
        None,
        description="corpus files: how to read them. `text`: documents are paragraphs (blank-line separated); `jsonl`, `parquet`: one document per row, in `text_field`. Default: by extension (.txt .md .text → text, .jsonl .json → jsonl, .parquet → parquet).",
    )
    text_field: str = Field(
        "text", min_length=1, description="corpus files, jsonl/parquet: the field (column) holding each document's text."
    )
    tokenizer: str = Field(
        "byte",
        min_length=1,
        description="`byte`: UTF-8 bytes, vocabulary 256; or a local tokenizer folder (what `tokenizer.save_pretrained(DIR)` writes), loaded with AutoTokenizer. The model's vocabulary follows it.",
    )
    cache_dir: str = Field(
        "~/.cache/hptransfer/data",
        description="corpus files: where prepared token files go, one folder per (inputs, format, tokenizer, split); a changed input or tokenizer is prepared again. Sweep trials and every large-run worker read it: on a multi-node cluster put it on shared storage (else each node prepares its own copy on first use).",
    )
    val_fraction: float = Field(
        0.1,
        gt=0,
        lt=0.5,
        description="Share held out for validation, by a stable hash of each file path (stdlib) or document text (files).",
    )
    max_files: int | None = Field(
        400,
        ge=10,
        description="stdlib, prose: use at most this many files (documents), sorted by hash, to keep start-up fast; null for all.",
    )
    max_epochs: float = Field(
        100.0,
        gt=0,
        description="Refuse a run that would pass over the training tokens more than this many times (steps × batch_size × seq_len / training tokens): a corpus too small for the requested steps.",
    )
    eval_batches: int = Field(8, ge=1, description="Validation batches averaged for val_loss.")

    @field_validator("paths")
    @classmethod
    def _absolute_paths(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # Resolved once, at load: Ray workers run in other folders.
        return tuple(p if Path(p).expanduser().is_absolute() else str(Path.cwd() / p) for p in v)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_dir(cls, v: str) -> str:
        return v if v == "byte" or Path(v).expanduser().is_absolute() else str(Path.cwd() / v)

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: str) -> str:
        return v if v.startswith("~") or Path(v).is_absolute() else str(Path.cwd() / v)

    @model_validator(mode="after")
    def _corpus(self) -> DataSpec:
        if self.corpus == "files" and not self.paths:
            raise ValueError("corpus files needs data.paths: glob patterns of your files, e.g. ['data/*.jsonl']")
        if self.corpus in ("stdlib", "prose"):
            given = [k for k in ("paths", "format") if getattr(self, k)] + (["tokenizer"] if self.tokenizer != "byte" else [])
            if given:
                raise ValueError(
                    f"data.{', data.'.join(given)} apply to corpus files (corpus is {self.corpus!r}, bytes "
                    "read in memory); set corpus: files or remove them"
                )
        return self
