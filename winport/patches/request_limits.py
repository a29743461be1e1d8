"""Requests that would stop the server are refused with a 400 naming the field and its limit.

Targets sglang 0.5.23 in two places, both fed by winport.serve.request_limits (the checks):
- `srt/entrypoints/http_server.py:_setup_and_run_http_server`, where SGLang finishes the FastAPI
  app (it adds the API-key middleware there) before uvicorn starts: a BEFORE hook adds one ASGI
  middleware in front of every route. It refuses a JSON body that is not an object (chat answered
  500: its validator calls .get on it) and, per prompt route, empty prompts, token ids outside the
  vocabulary, n outside [1, 128], logprobs / top_logprobs outside [0, 20] (OpenAI routes) and
  top_logprobs_num outside [0, vocab] (/generate). Streaming requests get the same 400 before any
  stream starts. It also takes tracebacks and server file paths out of every 4xx/5xx body SGLang
  writes (its validation errors quote the dispatcher's source path; on Windows under the user's
  profile). The API-key middleware SGLang adds afterwards sits outside it, so a request without
  the key is still answered 401 first.
- `srt/managers/tokenizer_manager.py:TokenizerManager._validate_one_request`, called for every
  request (single or one of a batch) after tokenization and before it is sent to the scheduler,
  on every route and the Engine API: an AROUND hook checks the ids the tokenizer or chat template
  produced (non-empty, inside the vocabulary) and top_logprobs_num, raising ValueError, which
  SGLang answers with 400 (an error event on a stream already started).
The vocabulary is the served model's (`TokenizerManager.model_config.vocab_size`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from winport.patches._base import register, require_source
from winport.serve.request_limits import check_body, check_tokenized, error_body, scrub_body

HTTP_TARGET = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _is_json(scope: Scope) -> bool:
    """Whether FastAPI would read this body as JSON: no content type, or a JSON one."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return True


class RequestLimitsMiddleware:
    """ASGI middleware: request limits before SGLang's routes, server paths out of error bodies."""

    def __init__(self, app: Callable[..., Awaitable[None]], vocab_size: int | None) -> None:
        self.app = app
        self.vocab_size = vocab_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the body of a JSON POST/PUT/PATCH, then run the app with error bodies scrubbed."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and route.startswith(root):
            route = route[len(root):]
        send = _scrubbing(send)
        if scope.get("method") in {"POST", "PUT", "PATCH"} and _is_json(scope):
            chunks: list[bytes] = []
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client left before sending its body
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            if body.strip():
                try:
                    parsed = json.loads(body)
                except ValueError:
                    pass  # not JSON at all: SGLang's own 400 says so
                else:
                    refusal = check_body(route, parsed, self.vocab_size)
                    if refusal is not None:
                        await _send_json(send, refusal.status, error_body(route, refusal))
                        return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the client's later messages
    (SGLang watches them for a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _scrubbing(send: Send) -> Send:
    """A send that holds back a 4xx/5xx response until its body is complete and scrubs it."""
    start: Message | None = None
    chunks: list[bytes] = []

    async def scrubbed(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start" and message.get("status", 200) >= 400:
            start = message
            return
        if start is None or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = scrub_body(b"".join(chunks))
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return scrubbed


async def _send_json(send: Send, status: int, content: dict[str, Any]) -> None:
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def vocab_size_of(tokenizer_manager: Any) -> int | None:
    """The served model's vocabulary size, or None where the manager has no model config."""
    size = getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", None)
    return int(size) if isinstance(size, int) and size > 0 else None


def _add_middleware(*args: Any, **kwargs: Any) -> None:
    from sglang.srt.entrypoints.http_server import app

    manager = kwargs.get("tokenizer_manager", args[1] if len(args) > 1 else None)
    app.add_middleware(RequestLimitsMiddleware, vocab_size=vocab_size_of(manager))


def _validate_one_request(original: Callable[..., Any], self: Any, obj: Any, input_ids: Any,
                          *args: Any, **kwargs: Any) -> Any:
    params = getattr(obj, "sampling_params", None)
    refusal = check_tokenized(
        input_ids, vocab_size=vocab_size_of(self),
        top_logprobs_num=getattr(obj, "top_logprobs_num", None),
        return_logprob=bool(getattr(obj, "return_logprob", False)),
        n=params.get("n") if isinstance(params, dict) else None,
        has_embeds=getattr(obj, "input_embeds", None) is not None)
    if refusal is not None:
        raise ValueError(refusal.message)
    return original(self, obj, input_ids, *args, **kwargs)


def register_patch() -> None:
    """Check upstream and register both hooks, in the server's main process only.

    The HTTP app and the tokenizer manager live there; resolving the targets in the scheduler and
    detokenizer processes would import the whole HTTP server into each of them for nothing.
    """
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return
    # The app is final at this point (SGLang adds its API-key middleware here) and not yet served.
    require_source(HTTP_TARGET, "add_api_key_middleware(", "set_global_state(", "tokenizer_manager,")
    require_source("sglang.srt.entrypoints.http_server.launch_server", "_setup_and_run_http_server(")
    # Every tokenized request passes here before it is sent to the scheduler, and SGLang answers
    # its ValueError with a 400 (the token_ids_logprob vocabulary check there shows the contract).
    require_source(VALIDATE_TARGET, "self, obj: Union[GenerateReqInput, EmbeddingReqInput], input_ids: List[int]",
                   "self._validate_token_ids_logprob(obj)", "raise ValueError(")
    require_source("sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_one_request",
                   "self._validate_one_request(obj, input_ids)")
    require_source("sglang.srt.managers.tokenizer_manager.TokenizerManager._batch_tokenize_and_process",
                   "self._validate_one_request(obj[i], input_ids_list[i])")
    register(HTTP_TARGET, _add_middleware, "BEFORE")
    register(VALIDATE_TARGET, _validate_one_request)
