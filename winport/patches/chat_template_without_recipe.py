"""DeepSeek-V4 chat prompts through the model's Jinja chat template when deepseek-recipe is absent.

Targets sglang 0.5.23 `srt/entrypoints/openai/chat_encoding.py:resolve_chat_encoding_spec`, which
routes every DeepseekV4/V41 architecture to the "dsv4"/"dsv41" encoders of the `deepseek-recipe`
package: a Rust extension with Linux and macOS wheels only. On Windows (and wherever it is not
installed) the tokenizer's own chat template is used instead: Unsloth's GGUF files carry DeepSeek's
template in `tokenizer.chat_template`, and the demo model ships one. A model with neither is refused
with a message saying what is missing.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.entrypoints.openai.chat_encoding.resolve_chat_encoding_spec"
RECIPE_SPECS = ("dsv4", "dsv41")
logger = logging.getLogger(__name__)


def recipe_available() -> bool:
    """Whether the deepseek-recipe package can be imported here."""
    return importlib.util.find_spec("deepseek_recipe") is not None


def _resolve(original: Any, *args: Any, **kwargs: Any) -> Any:
    spec = original(*args, **kwargs)
    if spec not in RECIPE_SPECS or recipe_available():
        return spec
    tokenizer = kwargs.get("tokenizer")
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        logger.info("winport: deepseek-recipe is not available here; %s prompts use the "
                    "tokenizer's chat template", spec)
        return None
    raise RuntimeError(
        f"this DeepSeek-V4 model needs either the deepseek-recipe package (no Windows build) or a "
        f"chat template in its tokenizer; it has neither (chat encoding {spec!r})"
    )


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(TARGET, 'return "dsv4"', "tokenizer")
    register(TARGET, _resolve)
