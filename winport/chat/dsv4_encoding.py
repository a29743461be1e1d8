"""DeepSeek-V4 / V4.1 chat prompts in pure Python, for where the `deepseek-recipe` package is missing.

SGLang 0.5.23 renders every DeepSeek-V4 ("dsv4") and V4.1 ("dsv41") chat request through
deepseek-recipe, a Rust extension with Linux and macOS wheels only; DeepSeek's own checkpoints carry no
chat template. This module produces the same prompt, character for character, from the request body
SGLang hands deepseek-recipe (`sglang.srt.parser.deepseek_recipe_renderer.DeepSeekRecipe.encode`):
``messages``, ``thinking`` and, when set, ``tools``, ``tool_choice``, ``response_format``,
``continue_final_message`` and a named ``reasoning_effort``. tests/serve/test_dsv4_chat_encoding.py
checks it against deepseek-recipe 0.2.0 over a table of conversations.

The prompt is kept as pieces, each marked special or plain, because deepseek-recipe encodes the
special-token spellings of its own template as token ids and everything a client wrote (message text,
reasoning, tool arguments, schemas) as plain text, so a client cannot inject a control token.

Facts carried over from deepseek-recipe 0.2.0 (observed, not copied):
- V4 puts every system message, joined by a blank line, at the top, right after BOS and with no role
  token; V4.1 renders each non-empty system message in place behind ``<｜System｜>``.
- The reasoning-effort line, the tool instructions and the response format go into the first system
  block (a V4.1 block is created at the top when the conversation does not open with a system message).
- Consecutive user and tool-result messages merge into one user turn, joined by a blank line; tool
  results are ordered by their call's position and wrapped in ``<tool_result>``.
- Earlier reasoning is rendered only in thinking mode and only when the request defines tools (or on
  a continued final message); otherwise an assistant turn opens with ``</think>``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SPECS = ("dsv4", "dsv41")

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
SYSTEM = "<｜System｜>"  # V4.1 only
THINK = "<think>"
END_THINK = "</think>"
DSML = "｜DSML｜"
# SGLang renders images with the checkpoint tokenizer's spelling (deepseek-recipe's default differs).
IMAGE = "<｜deepseek_image｜>"
V4_IMAGE_TEXT = "[Unsupported Image]"  # V4 has no vision: an image part becomes this text
SPECIAL_SPELLINGS = (BOS, EOS, USER, ASSISTANT, SYSTEM, THINK, END_THINK, DSML, IMAGE)
_SPECIAL_RE = re.compile("|".join(re.escape(s) for s in sorted(SPECIAL_SPELLINGS, key=len, reverse=True)))

# The DSML tag names of the tool-call block: V4 `<｜DSML｜tool_calls>`, V4.1 `<｜DSML｜ calls>`.
_TAGS = {
    "dsv4": {"calls": DSML + "tool_calls", "invoke": DSML + "invoke", "param": DSML + "parameter"},
    "dsv41": {"calls": DSML + " calls", "invoke": DSML + " invoke", "param": DSML + " parameter"},
}

_V4_EFFORT = {
    "high": (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
        "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
        "and adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate step, "
        "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
        "unchecked."
    ),
    "max": (
        "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
        "exhaustively decompose the problem into its most fundamental components, trace every causal "
        "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
        "Do not stop reasoning until you have independently verified the solution from multiple angles "
        "and are certain that no assumption remains unchecked and no error remains undiscovered."
    ),
}
_V41_EFFORT_BUDGET = {"low": 50, "high": 75, "max": 100}
V41_EFFORT_LINE = "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)"
# The named efforts deepseek-recipe accepts, by the tier it renders (an unset effort is "high").
_EFFORT_TIERS = {
    "none": "high", "minimal": "low", "low": "low", "medium": "high", "high": "high", "xhigh": "high",
    "ultra": "max", "max": "max",
}

_TOOLS_HEAD = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    'writing a "<{calls}>" block like the following:\n\n'
    "<{calls}>\n"
    '<{invoke} name="$TOOL_NAME">\n'
    '<{param} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{param}>\n'
    "...\n"
    "</{invoke}>\n"
    '<{invoke} name="$TOOL_NAME2">\n'
    "...\n"
    "</{invoke}>\n"
    "</{calls}>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types '
    '(numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
_TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
_SCHEMA_HEAD = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
_V4_JSON_OBJECT = "You are a helpful assistant designed to output JSON.\n## Response Format:\n\nReply with JSON object ONLY."

Piece = tuple[str, bool]  # (text, is a special token)


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt as special / plain pieces, with the image URLs in placeholder order."""

    pieces: tuple[Piece, ...]
    image_urls: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The prompt string."""
        return "".join(text for text, _ in self.pieces)

    @property
    def special_ranges(self) -> list[tuple[int, int]]:
        """Half-open code-point ranges of the prompt that hold special tokens, ascending."""
        ranges, pos = [], 0
        for text, special in self.pieces:
            if special:
                ranges.append((pos, pos + len(text)))
            pos += len(text)
        return ranges


@dataclass
class _Msg:
    role: str
    content: str
    reasoning: str | None = None
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)
    tool_call_id: str | None = None
    prefix: bool = False
    images: list[str] = field(default_factory=list)


class _Out:
    """Collects pieces; template text is split at the special spellings it contains."""

    def __init__(self) -> None:
        self.pieces: list[Piece] = []

    def special(self, token: str) -> None:
        self.pieces.append((token, True))

    def plain(self, text: str) -> None:
        if text:
            self.pieces.append((text, False))

    def template(self, text: str) -> None:
        pos = 0
        for m in _SPECIAL_RE.finditer(text):
            self.plain(text[pos:m.start()])
            self.special(m.group())
            pos = m.end()
        self.plain(text[pos:])


def render(body: Mapping[str, Any], spec: str, *, effort_budget: int | None = None) -> Prompt:
    """The DeepSeek-V4 (``spec="dsv4"``) or V4.1 (``"dsv41"``) prompt of an SGLang chat body.

    ``effort_budget``: V4.1's integer reasoning budget (1..100), which replaces the named effort's
    number in the effort line, as SGLang does. Raises ValueError for a request deepseek-recipe refuses
    (the cases this module knows: no messages, unanswered tool calls, a bad tool schema, an unknown
    effort, a JSON response format without the word "json").
    """
    if spec not in SPECS:
        raise ValueError(f"unknown DeepSeek-V4 chat encoding {spec!r}; expected one of {SPECS}")
    thinking = bool(body.get("thinking"))
    messages = _messages(body, spec)
    tools = _tools(body)
    response_format = body.get("response_format") or None
    if response_format is not None and response_format.get("type") == "structural_tag":
        response_format = None  # SGLang enforces it with its grammar, outside the prompt
    _check_json_word(response_format, messages)
    tier = _effort_tier(body.get("reasoning_effort"))
    if effort_budget is not None and not 1 <= int(effort_budget) <= 100:
        raise ValueError(f"reasoning effort budget {effort_budget!r} is outside [1, 100]")

    out = _Out()
    out.special(BOS)
    header = _system_header(spec, thinking, tier, effort_budget)
    extras = _system_extras(spec, tools, response_format)
    if spec == "dsv4":
        systems = [m.content for m in messages if m.role == "system" and m.content]
        rest = [m for m in messages if m.role != "system"]
        if header or systems or extras:
            _system_text(out, header, systems, extras)
        _turns(out, spec, rest, thinking, bool(tools))
    else:
        messages = [m for m in messages if not (m.role == "system" and not m.content)]
        opens_with_system = bool(messages) and messages[0].role == "system"
        if not opens_with_system and (header or extras):
            out.special(SYSTEM)
            _system_text(out, header, [], extras)
        _turns(out, spec, messages, thinking, bool(tools), first_system=(header, extras))
    images = [url for m in messages for url in m.images] if spec == "dsv41" else []
    return Prompt(tuple(out.pieces), tuple(images))


def encode(prompt: Prompt, tokenizer: Any) -> list[int]:
    """Token ids of ``prompt`` with a `tokenizers.Tokenizer`: each special piece is its token, each
    plain piece is encoded without the added vocabulary (so "<｜User｜>" typed by a client stays text)."""
    plain = _plain_tokenizer(tokenizer)
    ids: list[int] = []
    for text, special in prompt.pieces:
        if special:
            token_id = tokenizer.token_to_id(text)
            if token_id is None:
                raise ValueError(f"the tokenizer has no token {text!r}, which the DeepSeek-V4 chat format needs")
            ids.append(token_id)
        else:
            ids.extend(plain.encode(text, add_special_tokens=False).ids)
    return ids


_PLAIN_CACHE: dict[int, tuple[Any, Any]] = {}


def _plain_tokenizer(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` without its added vocabulary (cached per tokenizer object)."""
    cached = _PLAIN_CACHE.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.to_str())
    spec["added_tokens"] = []
    plain = Tokenizer.from_str(json.dumps(spec))
    _PLAIN_CACHE[id(tokenizer)] = (tokenizer, plain)
    return plain


