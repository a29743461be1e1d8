"""Limits a request must meet before SGLang sees it, and error bodies without server paths.

Pure logic, no SGLang imports (winport.patches.request_limits wires it into the server). SGLang
0.5.23 lets several hostile requests reach the scheduler, where they fail inside a forward and the
whole server stops: a prompt token id outside the vocabulary (the embedding lookup raises), more
top log-probabilities than the vocabulary has (the logprob processor's top-k raises) and an empty
prompt (no token to extend). Others hold the server (``n`` without a limit) or answer 500 (a JSON
body that is not an object, on chat). Each check here names the field and its limit, so a client
learns what to change; the limits for the OpenAI routes are OpenAI's own (``n`` at most 128,
``logprobs`` / ``top_logprobs`` at most 20), those for SGLang's native /generate the vocabulary.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MAX_N = 128  # OpenAI's limit on choices per request
MAX_OPENAI_LOGPROBS = 20  # OpenAI's limit on `logprobs` (completions) and `top_logprobs` (chat)


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the field (as the client wrote it) and a message naming the limit."""

    field: str
    message: str
    status: int = 400


_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
               type(None): "null"}


def _as_int(value: Any) -> int | None:
    """`value` as the integer SGLang's pydantic models would read it, or None when they would not.

    Pydantic's lax mode takes 5, 5.0, true and "5" for an int field, so the limits must see the
    same number the model will (a string "1025" would otherwise slip past as "not an int").
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _int_within(field: str, value: Any, low: int, high: int) -> Refusal | None:
    """Refuse an integer field outside [low, high]; values pydantic would reject are left to it."""
    number = _as_int(value)
    if value is None or number is None or low <= number <= high:
        return None
    return Refusal(field, f"{field} must be an integer in [{low}, {high}], got {number}")


def _is_id(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_token_ids(field: str, ids: Any, vocab_size: int | None) -> Refusal | None:
    """Refuse a flat list of token ids that is empty or holds an id outside [0, vocab_size)."""
    if not isinstance(ids, list):
        return None
    if not ids:
        return Refusal(field, f"{field} is empty: a prompt needs at least one token")
    if vocab_size is None or not all(_is_id(t) for t in ids):
        return None
    for i, token in enumerate(ids):
        number = _as_int(token)
        if number is None or not 0 <= number < vocab_size:
            return Refusal(f"{field}[{i}]", f"{field}[{i}] is token id {token!r}, outside the vocabulary "
                                            f"[0, {vocab_size})")
    return None


def check_prompt(field: str, prompt: Any, vocab_size: int | None) -> Refusal | None:
    """Refuse an empty prompt or out-of-vocabulary ids in any prompt shape SGLang takes.

    Shapes: text, a batch of texts, token ids, a batch of token-id lists. An empty element of a
    batch is refused too: SGLang's own check on completions passes a batch unless all are empty.
    """
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return Refusal(field, f"{field} is empty: a prompt needs at least one token") if prompt == "" else None
    if not isinstance(prompt, list):
        return None
    if not prompt:
        return Refusal(field, f"{field} is empty: a prompt needs at least one token")
    if all(_is_id(t) for t in prompt):
        return check_token_ids(field, prompt, vocab_size)
    for i, item in enumerate(prompt):
        if isinstance(item, (str, list)):
            refusal = check_prompt(f"{field}[{i}]", item, vocab_size)
            if refusal is not None:
                return refusal
    return None


def _each(value: Any) -> list[tuple[str, Any]]:
    """A field given once or per batch element, as (suffix, value) pairs."""
    if isinstance(value, list):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    return [("", value)]


def _first(*refusals: Refusal | None) -> Refusal | None:
    return next((r for r in refusals if r is not None), None)


def _messages(body: dict[str, Any]) -> Refusal | None:
    messages = body.get("messages")
    if isinstance(messages, list) and not messages:
        return Refusal("messages", "messages is empty: a chat needs at least one message")
    return None


def _openai_common(body: dict[str, Any]) -> Refusal | None:
    return _int_within("n", body.get("n"), 1, MAX_N)


def _chat(body: dict[str, Any], vocab_size: int | None) -> Refusal | None:
    return _first(_messages(body), _openai_common(body),
                  _int_within("top_logprobs", body.get("top_logprobs"), 0, MAX_OPENAI_LOGPROBS))


def _completions(body: dict[str, Any], vocab_size: int | None) -> Refusal | None:
    return _first(check_prompt("prompt", body.get("prompt"), vocab_size), _openai_common(body),
                  _int_within("logprobs", body.get("logprobs"), 0, MAX_OPENAI_LOGPROBS))


def _responses(body: dict[str, Any], vocab_size: int | None) -> Refusal | None:
    return _first(check_prompt("input", body.get("input"), vocab_size),
                  _int_within("top_logprobs", body.get("top_logprobs"), 0, MAX_OPENAI_LOGPROBS))


def _embeddings(body: dict[str, Any], vocab_size: int | None) -> Refusal | None:
    return check_prompt("input", body.get("input"), vocab_size)


def _native(body: dict[str, Any], vocab_size: int | None) -> Refusal | None:
    """SGLang's /generate (and /encode, /classify): text or input_ids, per-request sampling_params."""
    refusal = _first(check_prompt("text", body.get("text"), vocab_size),
                     check_prompt("input_ids", body.get("input_ids"), vocab_size))
    if refusal is not None:
        return refusal
    for suffix, params in _each(body.get("sampling_params")):
        if isinstance(params, dict):
            refusal = _int_within(f"sampling_params{suffix}.n", params.get("n"), 1, MAX_N)
            if refusal is not None:
                return refusal
    if vocab_size is not None:
        for suffix, num in _each(body.get("top_logprobs_num")):
            refusal = _int_within(f"top_logprobs_num{suffix}", num, 0, vocab_size)
            if refusal is not None:
                return refusal
    return None


