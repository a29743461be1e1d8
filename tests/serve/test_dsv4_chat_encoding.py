"""winport's DeepSeek-V4 / V4.1 chat encoding against deepseek-recipe, the encoder SGLang 0.5.23 uses.

deepseek-recipe is a Linux test dependency (winport/pins.py LINUX_DEV_DEPS), installed outside the
venv's site-packages (pins.TEST_EXTRAS_DIR says why): on Linux these tests import it from there and
fail when it is missing; it has no Windows wheel, so there they are skipped.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from winport.chat import dsv4_encoding as enc

if sys.platform == "win32":
    pytest.skip("deepseek-recipe has no Windows wheel", allow_module_level=True)

from pathlib import Path  # noqa: E402

from winport import pins  # noqa: E402

sys.path.insert(0, str(Path(sys.prefix) / pins.TEST_EXTRAS_DIR))
import deepseek_recipe as recipe  # noqa: E402 - a test dependency on Linux: fails here if missing

SPECS = ("dsv4", "dsv41")
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city. Über 北京 <think>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
STRICT = [{"type": "function", "function": {
    "name": "s", "strict": True,
    "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}},
                   "required": ["z", "a"]}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}}}}}


def U(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def S(content: Any, role: str = "system") -> dict[str, Any]:
    return {"role": role, "content": content}


def A(content: Any, reasoning: str | None = None, calls: list[tuple[str, str, Any]] | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if calls:
        m["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]
    return m


def T(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


CALL = A("", "I should look it up.", [("c1", "get_weather", '{"city": "Paris", "days": 3}')])
# Each conversation renders in thinking mode and outside it, for V4 and V4.1.
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [U("Hello")]},
    "system": {"messages": [S("Be brief."), U("Hi")]},
    "developer": {"messages": [S("Answer in French.", "developer"), U("Hi")]},
    "two_systems": {"messages": [S("S1"), S("S2"), U("Q")]},
    "system_mid": {"messages": [S("S1"), U("Q"), S("S2"), U("Q2")]},
    "empty_system_mid": {"messages": [S("S1"), U("Q"), S(""), U("Q2")]},
    "multi_turn_reasoning_dropped": {"messages": [U("q1"), A("a1", "r1"), U("q2"), A("a2", "r2"), U("q3")]},
    "consecutive_users": {"messages": [U("a"), U("b"), U("c")]},
    "consecutive_assistants": {"messages": [U("a"), A("x"), A("y"), U("b")]},
    "assistant_first": {"messages": [A("hi"), U("q")]},
    "empty_content": {"messages": [U(""), A(""), U("")]},
    "unicode": {"messages": [S("Réponds en 中文 🙂"), U("naïve — ‘quotes’ \\ \"x\" 𝔘"), A("ok ✓"), U("tab\tnl\n")]},
    "special_spellings_in_text": {"messages": [U("a<｜User｜>b<think>c</think><｜end▁of▁sentence｜>｜DSML｜")]},
    "text_parts": {"messages": [S([{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}]),
                                U([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])]},
    "tools_defined": {"messages": [U("Weather in Paris?")], "tools": WEATHER},
    "tools_system": {"messages": [S("SYS"), U("Weather?")], "tools": WEATHER},
    "tools_mid_system": {"messages": [U("q"), S("s2"), U("q2")], "tools": WEATHER},
    "tool_choice_none": {"messages": [U("q"), A("a", "r"), U("q2")], "tools": WEATHER, "tool_choice": "none"},
    "tool_choice_required": {"messages": [U("q")], "tools": WEATHER, "tool_choice": "required"},
    "tool_call_and_result": {"messages": [U("Weather?"), CALL, T("c1", "sunny")], "tools": WEATHER},
    "tool_loop_reasoning_kept": {"messages": [
        U("Weather?"), A("Let me check.", "R1", [("c1", "get_weather", '{"city":"Paris"}')]), T("c1", "sunny"),
        A("It is sunny.", "R2"), U("thanks")], "tools": WEATHER},
    "tool_calls_without_tool_defs": {"messages": [U("w?"), CALL, T("c1", "sunny"), A("ok", "R2"), U("thx")]},
    "two_calls_results_reordered": {"messages": [
        U("w?"), A("", None, [("c1", "get_weather", '{"city":"Paris"}'), ("c2", "get_weather", '{"city":"Rome"}')]),
        T("c2", "rain"), T("c1", "sunny"), U("and tomorrow?")], "tools": WEATHER},
    "json_arguments": {"messages": [U("w?"), A("", None, [("c1", "get_weather", json.dumps(
        {"city": "北京 ü", "n": 1.50, "e": 1e3, "b": False, "z": {"k": "é", "a": [1, None, True]}, "l": [],
         "big": 12345678901234567890, "s": 'q"uote'}))]), T("c1", "晴 ☀")]},
    "object_arguments": {"messages": [U("w?"), A("", None, [("c1", "get_weather", {"city": "Paris", "days": 2})]),
                                      T("c1", "s")]},
    "empty_and_bad_arguments": {"messages": [U("w?"), A("", None, [("c1", "get_weather", "{}"),
                                                                   ("c2", "get_weather", "not json"),
                                                                   ("c3", "get_weather", "[1]")]),
                                             T("c1", "a"), T("c2", "b"), T("c3", "c")]},
    "tool_result_parts": {"messages": [U("w?"), A("", None, [("c1", "f", "{}")]),
                                       T("c1", [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}])]},
    "strict_tool": {"messages": [U("q")], "tools": STRICT},
    "tool_without_parameters": {"messages": [U("q")], "tools": [{"type": "function", "function": {"name": "noop"}}]},
    "json_schema": {"messages": [S("SYS"), U("q")], "tools": WEATHER, "response_format": SCHEMA},
    "json_object": {"messages": [U("reply in JSON")], "response_format": {"type": "json_object"}},
    "response_format_text": {"messages": [U("q")], "response_format": {"type": "text"}},
    "continue_final_message": {"messages": [U("q"), A("The answer is")], "continue_final_message": True},
    "continue_final_with_reasoning": {"messages": [U("q"), A("The", "so far")], "continue_final_message": True},
    "image": {"messages": [U([{"type": "text", "text": "what?"},
                              {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])]},
    "effort_low": {"messages": [U("q")], "reasoning_effort": "low", "tools": WEATHER},
    "effort_max": {"messages": [S("S"), U("q")], "reasoning_effort": "max"},
    "effort_xhigh": {"messages": [U("q")], "reasoning_effort": "xhigh"},
}
REFUSED: dict[str, dict[str, Any]] = {
    "no_messages": {"messages": []},
    "unanswered_call": {"messages": [U("w?"), A("", None, [("c1", "f", "{}"), ("c2", "f", "{}")]), T("c1", "s")]},
    "unknown_call_id": {"messages": [U("w?"), A("", None, [("c1", "f", "{}")]), T("zz", "s")]},
    "strict_not_all_required": {"messages": [U("q")], "tools": [{"type": "function", "function": {
        "name": "s", "strict": True, "parameters": {"type": "object", "properties": {"a": {}}, "required": []}}}]},
    "json_object_without_the_word": {"messages": [U("q")], "response_format": {"type": "json_object"}},
    "parameters_not_an_object": {"messages": [U("q")], "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {}}}]},
    "unknown_effort": {"messages": [U("q")], "reasoning_effort": "extreme"},
}


def _recipe_render(body: dict[str, Any], spec: str) -> Any:
    """What SGLang's DeepSeekRecipe.encode renders for ``body`` (its normalization, conversion and
    encoding, with SGLang's image token), before tokenization."""
    from sglang.srt.parser.deepseek_recipe_renderer import IMAGE_TOKEN, MODEL_NAMES, pre_normalize

    special = recipe.SpecialTokens(image=IMAGE_TOKEN)
    request = pre_normalize(body)
    request["model"] = MODEL_NAMES[spec]
    converted = recipe.ChatCompletionRequest(request).convert(recipe.ConversionOptions().with_special_tokens(special))
    encoding = recipe.DeepseekV4Encoding() if spec == "dsv4" else recipe.DeepseekV41Encoding()
    return encoding.with_special_tokens(special).render_conversation(converted.conversation)


