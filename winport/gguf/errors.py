"""The GGUF error type, in a module of its own: the reader and the dequantizers both raise it, and
neither has to import the other for it."""

from __future__ import annotations


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported; the message names the file, the item and the problem."""
