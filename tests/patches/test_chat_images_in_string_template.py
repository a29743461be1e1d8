"""Images in chats rendered by a "string" content-format Jinja template
(winport.patches.chat_images_in_string_template): collected as image data, each replaced in the text
by DeepSeek-V4.1's image placeholder, instead of SGLang's silent drop; everything else unchanged."""

from __future__ import annotations

from typing import Any

from sglang.srt.parser.jinja_template_utils import process_content_for_template_format as upstream

from winport.patches.chat_images_in_string_template import IMAGE_TOKEN, _process

IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def _run(msg: dict[str, Any], fmt: str = "string") -> tuple[dict[str, Any], list[Any], list[Any]]:
    images: list[Any] = []
    upstream_images: list[Any] = []
    out = _process(upstream, msg, fmt, images, [], [], [])
    ref = upstream(msg, fmt, upstream_images, [], [], [])
    return out, images, [ref, upstream_images]


def test_images_become_placeholders_in_order() -> None:
    msg = {"role": "user", "content": [IMG, {"type": "text", "text": "What is"}, {"type": "text", "text": "this?"},
                                       IMG, {"type": "text", "text": "And that?"}]}
    out, images, (ref, ref_images) = _run(msg)
    assert out["content"] == f"{IMAGE_TOKEN}What is this?{IMAGE_TOKEN}And that?"
    assert [i.url for i in images] == [IMG["image_url"]["url"]] * 2
    # What SGLang alone does: the images are gone, without an error.
    assert ref["content"] == "What is this? And that?" and ref_images == []


def test_other_messages_are_left_to_sglang() -> None:
    text_only = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    plain = {"role": "user", "content": "hello"}
    for msg, fmt in ((text_only, "string"), (plain, "string"), ({"role": "user", "content": [IMG]}, "openai")):
        out, images, (ref, ref_images) = _run(msg, fmt)
        assert out == ref, (msg, fmt)
        assert len(images) == len(ref_images)