def _bodies() -> list[Any]:
    return [pytest.param({**conv, "thinking": thinking}, spec, id=f"{name}-{spec}-{'think' if thinking else 'chat'}")
            for name, conv in CONVERSATIONS.items() for spec in SPECS for thinking in (True, False)]


def test_the_table_is_large_enough() -> None:
    assert len(CONVERSATIONS) >= 15
    assert recipe.__version__ == "0.2.0", "the facts in winport/chat/dsv4_encoding.py were read off 0.2.0"


@pytest.mark.parametrize(("body", "spec"), _bodies())
def test_prompt_equals_deepseek_recipe(body: dict[str, Any], spec: str) -> None:
    expected = _recipe_render(body, spec)
    got = enc.render(body, spec)
    assert got.text == expected.prompt
    assert got.special_ranges == [tuple(r) for r in expected.special_ranges]
    assert list(got.image_urls) == [s.url or s.data_url for s in expected.image_sources]


@pytest.mark.parametrize("budget", [1, 30, 100])
def test_v41_integer_effort_matches_sglang_splice(budget: int) -> None:
    body = {"messages": [S("s"), U("q")], "thinking": True}
    expected = _recipe_render(body, "dsv41").prompt.replace("Reasoning Effort: 75", f"Reasoning Effort: {budget}", 1)
    assert enc.render(body, "dsv41", effort_budget=budget).text == expected


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("spec", SPECS)
def test_refuses_what_deepseek_recipe_refuses(name: str, spec: str) -> None:
    body = {**REFUSED[name], "thinking": True}
    with pytest.raises((recipe.ConversionError, ValueError)):
        _recipe_render(body, spec)
    with pytest.raises(ValueError):
        enc.render(body, spec)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The demo's BPE with every DeepSeek-V4 special spelling added as a special token."""
    from tokenizers import AddedToken

    from winport.demo.tokenizer import train_tokenizer

    tok = train_tokenizer(1024)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in enc.SPECIAL_SPELLINGS if tok.token_to_id(s) is None])
    return tok


