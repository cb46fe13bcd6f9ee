"""Offline data: byte-level language modelling on Python's own standard library."""

from hptransfer.data.stdlib_corpus import ByteCorpus, load_corpus

__all__ = ["ByteCorpus", "load_corpus"]
