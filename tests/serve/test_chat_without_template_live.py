"""Chat on a DeepSeek-V4 checkpoint in DeepSeek's release layout, without deepseek-recipe, for real.

DeepSeek ships no chat template in its tokenizer files (its encoding is code), and SGLang 0.5.23 routes
every DeepSeek-V4 chat request to the deepseek-recipe package, which has no Windows wheel: before
winport/patches/chat_template_without_recipe.py fell back to winport's pure-Python encoding
(winport/chat/dsv4_encoding.py) such a server refused to start; with upstream's adapter alone it fails
at start with deepseek-recipe's ImportError. Here the demo model gets that layout: its tokenizer
without a chat template and with DeepSeek-V4's special tokens (the ones the encoding emits) inside
the model's vocabulary. deepseek-recipe is installed outside the venv's site-packages (winport/pins.py
TEST_EXTRAS_DIR), so the server, run as a user runs it (`python -m winport serve --model <folder>`),
cannot import it. One server for the module; each request asks SGLang for the prompt ids it
tokenized (`return_prompt_token_ids`), which must equal winport's encoding of the same conversation.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serve._server import CACHE, Server, start, stop, wait_ready
from winport.chat import dsv4_encoding as enc

SPEC = "dsv4"  # the demo's architecture is DeepseekV4ForCausalLM
FALLBACK_LOG = "prompts use winport's DeepSeek-V4 chat encoding"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MESSAGES = [{"role": "system", "content": "Be brief. Réponds en français."},
            {"role": "user", "content": "What is the weather in Paris? <｜User｜> stays text."}]


def _release_layout(dest: Path) -> Path:
    """The demo model with its tokenizer rewritten as DeepSeek's release has it: every special spelling
    of the DeepSeek-V4 encoding a special token, and no chat template."""
    from tokenizers import Tokenizer

    from winport.demo.build import ensure_demo
    from winport.demo.tokenizer import SPECIAL_TOKENS, write_tokenizer

    demo = ensure_demo("v4", folder=CACHE / "demo-v4")  # the folder `winport serve --demo` uses in the tests
    config = json.loads((demo / "config.json").read_text(encoding="utf-8"))
    vocab_size = config["vocab_size"]
    dest.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy2(demo / name, dest / name)
    # The demo's vocabulary is full: the BPE is trained that many ids smaller, so the added tokens take
    # the top ids and the embedding rows stay the model's (random weights: any id assignment serves).
    missing = [s for s in enc.SPECIAL_SPELLINGS if s not in SPECIAL_TOKENS]
    size = write_tokenizer(dest, vocab_size - len(missing), extra_special=missing)
    tok_config = json.loads((dest / "tokenizer_config.json").read_text(encoding="utf-8"))
    del tok_config["chat_template"]  # winport.demo.tokenizer keeps the demo's template only here
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1, ensure_ascii=False) + "\n",
                                                encoding="utf-8")
    assert not list(dest.glob("*.jinja")) and size <= vocab_size
    tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
    for spelling in enc.SPECIAL_SPELLINGS:
        tid = tok.token_to_id(spelling)
        assert tid is not None and tid < vocab_size, (spelling, tid, vocab_size)
    return dest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo checkpoint in DeepSeek's release layout (see _release_layout)."""
    return _release_layout(tmp_path_factory.mktemp("release-layout") / "dsv4-without-template")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    """The checkpoint's own fast tokenizer, as the server loads it."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Server]:
    """`winport serve --model <folder>` once for the module; stopped at the end."""
    srv = start(["--model", str(model_dir), "--max-running-requests", "2"])
    wait_ready(srv)
    yield srv
    stop(srv)


def _chat(srv: Server, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = {"model": "dsv4-without-template", "messages": MESSAGES, "max_tokens": 3, "temperature": 0,
            "return_prompt_token_ids": True, **fields}
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310 - loopback only
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode()}


def _expected_ids(tokenizer: Any, thinking: bool, tools: list[dict[str, Any]] | None = None) -> list[int]:
    """winport's encoding of MESSAGES as SGLang's DeepSeek adapter hands it the conversation."""
    body: dict[str, Any] = {"messages": MESSAGES, "thinking": thinking, "continue_final_message": False}
    if tools is not None:
        body["tools"] = tools
    return enc.encode(enc.render(body, SPEC), tokenizer)


def _answered(status: int, reply: dict[str, Any]) -> list[int]:
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("length", "stop", "tool_calls")
    assert 1 <= reply["usage"]["completion_tokens"] <= 3
    ids = choice["prompt_token_ids"]
    assert reply["usage"]["prompt_tokens"] == len(ids)
    return ids


def test_server_starts_and_says_which_encoding(server: Server) -> None:
    assert FALLBACK_LOG in server.text()
    assert "tokenizer's chat template" not in server.text()  # the template branch was not taken


def test_chat_prompt_is_winports_encoding(server: Server, tokenizer: Any) -> None:
    ids = _answered(*_chat(server))
    assert ids == _expected_ids(tokenizer, thinking=False)
    assert ids[0] == tokenizer.token_to_id(enc.BOS)
    assert ids[-2:] == [tokenizer.token_to_id(enc.ASSISTANT), tokenizer.token_to_id(enc.END_THINK)]
    assert ids.count(tokenizer.token_to_id(enc.USER)) == 1  # the client's "<｜User｜>" stayed text


def test_thinking_prompt_is_winports_encoding(server: Server, tokenizer: Any) -> None:
    ids = _answered(*_chat(server, chat_template_kwargs={"thinking": True}))
    assert ids == _expected_ids(tokenizer, thinking=True)
    assert ids[-2:] == [tokenizer.token_to_id(enc.ASSISTANT), tokenizer.token_to_id(enc.THINK)]


def test_tools_prompt_is_winports_encoding(server: Server, tokenizer: Any) -> None:
    ids = _answered(*_chat(server, tools=WEATHER))
    assert ids == _expected_ids(tokenizer, thinking=False, tools=WEATHER)
    assert tokenizer.token_to_id(enc.DSML) in ids  # the tool instructions' DSML tags are control tokens
    assert len(ids) > len(_expected_ids(tokenizer, thinking=False))
