"""Atomic file writes: a crash leaves the old file or the new one, never half of one, where the
filesystem renames atomically. Where it does not (some network and FUSE filesystems copy on rename),
or a disk fills or a power loss empties a file, `write_checked` leaves a sidecar `.NAME.sum` (the
file's length and SHA-256, written after it) from which `torn` tells a file cut short.
"""

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


def sidecar(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}.sum")


def write_checked(path: str | Path, data: str | bytes) -> Path:
    """`write_atomic`, then the sidecar with the file's length and SHA-256."""
    import hashlib

    raw = data.encode() if isinstance(data, str) else data
    write_atomic(path, raw)
    write_atomic(sidecar(path), json.dumps({"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}) + "\n")
    return Path(path)


def torn(path: str | Path) -> str | None:
    """Why `path` is a file cut short, or None. Cut short: shorter than its sidecar records, or
    holding NUL bytes it was not written with (a power loss on XFS/ext4). A file of the recorded
    length or longer that differs was edited by hand: not torn. No sidecar (written before them,
    or by hand): not torn."""
    import hashlib

    path = Path(path)
    try:
        want = json.loads(sidecar(path).read_text())
        raw = path.read_bytes()
    except (OSError, ValueError):
        return None
    size = want.get("bytes")
    if not isinstance(size, int) or hashlib.sha256(raw).hexdigest() == want.get("sha256"):
        return None
    if len(raw) < size:
        return f"it has {len(raw)} bytes, {size} were written (its checksum file {sidecar(path).name} says so)"
    if b"\0" in raw:
        return f"it holds NUL bytes where text was written (checksum file {sidecar(path).name})"
    return None


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
