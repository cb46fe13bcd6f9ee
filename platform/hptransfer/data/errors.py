"""The data stage's user error (defined with the others in `hptransfer.errors`, since the spec's
tokenizer check raises it too): each problem names the file (or the spec field) and the fix."""

from __future__ import annotations

from hptransfer.errors import DataError

__all__ = ["DataError"]
