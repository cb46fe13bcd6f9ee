"""One writer per study folder: `<study>/.hpt.lock` holds the writer's pid, host, start time and
command. A second process fails fast naming the holder; a lock left by a dead process on this host
is stale and taken over. `live_holder` is the same judgement for readers such as `hpt status`."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import sys
from pathlib import Path

from hptransfer.errors import StudyError

_HELD: dict[str, int] = {}  # locks this process holds, with their depth (the lock is reentrant)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stale(holder: dict) -> bool:
    """A holder on this host whose process is gone (another host's holder cannot be checked)."""
    pid = holder.get("pid")
    return holder.get("host") == socket.gethostname() and isinstance(pid, int) and not _alive(pid)


def live_holder(path: Path) -> dict | None:
    """The process holding the lock file `path`, or None when there is none or it is stale."""
    holder = _read(path)
    return holder if holder and not _stale(holder) else None


def _acquire(path: Path) -> None:
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv[:3]),
    }
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if _stale(holder):
                path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            raise StudyError(
                f"{path.parent} is in use by pid {holder.get('pid')} on {holder.get('host')} since "
                f"{holder.get('started')} ({holder.get('command', '?')}); wait for it to finish, or use another "
                f"--study-dir. If that process is gone (another host), delete {path}"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return
    raise StudyError(f"could not take the lock {path}; delete it if no hpt process is using the folder")


@contextlib.contextmanager
def hold(path: Path):
    """Hold the lock file `path` while a stage writes; reentrant within one process."""
    key = str(path)
    if _HELD.get(key):
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _acquire(path)
    _HELD[key] = 1
    try:
        yield
    finally:
        _HELD.pop(key, None)
        path.unlink(missing_ok=True)