# --- request normalization -------------------------------------------------------------------------


def _messages(body: Mapping[str, Any], spec: str) -> list[_Msg]:
    raw = copy.deepcopy(list(body.get("messages") or []))
    if not raw:
        raise ValueError("Empty input messages")
    out: list[_Msg] = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError(f"messages[{i}] must be an object with a role")
        role = "system" if m["role"] == "developer" else m["role"]
        if role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"messages[{i}].role {m['role']!r} is not system, developer, user, assistant or tool")
        images: list[str] = []
        content = _content_text(m.get("content"), spec, images, f"messages[{i}].content")
        msg = _Msg(role=role, content=content, images=images)
        if role == "assistant":
            msg.reasoning = m.get("reasoning_content")
            for j, call in enumerate(m.get("tool_calls") or []):
                function = call.get("function") or {}
                args = function.get("arguments", "")
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
                if "name" not in function:
                    raise ValueError(f"messages[{i}].tool_calls[{j}].function.name is missing")
                msg.tool_calls.append((str(call.get("id") or ""), str(function["name"]), args))
        elif role == "tool":
            msg.tool_call_id = m.get("tool_call_id")
        out.append(msg)
    if body.get("continue_final_message") and out[-1].role == "assistant":
        out[-1].prefix = True
    return _order_tool_results(out)


