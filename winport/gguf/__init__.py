"""GGUF support for the port: reader, dequantizers, name table, converters, CLI.

Public entry points: :func:`open_gguf` (raw access), :func:`load_gguf_model` (streaming load of a
DeepSeek-V4/V4.1 GGUF into SGLang parameter names), :class:`GGUFError`.
"""

from .reader import GGUFError, GGUFFile, GGUFModel, GGUFTensor, open_gguf, shard_paths

__all__ = [
    "GGUFError",
    "GGUFFile",
    "GGUFModel",
    "GGUFTensor",
    "LoadedGGUF",
    "load_gguf_model",
    "open_gguf",
    "shard_paths",
]


def __getattr__(name: str):  # lazy: convert pulls in torch
    if name in ("LoadedGGUF", "load_gguf_model"):
        from . import convert

        return getattr(convert, name)
    raise AttributeError(name)