def _ollama_generate(body: dict[str, Any], vocab_size: int | None) -> Refusal | None:
    return check_prompt("prompt", body.get("prompt"), vocab_size)


def _ollama_chat(body: dict[str, Any], vocab_size: int | None) -> Refusal | None:
    return _messages(body)


def _anthropic(body: dict[str, Any], vocab_size: int | None) -> Refusal | None:
    return _messages(body)


# SGLang 0.5.23's routes that take a prompt, and what each body must meet.
ROUTES: dict[str, Callable[[dict[str, Any], int | None], Refusal | None]] = {
    "/v1/chat/completions": _chat,
    "/invocations": _chat,  # SageMaker's name for chat completions
    "/v1/completions": _completions,
    "/v1/responses": _responses,
    "/v1/embeddings": _embeddings,
    "/v1/classify": _embeddings,
    "/generate": _native,
    "/encode": _native,
    "/classify": _native,
    "/api/generate": _ollama_generate,
    "/api/chat": _ollama_chat,
    "/v1/messages": _anthropic,
}


def check_body(route: str, body: Any, vocab_size: int | None) -> Refusal | None:
    """Check a parsed JSON body sent to `route`; None when it may go on to SGLang.

    Every route's body must be a JSON object (SGLang's models all are); the prompt routes in
    ROUTES also get their field limits. Fields absent or of a type SGLang's own validation
    rejects are left to it: this only adds the limits it lacks.
    """
    if not isinstance(body, dict):
        kind = _JSON_KINDS.get(type(body), type(body).__name__)
        return Refusal("body", f"the request body must be a JSON object, got {kind}")
    checker = ROUTES.get(route.rstrip("/") or "/")
    return checker(body, vocab_size) if checker else None


def check_tokenized(input_ids: list[int] | None, *, vocab_size: int | None, top_logprobs_num: Any = None,
                    return_logprob: bool = False, n: Any = None, has_embeds: bool = False) -> Refusal | None:
    """Check one request as the tokenizer manager hands it to the scheduler (any route, the Engine API).

    The second line behind check_body: it sees the token ids a chat template or a tokenizer made,
    and requests that did not come through HTTP.
    """
    if not has_embeds:
        if input_ids is None or len(input_ids) == 0:
            return Refusal("input_ids", "the prompt is empty after tokenization: a prompt needs at least one token")
        if vocab_size is not None:
            for i, token in enumerate(input_ids):
                if not 0 <= int(token) < vocab_size:
                    return Refusal("input_ids", f"input_ids[{i}] is token id {token}, outside the vocabulary "
                                                f"[0, {vocab_size})")
    if return_logprob and vocab_size is not None:
        refusal = _int_within("top_logprobs_num", top_logprobs_num, 0, vocab_size)
        if refusal is not None:
            return refusal
    return _int_within("n", n, 1, MAX_N)


