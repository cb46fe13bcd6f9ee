"""Checkpoints that can tell they are whole, and a full disk that never costs the previous one.

- Torn checkpoints. A crash mid-write on a filesystem without atomic rename, or a power loss
  before the page cache reached the disk (ext4's delayed allocation leaves zero-length files),
  leaves a checkpoint folder whose files are cut short. Rank 0 writes `hpt_manifest.json` (every
  file's length and SHA-256) into the folder LAST, after every rank has written its part; a folder
  whose files do not match it, or whose manifest is unreadable, is torn. `newest_good` walks from
  the checkpoint Ray Train hands back to older ones until one is whole, and says what it skipped.
  A folder with no manifest at all was written before manifests existed: it is used as it is.
- A full disk. Before writing, rank 0 compares the free space where the checkpoint goes (the local
  folder, then Ray Train's copy: twice on one filesystem) with the size of the previous checkpoint
  (`space_problem`); short of it, the checkpoint is skipped and the run goes on with the previous
  one intact. A write that still fails with ENOSPC (another writer filled the disk) removes its
  partial folder and raises `CheckpointSpaceError`: Ray Train restarts from the previous
  checkpoint, which nothing touched, and the pre-check then skips that checkpoint.

Hashing costs one read of the checkpoint (~1 GB/s): small beside writing it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path

from hptransfer.io import write_json

MANIFEST = "hpt_manifest.json"
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # EFBIG: a file-size limit (RLIMIT_FSIZE, a quota)
FULL_BELOW = 1 << 20  # a filesystem with less free is full (a block or two of slack on tmpfs, ext4)
SPACE_MARGIN = 1.1  # a checkpoint may grow a little between two writes (the history it carries)


class CheckpointSpaceError(OSError):
    """A checkpoint write ran out of space; its partial folder was removed, the previous one is intact."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> dict:
    """Record every file's length and SHA-256; written last, atomically (its presence says the rest is done)."""
    files = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in _files(folder)}
    body = {"files": files, "bytes": sum(f["bytes"] for f in files.values())}
    write_json(folder / MANIFEST, body)
    return body


def manifest_bytes(folder: Path) -> int | None:
    """The checkpoint's total size from its manifest (None without a readable one)."""
    try:
        return int(json.loads((folder / MANIFEST).read_text())["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def torn(folder: Path) -> str | None:
    """Why `folder` is not a whole checkpoint, or None when it is (or predates manifests)."""
    path = folder / MANIFEST
    if not folder.is_dir():
        return f"{folder} is missing"
    if not path.exists():
        return None  # written before manifests existed
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its manifest {path.name} is unreadable (cut short)"
    for name, want in files.items():
        p = folder / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, the manifest says {want['bytes']}"
        if sha256_file(p) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest"
    return None


def newest_good(restored: Path) -> tuple[Path | None, list[str]]:
    """The newest whole checkpoint at or before `restored` (Ray Train's latest: its siblings
    `checkpoint_<time>` are the older ones it kept; the names sort in time), and one line per torn
    one skipped. Never a newer sibling: one Ray Train did not register may be a half-finished copy."""
    candidates = [restored] + sorted(
        (p for p in restored.parent.glob("checkpoint_*") if p.is_dir() and p.name < restored.name), reverse=True
    )
    skipped = []
    for folder in candidates:
        problem = torn(folder)
        if problem is None:
            return folder, skipped
        skipped.append(f"{folder.name}: {problem}")
    return None, skipped


def space_problem(need_bytes: int | None, *targets: Path) -> str | None:
    """Why a checkpoint of about `need_bytes` would not fit where it is written (`targets`: the
    folders it is written to, in turn; two on one filesystem need twice the space), or None."""
    if not need_bytes:
        return None
    by_device: dict[int, tuple[Path, int]] = {}
    for t in targets:
        probe = t
        while not probe.exists():
            probe = probe.parent
        dev = probe.stat().st_dev
        path, n = by_device.get(dev, (probe, 0))
        by_device[dev] = (path, n + 1)
    for path, copies in by_device.values():
        free = shutil.disk_usage(path).free
        need = int(need_bytes * copies * SPACE_MARGIN)
        if free < need:
            return (
                f"{free / 1e6:.1f} MB free on the filesystem of {path}, a checkpoint needs about {need / 1e6:.1f} MB "
                f"({copies} cop{'ies' if copies > 1 else 'y'} of {need_bytes / 1e6:.1f} MB)"
            )
    return None


def is_full_disk(e: BaseException, folder: Path) -> bool:
    """Whether a write into `folder` failed for want of space: an OSError saying so, or any error
    while the filesystem is full (torch.save reports ENOSPC as "RuntimeError: [enforce fail at
    inline_container.cc] unexpected pos", errno lost). Call it before removing the partial folder."""
    if isinstance(e, OSError) and e.errno in FULL_DISK:
        return True
    probe = folder
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free < FULL_BELOW


def remove_partial(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