def _content_text(content: Any, spec: str, images: list[str], where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a string or a list of content parts")
    parts: list[str] = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append(part.get("text") or "")
        elif kind == "image_url":
            if spec == "dsv4":
                parts.append(V4_IMAGE_TEXT)
            else:
                image = part.get("image_url")
                images.append(image.get("url") if isinstance(image, Mapping) else image)
                parts.append(IMAGE)
        else:
            raise ValueError(f"{where}[{k}] has type {kind!r}; the DeepSeek-V4 chat format takes text and image_url")
    return "\n\n".join(parts)


def _order_tool_results(messages: list[_Msg]) -> list[_Msg]:
    """Check that each assistant's tool calls are answered by the tool messages that follow it, and put
    those in call order."""
    out: list[_Msg] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        out.append(m)
        i += 1
        if m.role == "tool":
            raise ValueError("a tool message must follow an assistant message with 'tool_calls'")
        if m.role != "assistant" or not m.tool_calls:
            continue
        results: list[_Msg] = []
        while i < len(messages) and messages[i].role == "tool":
            results.append(messages[i])
            i += 1
        order = {call_id: n for n, (call_id, _, _) in enumerate(m.tool_calls)}
        unknown = [r.tool_call_id for r in results if r.tool_call_id not in order]
        if unknown:
            raise ValueError(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id', The following tool_call_ids did not have response messages: {', '.join(map(str, unknown))}"
            )
        if len(results) < len(m.tool_calls):
            raise ValueError(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                "'tool_call_id'. (insufficient tool messages following tool_calls message)"
            )
        out.extend(sorted(results, key=lambda r: order[r.tool_call_id]))
    return out


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools") or []
    if not tools or body.get("tool_choice") == "none":
        return []
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not function.get("name"):
            raise ValueError(f"tools[{i}] must be a function tool with a name")
        name = function["name"]
        params = function.get("parameters")
        if params is None:
            params = {}
        elif not isinstance(params, Mapping) or params.get("type") != "object":
            got = params.get("type") if isinstance(params, Mapping) else type(params).__name__
            raise ValueError(
                f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', "
                f"got 'type: {json.dumps(got)}'."
            )
        if function.get("strict") is True and params:
            params = _strict_parameters(params, name)
        out.append({"name": name, "description": function.get("description") or "", "parameters": params})
    return out


def _strict_parameters(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A strict tool's top-level object closed to extra properties (every property must be required)."""
    properties = params.get("properties") or {}
    if set(params.get("required") or []) != set(properties):
        raise ValueError("Required properties must match all properties in the object")
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "additionalProperties":
            continue
        out[key] = value
        if key == "properties":
            out["additionalProperties"] = False
    out.setdefault("additionalProperties", False)
    return out


def _check_json_word(response_format: Mapping[str, Any] | None, messages: Sequence[_Msg]) -> None:
    if response_format is None or response_format.get("type") != "json_object":
        return
    if not any("json" in m.content.lower() for m in messages):
        raise ValueError(
            "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'."
        )


def _effort_tier(effort: Any) -> str:
    if effort is None:
        return "high"
    if effort not in _EFFORT_TIERS:
        raise ValueError(f"reasoning_effort {effort!r} is not one of {', '.join(_EFFORT_TIERS)}")
    return _EFFORT_TIERS[effort]


# --- rendering -------------------------------------------------------------------------------------


def _system_header(spec: str, thinking: bool, tier: str, budget: int | None) -> str:
    """The reasoning-effort paragraph (with its trailing blank line), or "" outside thinking mode."""
    if not thinking:
        return ""
    if spec == "dsv4":
        text = _V4_EFFORT.get(tier)
        return text + "\n\n" if text else ""
    return V41_EFFORT_LINE.format(budget=budget if budget is not None else _V41_EFFORT_BUDGET[tier]) + "\n\n"


def _system_extras(spec: str, tools: list[dict[str, Any]], response_format: Mapping[str, Any] | None
                   ) -> list[Piece]:
    """The tool instructions and the response format, as pieces (template text split, JSON plain)."""
    out = _Out()
    if tools:
        out.template("\n\n" + _TOOLS_HEAD.format(**_TAGS[spec]))
        out.plain("\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        out.template(_TOOLS_TAIL)
    kind = response_format.get("type") if response_format else None
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema") or {}
        out.template("\n\n" + _SCHEMA_HEAD)
        out.plain(json.dumps(schema, ensure_ascii=False))
    elif kind == "json_object":
        if spec == "dsv4":
            out.template("\n\n" + _V4_JSON_OBJECT)
        else:
            out.template("\n\n" + _SCHEMA_HEAD)
            out.plain(json.dumps({"type": "json_object"}))
    return out.pieces


def _system_text(out: _Out, header: str, systems: Sequence[str], extras: Sequence[Piece]) -> None:
    out.template(header)
    for n, text in enumerate(systems):
        if n:
            out.plain("\n\n")
        out.plain(text)
    out.pieces.extend(extras)


def _turns(out: _Out, spec: str, messages: Sequence[_Msg], thinking: bool, has_tools: bool,
           first_system: tuple[str, list[Piece]] | None = None) -> None:
    pending_user: list[tuple[str, int]] | None = None  # (text, images in it)

    def flush_user() -> None:
        nonlocal pending_user
        if pending_user is not None:
            out.special(USER)
            for k, (text, n_images) in enumerate(pending_user):
                if k:
                    out.plain("\n\n")
                _with_images(out, text, n_images)
            pending_user = None

    for n, m in enumerate(messages):
        if m.role in ("user", "tool"):
            text = f"<tool_result>{m.content}</tool_result>" if m.role == "tool" else m.content
            pending_user = [*(pending_user or []), (text, len(m.images))]
            continue
        flush_user()
        if m.role == "system":  # V4.1 only: V4 lifted them to the top
            out.special(SYSTEM)
            if n == 0 and first_system is not None:
                _system_text(out, first_system[0], [m.content], first_system[1])
            else:
                out.plain(m.content)
            continue
        out.special(ASSISTANT)
        if thinking and (has_tools or m.prefix):
            out.special(THINK)
            out.plain(m.reasoning or "")
        out.special(END_THINK)
        out.plain(m.content)
        if m.tool_calls:
            _tool_calls(out, spec, m.tool_calls)
        if not m.prefix:
            out.special(EOS)
    flush_user()
    if not (messages and messages[-1].prefix):
        out.special(ASSISTANT)
        out.special(THINK if thinking else END_THINK)


def _with_images(out: _Out, text: str, n_images: int) -> None:
    """Plain text whose first ``n_images`` image spellings are the placeholders of the message's images
    (a later one, typed by the client, stays text)."""
    for _ in range(n_images):
        head, sep, text = text.partition(IMAGE)
        out.plain(head)
        if sep:
            out.special(IMAGE)
    out.plain(text)


def _tool_calls(out: _Out, spec: str, calls: Sequence[tuple[str, str, str]]) -> None:
    tags = _TAGS[spec]
    out.template(f"\n\n<{tags['calls']}>\n")
    for _, name, arguments in calls:
        out.template(f'<{tags["invoke"]} name="')
        out.plain(name)
        out.plain('">\n')
        params = _call_parameters(arguments)
        for k, (key, value, is_string) in enumerate(params):
            if k and spec == "dsv41":
                out.plain("\n")
            out.template(f'<{tags["param"]} name="')
            out.plain(key)
            out.plain(f'" string="{"true" if is_string else "false"}">')
            out.plain(value)
            out.template(f"</{tags['param']}>")
            if spec == "dsv4":
                out.plain("\n")
        if spec == "dsv41":
            out.plain("\n")
        out.template(f"</{tags['invoke']}>\n")
    out.template(f"</{tags['calls']}>")


def _call_parameters(arguments: str) -> list[tuple[str, str, bool]]:
    """(name, rendered value, is a string) per argument; arguments that are not a JSON object render
    as one string parameter named "arguments", as deepseek-recipe does."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return [("arguments", arguments, True)]
    return [
        (key, value, True) if isinstance(value, str) else (key, json.dumps(value, ensure_ascii=False), False)
        for key, value in parsed.items()
    ]