def error_body(route: str, refusal: Refusal) -> dict[str, Any]:
    """The JSON error body SGLang itself uses on `route`, carrying the refusal."""
    if route.startswith("/v1/messages"):
        return {"type": "error", "error": {"type": "invalid_request_error", "message": refusal.message}}
    if route.startswith("/v1/responses"):
        return {"error": {"message": refusal.message, "type": "Bad Request", "param": refusal.field,
                          "code": refusal.status}}
    if route.startswith("/v1/") or route == "/invocations":
        return {"object": "error", "message": refusal.message, "type": "BadRequestError",
                "param": refusal.field, "code": refusal.status}
    return {"error": {"message": refusal.message, "param": refusal.field, "code": refusal.status}}


# ---- server paths out of error bodies ----

PATH_PLACEHOLDER = "<path>"
# Absolute paths: a Windows drive or UNC path, or a POSIX path under a filesystem root that holds
# installs, homes or checkouts, or any path through site-packages or to a source file. Route names
# such as /v1/chat/completions are not paths and stay.
_WINDOWS = r"(?:[A-Za-z]:|\\\\[^\\/\s\"']+)[\\/][^\s\"'<>|*?,;()\[\]{}]*"
_POSIX_ROOTS = ("home", "usr", "opt", "tmp", "var", "root", "work", "srv", "mnt", "media", "etc", "lib",
                "lib64", "private", "Users", "Library", "Applications", "nix", "snap", "run", "data", "app",
                "workspace", "proc", "sys", "dev", "bin", "sbin", "boot", "scratch", "content")
_POSIX = (r"(?<![\w.~:/\\-])/(?:(?:" + "|".join(_POSIX_ROOTS) + r")(?=/|\b)[^\s\"'<>|*?,;()\[\]{}]*"
          r"|[^\s\"'<>|*?,;()\[\]{}]*(?:site-packages|dist-packages)[^\s\"'<>|*?,;()\[\]{}]*"
          r"|[^\s\"'<>|*?,;()\[\]{}]+\.(?:py|pyc|pyd|so|dll|gguf|safetensors)\b)")
_PATH_RE = re.compile(f"{_WINDOWS}|{_POSIX}")
_TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\):.*", re.DOTALL)


def _known_dirs() -> list[str]:
    """This process's own directories, longest first: replaced even where the pattern would miss."""
    dirs = {os.getcwd(), sys.prefix, sys.exec_prefix, os.path.expanduser("~"), os.path.dirname(os.__file__)}
    return sorted((d for d in dirs if d and len(d) > 3), key=len, reverse=True)


def scrub_paths(text: str, extra_dirs: Iterable[str] = ()) -> str:
    """`text` without tracebacks or server file paths (each becomes PATH_PLACEHOLDER)."""
    text = _TRACEBACK_RE.sub("(traceback omitted)", text)
    for d in sorted({*extra_dirs, *_known_dirs()}, key=len, reverse=True):
        for form in {d, d.replace("\\", "/"), d.replace("/", "\\")}:
            # A whole path component only: the home /root must not eat "/rooted".
            text = re.sub(re.escape(form) + r"(?![\w.-])[^\s\"'<>|*?,;()\[\]{}]*", PATH_PLACEHOLDER, text)
    return _PATH_RE.sub(PATH_PLACEHOLDER, text)


def scrub_json(value: Any) -> Any:
    """Every string inside a decoded JSON value passed through scrub_paths."""
    if isinstance(value, str):
        return scrub_paths(value)
    if isinstance(value, list):
        return [scrub_json(v) for v in value]
    if isinstance(value, dict):
        return {k: scrub_json(v) for k, v in value.items()}
    return value


def scrub_body(body: bytes) -> bytes:
    """An error response body without server paths: JSON re-encoded string by string, else as text."""
    try:
        decoded = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return scrub_paths(body.decode("utf-8", "replace")).encode()
    return json.dumps(scrub_json(decoded), ensure_ascii=False).encode()
