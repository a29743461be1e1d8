"""DeepSeek-V4 / V4.1 chat where the deepseek-recipe package is absent (Windows, and any machine without it).

Targets sglang 0.5.23 `srt/entrypoints/openai/chat_encoding.py:resolve_chat_encoding_spec`, which
routes every DeepseekV4/V41 architecture to the "dsv4"/"dsv41" encoders, and
`srt/entrypoints/openai/chat_encoding_adapters.py:build_chat_encoding_adapter`, which builds their
adapter (`serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter`) on top of `deepseek-recipe`: a
Rust extension with Linux and macOS wheels only.

Without the package:
- a tokenizer with a chat template (Unsloth's GGUF files carry DeepSeek's template, the demo ships one)
  keeps SGLang's template path, as before;
- a tokenizer without one (DeepSeek's own release layout) gets SGLang's DeepSeek adapter with its
  prompt renderer replaced by winport's pure-Python encoding (winport/chat/dsv4_encoding.py, checked
  against deepseek-recipe in CI), and model output goes to SGLang's text parsers (`--reasoning-parser
  deepseek-v4`, `--tool-call-parser deepseekv4`): deepseek-recipe's token-level output parser has no
  Python counterpart here. The server never refuses to start for lack of a template.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.entrypoints.openai.chat_encoding.resolve_chat_encoding_spec"
BUILD_TARGET = "sglang.srt.entrypoints.openai.chat_encoding_adapters.build_chat_encoding_adapter"
ADAPTER = "sglang.srt.entrypoints.openai.serving_deepseek_recipe.DeepSeekRecipeChatEncodingAdapter"
RENDERER = "sglang.srt.parser.deepseek_recipe_renderer.DeepSeekRecipe"
RECIPE_SPECS = ("dsv4", "dsv41")
logger = logging.getLogger(__name__)


def recipe_available() -> bool:
    """Whether the deepseek-recipe package can be imported here."""
    try:
        return importlib.util.find_spec("deepseek_recipe") is not None
    except ValueError:  # sys.modules["deepseek_recipe"] is None: the import is blocked
        return False


def _resolve(original: Any, *args: Any, **kwargs: Any) -> Any:
    spec = original(*args, **kwargs)
    if spec not in RECIPE_SPECS or recipe_available():
        return spec
    tokenizer = kwargs.get("tokenizer")
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        logger.info("winport: deepseek-recipe is not available here; %s prompts use the "
                    "tokenizer's chat template", spec)
        return None
    logger.info("winport: deepseek-recipe is not available here and the tokenizer has no chat template; "
                "%s prompts use winport's DeepSeek-V4 chat encoding", spec)
    return spec


class WinportDeepSeekRenderer:
    """Stands in for SGLang's `DeepSeekRecipe` where the adapter calls it: `encode` (a chat body to
    prompt ids, with SGLang's V4.1 integer effort and quick-instruction tasks) and `encode_text`."""

    def __init__(self, spec: str, tokenizer: Any):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError("the DeepSeek-V4 chat encoding needs the checkpoint's fast tokenizer (tokenizer.json)")
        self.spec = spec
        self.hf_tokenizer = backend  # the name SGLang's DeepSeekRecipe._attach_task reads

    def encode(self, body: dict[str, Any], *, task: str | None = None, effort_budget: int | None = None,
               image_urls: list[str] | None = None) -> list[int]:
        """Prompt ids for an SGLang chat body; ValueError for a request the encoding refuses."""
        from sglang.srt.parser.deepseek_recipe_renderer import DeepSeekRecipe

        from winport.chat import dsv4_encoding

        budget = effort_budget if body["thinking"] else None
        prompt = dsv4_encoding.render(body, self.spec, effort_budget=budget)
        ids = dsv4_encoding.encode(prompt, self.hf_tokenizer)
        if image_urls is not None:
            image_urls.extend(prompt.image_urls)
        if task is not None:
            ids = DeepSeekRecipe._attach_task(self, ids, task, body["thinking"])  # type: ignore[arg-type]
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Plain text ids (the continued prefix of a task)."""
        return self.hf_tokenizer.encode(text, add_special_tokens=False).ids


def _adapter_class() -> type:
    """SGLang's DeepSeek adapter with winport's renderer and SGLang's text parsers for the output."""
    from sglang.srt.entrypoints.openai.chat_encoding_adapters import ADAPTER_OUTPUT_PARSERS
    from sglang.srt.entrypoints.openai.serving_deepseek_recipe import (
        DEFAULT_EFFORT_ENVS,
        DeepSeekRecipeChatEncodingAdapter,
        _numeric_effort,
    )

    class WinportDeepSeekAdapter(DeepSeekRecipeChatEncodingAdapter):  # type: ignore[misc, valid-type]
        def __init__(self, ctx: Any):
            # The attributes upstream's __init__ sets, without building deepseek-recipe objects.
            self._spec = ctx.chat_encoding_spec
            self.deepseek_recipe = WinportDeepSeekRenderer(self._spec, ctx.tokenizer)
            raw = (DEFAULT_EFFORT_ENVS[self._spec].get() or "").strip()
            self._default_effort = _numeric_effort(raw) if raw else None
            defaults = ctx.default_chat_template_kwargs or {}
            # As upstream: a bad server default effort fails at start, not per request.
            self._encode({"messages": [{"role": "user", "content": ""}], "thinking": True},
                         effort=defaults.get("reasoning_effort"))
            self._token_output = False  # output goes to SGLang's text parsers
            self._separate_reasoning = ctx.reasoning_parser is not None
            self._hooks = ctx.chat_hooks
            self._parser_names = ADAPTER_OUTPUT_PARSERS[self._spec]

        def separate_reasoning_text(self, text: str) -> tuple[str, str]:
            from sglang.srt.parser.reasoning_parser import ReasoningParser

            reasoning, normal = ReasoningParser(self._parser_names[0], stream_reasoning=False).parse_non_stream(text)
            return reasoning or "", normal or ""

        def parse_function_call_text(self, text: str, tools: list[Any]) -> tuple[str, list[Any]]:
            from sglang.srt.function_call.function_call_parser import FunctionCallParser

            if not tools:
                return text, []
            return FunctionCallParser(tools=tools, tool_call_parser=self._parser_names[1]).parse_non_stream(text)

    return WinportDeepSeekAdapter


def _build(original: Any, ctx: Any, *args: Any, **kwargs: Any) -> Any:
    if ctx.chat_encoding_spec not in RECIPE_SPECS or recipe_available():
        return original(ctx, *args, **kwargs)
    if ctx.tokenizer is None:
        return None  # --skip-tokenizer-init: no chat prompts to encode (as upstream)
    return _adapter_class()(ctx)


def register_patch() -> None:
    """Check upstream and register the hooks."""
    require_source(TARGET, 'return "dsv4"', "tokenizer")
    require_source(BUILD_TARGET, "_BUILDERS", "builder(ctx)")
    require_source(ADAPTER + ".__init__", "self._spec", "self.deepseek_recipe", "self._default_effort",
                   "self._token_output", "self._separate_reasoning", "self._hooks")
    require_source(ADAPTER + ".encode_messages", "self._encode(", "self.deepseek_recipe.encode_text")
    require_source(ADAPTER + "._encode", "self.deepseek_recipe.encode(", "effort_budget=budget")
    require_source(ADAPTER, "return self if self._token_output else None")
    require_source(RENDERER + "._attach_task", "self.hf_tokenizer.token_to_id")
    register(TARGET, _resolve)
    register(BUILD_TARGET, _build)
