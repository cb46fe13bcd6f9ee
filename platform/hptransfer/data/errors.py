"""The data stage's user error: each problem names the file (or the spec field) and the fix."""

from __future__ import annotations

from hptransfer.errors import HptError


class DataError(HptError):
    kind = "unusable data"