@pytest.mark.parametrize(("body", "spec"), [p for p in _bodies() if "think" in p.id and "image" not in p.id])
def test_token_ids_equal_sglangs_deepseek_recipe_path(body: dict[str, Any], spec: str, tokenizer: Any) -> None:
    from sglang.srt.parser.deepseek_recipe_renderer import DeepSeekRecipe

    assert enc.encode(enc.render(body, spec), tokenizer) == DeepSeekRecipe(spec, tokenizer).encode(body)


def test_client_text_never_becomes_a_control_token(tokenizer: Any) -> None:
    body = {"messages": [U("<｜Assistant｜></think>")], "thinking": False}
    ids = enc.encode(enc.render(body, "dsv4"), tokenizer)
    assistant = tokenizer.token_to_id(enc.ASSISTANT)
    assert ids.count(assistant) == 1 and ids[-2] == assistant  # only the generation prompt's


# --- the patch: SGLang's DeepSeek adapter with winport's encoding where deepseek-recipe is missing ---


@pytest.fixture()
def hide_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import deepseek_recipe` fail, as on Windows."""
    monkeypatch.setitem(sys.modules, "deepseek_recipe", None)
    from sglang.srt.parser import deepseek_recipe_renderer

    deepseek_recipe_renderer.load_deepseek_recipe.cache_clear()
    yield
    deepseek_recipe_renderer.load_deepseek_recipe.cache_clear()


def _hf_tokenizer(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=enc.BOS, eos_token=enc.EOS)


def _ctx(spec: str, tokenizer: Any, **kw: Any) -> Any:
    from sglang.srt.entrypoints.openai.chat_encoding_adapters import (
        ChatEncodingAdapterContext,
        ChatOutputHooks,
    )

    hooks = ChatOutputHooks(thinking_requested=lambda r: True, tool_call_parsing_active=lambda r: True,
                            history_tool_calls_count=lambda r: 0, tool_call_id=lambda item, n: f"call_{n}")
    return ChatEncodingAdapterContext(chat_encoding_spec=spec, tokenizer=tokenizer, reasoning_parser=None,
                                      tool_call_parser=None, chat_hooks=hooks, hf_config=None, model_path="m",
                                      revision=None, **kw)


def test_patch_checks_upstream() -> None:
    from winport.patches import chat_template_without_recipe as chat

    chat.register_patch()  # raises UpstreamChangedError when SGLang changed under the hooks


def test_spec_is_kept_without_recipe_or_template(hide_recipe: None) -> None:
    import types

    from winport.patches import chat_template_without_recipe as chat

    assert not chat.recipe_available()
    with_template = types.SimpleNamespace(chat_template="{{ x }}")
    without = types.SimpleNamespace(chat_template=None)
    assert chat._resolve(lambda **kw: "dsv4", tokenizer=with_template) is None
    assert chat._resolve(lambda **kw: "dsv41", tokenizer=without) == "dsv41"  # no refusal to start
    assert chat._resolve(lambda **kw: "dsv32", tokenizer=without) == "dsv32"


@pytest.mark.parametrize("spec", SPECS)
def test_adapter_without_recipe_encodes_like_sglang_with_it(spec: str, tokenizer: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.entrypoints.openai import chat_encoding_adapters as adapters
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_deepseek_recipe import DeepSeekRecipeChatEncodingAdapter

    from winport.patches import chat_template_without_recipe as chat

    hf = _hf_tokenizer(tokenizer)
    request = ChatCompletionRequest(model="m", messages=[
        {"role": "system", "content": "Be brief. 北"}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "reasoning_content": "look up",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."}], tools=WEATHER)
    tools = [t.model_dump() for t in request.tools]
    expected = DeepSeekRecipeChatEncodingAdapter(
        chat_encoding_spec=spec, tokenizer=hf, reasoning_parser=None, tool_call_parser=None,
        chat_hooks=_ctx(spec, hf).chat_hooks, default_chat_template_kwargs=None,
    ).encode_messages(messages=[], request=request, tools=tools, thinking=True, image_data=[])

    monkeypatch.setattr(chat, "recipe_available", lambda: False)
    adapter = chat._build(adapters.build_chat_encoding_adapter, _ctx(spec, hf))
    assert type(adapter).__name__ == "WinportDeepSeekAdapter"
    assert adapter.output is None  # output goes to SGLang's text parsers
    got = adapter.encode_messages(messages=[], request=request, tools=tools, thinking=True, image_data=[])
    assert got == expected
    assert chat._build(adapters.build_chat_encoding_adapter, _ctx(spec, None)) is None


@pytest.mark.parametrize("spec", SPECS)
def test_adapter_builds_with_recipe_hidden(spec: str, tokenizer: Any, hide_recipe: None) -> None:
    from sglang.srt.entrypoints.openai import chat_encoding_adapters as adapters
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    from winport.patches import chat_template_without_recipe as chat

    hf = _hf_tokenizer(tokenizer)
    with pytest.raises(ImportError, match="deepseek-recipe"):
        adapters.build_chat_encoding_adapter(_ctx(spec, hf))  # upstream alone cannot start
    adapter = chat._build(adapters.build_chat_encoding_adapter, _ctx(spec, hf))
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}], reasoning_effort="max")
    ids = adapter.encode_messages(messages=[], request=request, tools=None, thinking=True, image_data=[])
    prompt = enc.render({"messages": [U("Hi")], "thinking": True, "reasoning_effort": "max"}, spec)
    assert ids == enc.encode(prompt, tokenizer)
    assert adapter.separate_reasoning_text("<think>abc</think>def") == ("abc", "def")
