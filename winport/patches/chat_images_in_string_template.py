"""Images in a DeepSeek chat whose Jinja template takes content as a string: placeholders, not dropped.

Targets sglang 0.5.23 `srt/parser/jinja_template_utils.py:process_content_for_template_format`
as `srt/entrypoints/openai/serving_chat.py` imports it. Without deepseek-recipe (no Windows build;
winport.patches.chat_template_without_recipe) a DeepSeek-V4.1 chat is rendered by the model's Jinja
template. When that template only prints ``message['content']`` (SGLang's "string" content
format, what DeepSeek-style templates are), SGLang flattens a multimodal message to its text and
drops every image without a word: the request is answered as if no image had been sent. Here such
a message keeps its images: they are collected into the request's image data as for an "openai"
format template (the upstream function does that part), and each image's place in the text gets
DeepSeek-V4.1's image placeholder, which SGLang's V4.1 image processor expands into the image's
token span (a model without a vision tower then refuses the image instead of ignoring it).
Text parts are joined with single spaces, as upstream joins them. Messages with other media, or
without images, and the other formats are left to SGLang.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.entrypoints.openai.serving_chat.process_content_for_template_format"
# DeepSeek-V4.1's image placeholder (SGLang's parser/deepseek_recipe_renderer.py IMAGE_TOKEN).
IMAGE_TOKEN = "<｜deepseek_image｜>"
_IMAGE_PARTS = ("image_url", "input_image")


def _flatten(parts: list[dict[str, Any]]) -> str:
    out: list[str] = []
    text_before = False
    for part in parts:
        if part.get("type") == "image":
            out.append(IMAGE_TOKEN)
            text_before = False
        elif part.get("type") == "text":
            out.append((" " if text_before else "") + part["text"])
            text_before = True
    return "".join(out)


def _process(original: Any, msg_dict: dict[str, Any], content_format: str, image_data: list[Any],
             video_data: list[Any], audio_data: list[Any], modalities: list[Any], *args: Any, **kwargs: Any) -> Any:
    content = msg_dict.get("content")
    types = {c.get("type") for c in content if isinstance(c, dict)} if isinstance(content, list) else set()
    if (content_format != "string" or args or kwargs.get("use_dpsk_v32_encoding")
            or not types & set(_IMAGE_PARTS) or not types <= {*_IMAGE_PARTS, "text", "input_text"}):
        return original(msg_dict, content_format, image_data, video_data, audio_data, modalities, *args, **kwargs)
    msg = original(msg_dict, "openai", image_data, video_data, audio_data, modalities)
    msg["content"] = _flatten(msg["content"])
    return msg


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source("sglang.srt.parser.jinja_template_utils.process_content_for_template_format",
                   'processed_content_parts.append({"type": "image"})',
                   "# Note: For string format, we ignore images/audio")
    require_source(TARGET)
    register(TARGET, _process)
