"""winport.patches.chat_template_without_recipe: the tokenizer's chat template stands in for the
deepseek-recipe package only when that package is missing."""

from __future__ import annotations

import types

import pytest


def test_chat_template_replaces_the_recipe_only_when_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import chat_template_without_recipe as chat

    with_template = types.SimpleNamespace(chat_template="{{ x }}")
    without = types.SimpleNamespace(chat_template=None)
    monkeypatch.setattr(chat, "recipe_available", lambda: False)
    assert chat._resolve(lambda **kw: "dsv4", tokenizer=with_template) is None
    assert chat._resolve(lambda **kw: "dsv32", tokenizer=with_template) == "dsv32"
    # No template either: the spec stays and winport's encoding renders it (tests/serve/test_dsv4_chat_encoding.py).
    assert chat._resolve(lambda **kw: "dsv41", tokenizer=without) == "dsv41"
    monkeypatch.setattr(chat, "recipe_available", lambda: True)
    assert chat._resolve(lambda **kw: "dsv4", tokenizer=with_template) == "dsv4"
