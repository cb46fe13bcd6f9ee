"""Atomic file writes: a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_yaml(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, yaml.safe_dump(obj, sort_keys=False, allow_unicode=True))


def save_figure(fig, path: str | Path) -> Path:
    """Save a matplotlib figure atomically and close it."""
    import io as _io

    import matplotlib.pyplot as plt

    buf = _io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return write_atomic(path, buf.getvalue())
