"""Every version the port installs, in one place.

Read by the installer (`python -m winport install`), by `winport lock` (which writes
requirements/windows.in for the Windows lock file) and by the tests that keep both honest.
This module must import with the standard library alone: it runs before any venv exists.
"""

from __future__ import annotations

PYTHON_LINUX = "3.11"  # the torch wheels on the Linux machines are cp311
PYTHON_WINDOWS_RANGE = ((3, 10), (3, 13))  # inclusive; python.org builds

TORCH = "2.14.1"
TORCHVISION = "0.29.1"
TRITON_LINUX = "3.8.0"  # what torch 2.14.1 requires on Linux
TRITON_WINDOWS = "3.8.0.post29"  # triton-windows, bundles TinyCC and ptxas
# CUDA 12.8 builds support SM120 (RTX 5090 / RTX PRO 6000); only the PyTorch index has them.
TORCH_WINDOWS_INDEX = "https://download.pytorch.org/whl/cu128"

SGLANG = "0.5.23"
KT_KERNEL = "0.7.2"
TRANSFORMERS = "5.23.0"  # has DeepSeek-V4 eager modeling (the independent reference)
GGUF = "0.19.0"

# SGLang's dependencies on our serving path (its full list pulls Linux-only CUDA libraries).
# Exact pins where SGLang pins, floors elsewhere.
SERVING_DEPS: tuple[str, ...] = (
    "numpy<2.3",
    "orjson",
    "psutil",
    "pybase64",
    "requests",
    "packaging",
    "pillow",
    "starlette",
    "msgspec",
    "pydantic>=2",
    "pyzmq>=25.1.2",
    "tqdm",
    "IPython",
    "aiohttp",
    "uvicorn>=0.30",
    "fastapi",
    "python-multipart",
    f"transformers=={TRANSFORMERS}",
    "dill",
    "apache-tvm-ffi==0.1.11",
    "sentencepiece",
    "compressed-tensors==0.18.0",
    f"gguf=={GGUF}",
    "openai",
    "partial_json_parser",
    "setproctitle",
    "einops",
    "jsonschema",
    "xgrammar==0.2.7",
    "soundfile",
    "safetensors",
    "tokenizers",
    "pyyaml",
    "interegular",
    "regex",
    "blobfile",
    "prometheus-client",
    "python-dateutil",
    "xxhash",
)

# kt-kernel's wheel pins torch==2.9.1 but does not link libtorch: installed with --no-deps
# plus what it really imports.
KT_KERNEL_DEPS: tuple[str, ...] = (f"gguf=={GGUF}", "pyyaml", "packaging")

# Only for tests and development.
DEV_DEPS: tuple[str, ...] = (
    "pytest>=8",
    "hypothesis",
    "ruff",
    "uv",
    "tree-sitter",
    "tree-sitter-pwsh",
)

# Test tools with Linux wheels only: deepseek-recipe is the reference the pure-Python DeepSeek-V4
# chat encoding (winport/chat/dsv4_encoding.py) is checked against; it has no Windows wheel.
DEEPSEEK_RECIPE = "0.2.0"
LINUX_DEV_DEPS: tuple[str, ...] = (f"deepseek-recipe=={DEEPSEEK_RECIPE}",)
# They go to this folder inside the venv, not its site-packages: SGLang switches its DeepSeek chat
# path to deepseek-recipe whenever that imports, and the demo tokenizer lacks DeepSeek's special
# tokens, so a recipe in site-packages would stop every demo server at start. Tests that need
# them put the folder on sys.path themselves.
TEST_EXTRAS_DIR = "test-extras"

# Python modules SGLang imports that exist on Linux only (no win_amd64 wheel).
LINUX_ONLY_DEPS: tuple[str, ...] = ("uvloop",)
