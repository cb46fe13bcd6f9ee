"""`corpus: files`: find the input files, check them, and read their documents through Hugging Face
`datasets` (its local `text`, `json` and `parquet` builders; nothing is downloaded).

A document is one row's `text_field` (jsonl, parquet) or one paragraph (text: blank-line separated;
a file of one paragraph is one document). Every problem names the file and the fix, and all of a
file set's problems are reported at once.
"""

from __future__ import annotations

import glob
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hptransfer.data.errors import DataError
from hptransfer.errors import Problem

if TYPE_CHECKING:
    from hptransfer.spec import DataSpec

EXTENSIONS = {".txt": "text", ".text": "text", ".md": "text", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
BUILDERS = {"text": "text", "jsonl": "json", "parquet": "parquet"}  # datasets' packaged builders
READ_BATCH = 1000  # documents per read (bounded memory on large files)


def input_files(data: DataSpec) -> list[Path]:
    """The files the globs match, sorted, each once. Raises DataError naming each empty pattern."""
    files: dict[str, Path] = {}
    problems = []
    for i, pattern in enumerate(data.paths):
        hits = [Path(p) for p in sorted(glob.glob(str(Path(pattern).expanduser()), recursive=True)) if Path(p).is_file()]
        if not hits:
            problems.append(
                Problem(
                    f"data.paths[{i}]",
                    f"no file matches {pattern}",
                    fix="check the path (relative patterns start from the folder hpt was run in)",
                )
            )
        files.update((str(p.resolve()), p.resolve()) for p in hits)
    if problems:
        raise DataError("data.paths", problems)
    return [files[k] for k in sorted(files)]


def file_format(path: Path, data: DataSpec) -> str:
    fmt = data.format or EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(
            str(path),
            [
                Problem(
                    str(path),
                    f"cannot tell the format from the extension {path.suffix!r} (known: {', '.join(EXTENSIONS)})",
                    fix="set data.format: text, jsonl or parquet",
                )
            ],
        )
    return fmt


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def utf8_problem(path: Path) -> Problem | None:
    """Text and JSON Lines must be UTF-8: say where the first bad byte is and how to convert."""
    with open(path, "rb") as f:
        offset, tail = 0, b""
        for block in iter(lambda: f.read(1 << 20), b""):
            chunk = tail + block
            try:
                chunk.decode("utf-8")
                tail = b""
            except UnicodeDecodeError as e:
                if e.end < len(chunk) or e.reason != "unexpected end of data":
                    pos = offset - len(tail) + e.start
                    return Problem(
                        str(path),
                        f"not UTF-8 text: byte {pos} is {chunk[e.start : e.start + 1]!r}",
                        fix=f"convert it, e.g. `iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8{path.suffix}`",
                    )
                tail = chunk[e.start :]  # a character cut by the block boundary
            offset += len(block)
        if tail:
            return Problem(
                str(path),
                f"not UTF-8 text: it ends inside a character (byte {offset - len(tail)})",
                fix="check the file is complete and UTF-8",
            )
    return None


def _load(path: Path, fmt: str, cache: str):
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    kw = {"sample_by": "paragraph"} if fmt == "text" else {}
    return datasets.load_dataset(BUILDERS[fmt], data_files=[str(path)], split="train", cache_dir=cache, **kw)


def documents(path: Path, data: DataSpec) -> Iterator[list[str]]:
    """The file's non-empty documents, in batches. Raises DataError for a file that cannot be used:
    not UTF-8, unreadable as its format, no `text_field`, a row without text, or no text at all."""
    fmt = file_format(path, data)
    if fmt != "parquet":
        bad = utf8_problem(path)
        if bad:
            raise DataError(str(path), [bad])
    field = "text" if fmt == "text" else data.text_field
    with tempfile.TemporaryDirectory(prefix="hpt-datasets-") as cache:  # datasets' Arrow copy, dropped after
        try:
            ds = _load(path, fmt, cache)
        except Exception as e:  # datasets wraps the reader's error (pyarrow, json) in its own types
            cause = e.__cause__ or e
            raise DataError(
                str(path),
                [
                    Problem(
                        str(path),
                        f"cannot be read as {fmt}: {type(cause).__name__}: {cause}",
                        fix="check the file, or set data.format to its real format",
                    )
                ],
            ) from None
        if field not in ds.column_names:
            raise DataError(
                str(path),
                [
                    Problem(
                        str(path),
                        f"has no field {field!r} (its fields: {', '.join(ds.column_names)})",
                        fix="set data.text_field to the field that holds the text",
                    )
                ],
            )
        total, row = 0, 0
        for batch in ds.iter(batch_size=READ_BATCH):
            texts = batch[field]
            bad = [row + i for i, t in enumerate(texts) if not isinstance(t, str)]
            if bad:
                raise DataError(
                    str(path),
                    [
                        Problem(
                            str(path),
                            f"{field!r} is missing or not text in row(s) {bad[:5]} "
                            f"(0-based){' and more' if len(bad) > 5 else ''}",
                            fix=f"give every row a string {field!r}, or drop those rows",
                        )
                    ],
                )
            row += len(texts)
            docs = [t for t in texts if t.strip()]
            total += len(docs)
            if docs:
                yield docs
    if total == 0:
        raise DataError(
            str(path),
            [
                Problem(
                    str(path),
                    f"every {field!r} is empty ({row} rows)" if fmt != "text" else "no text",
                    fix="remove the file from data.paths or fill it",
                )
            ],
        )
