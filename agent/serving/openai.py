"""OpenAI-style endpoints under /v1: models, embeddings (encoders), completions and chat completions (causal
LMs), streamed as server-sent events when asked.

A request names a deployment, or one of its adapters, as `model`. Errors take OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`, with the status the official client expects. Chat
renders the model's own chat template (agent.serving.chat). A generation ends at its deadline: the body's
`timeout` or the `X-ModelGrid-Timeout` header, in seconds, else the agent's default.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from aiohttp import web

from agent.engines import ENGINES
from agent.protocol import UNSERVED_HEADER
from agent.serving.batching import pad_rows
from agent.serving.body import read_json
from agent.serving.chat import ChatError, parse_messages
from agent.serving.detokenize import TokenText
from agent.serving.dispatch import DISPATCHER, BadInput, Route, ServingError, picked_replica, relays_bodies
from agent.serving.generate import Choice, Delta, LogprobEntry, run_all, stream_sse, usage_of
from agent.serving.relay import add_relay, relay
from agent.serving.request_bounds import MAX_N, check_request
from agent.serving.textpool import TextPool
from agent.serving.tokenization import NoTokenizer, TextCodec, Tokenizers
from agent.workers.generation_spec import DEFAULT_GENERATION_TIMEOUT, MAX_TOP_LOGPROBS, GenerationRequest

log = logging.getLogger(__name__)
T = TypeVar("T")

TOKENIZERS = web.AppKey("tokenizers", Tokenizers)
MAX_INPUTS = 2048  # inputs per embeddings request, as OpenAI allows
MAX_STOPS = 4
MAX_TOKEN_ID = 2**31  # far past any vocabulary, and within int64 however the ids are stacked
MAX_SEED = 2**63 - 1  # what torch.Generator.manual_seed takes
TASK_NAMES = {"encoder": "an encoder", "causal-lm": "a causal language model"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}
MIN_LOGPROB = -9999.0  # what OpenAI sends for a token too unlikely to have a log probability
MAX_GENERATION_TIMEOUT = 3600.0
TIMEOUT_HEADER = "X-ModelGrid-Timeout"
RELAYED_ROOT_PATHS = ("/tokenize", "/detokenize")  # vLLM's own, outside /v1 as it serves them
GENERATION_TIMEOUT = web.AppKey("generation_timeout", float)
TEXT = web.AppKey("text", TextPool)  # tokenizing and chat templating, off the event loop

# Options the API knows but this server does not implement: refused unless left at their default. (/v1/completions
# takes `echo`; /v1/chat/completions does not.)
UNSUPPORTED = {
    "echo": (False,),
    "suffix": ("",),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "tools": ([],),
    "response_format": ({"type": "text"},),
}


def add_openai_routes(app: web.Application, generation_timeout: float = DEFAULT_GENERATION_TIMEOUT,
                      text: TextPool | None = None) -> None:
    """Mount /v1 on `app`, which must hold a Dispatcher under DISPATCHER; `text` tokenizes and renders chat
    templates (a pool of its own by default, closed with the app)."""
    v1 = web.Application(middlewares=[_openai_errors])
    v1[GENERATION_TIMEOUT] = generation_timeout
    v1[TOKENIZERS] = Tokenizers()
    v1[TEXT] = text if text is not None else TextPool()
    v1.on_cleanup.append(_close_text)
    v1.router.add_get("/models", list_models)
    v1.router.add_get("/models/{model}", get_model)
    v1.router.add_post("/embeddings", embeddings)
    v1.router.add_post("/completions", completions)
    v1.router.add_post("/chat/completions", chat_completions)
    v1.router.add_post("/responses", relayed_only)
    app.add_subapp("/v1", v1)
    add_relay(app, generation_timeout or DEFAULT_GENERATION_TIMEOUT)
    for path in RELAYED_ROOT_PATHS:  # errors in OpenAI's shape too
        app.router.add_post(path, functools.partial(_openai_errors, handler=relayed_only))


def openai_error(status: int, message: str, code: str | None = None, param: str | None = None) -> web.Response:
    kind = ERROR_TYPES.get(status, "server_error" if status < 503 or status > 504 else "service_unavailable_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


def unserved_mark(response: web.Response, error: ServingError) -> web.Response:
    """Tell the console's gateway that nothing here acted on the request, so another replica may take it."""
    if getattr(error, "unserved", False):
        response.headers[UNSERVED_HEADER] = "1"
    return response


async def list_models(request: web.Request) -> web.Response:
    data = [_model_card(name, parent) for name, parent in request.config_dict[DISPATCHER].models()]
    return web.json_response({"object": "list", "data": data})


async def get_model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    route = request.config_dict[DISPATCHER].route(name)
    return web.json_response(_model_card(name, route.deployment if route.adapter == name else None))


async def relayed_only(request: web.Request) -> web.StreamResponse:
    """An endpoint only an engine's own server serves (vLLM's /v1/responses, /tokenize, /detokenize): relayed to a
    replica on an engine that takes OpenAI bodies, refused for one of the built-in engine, naming those that do."""
    body = await _body(request)
    route = _route(request, body)
    relayed = await _relayed(request, body, route)
    if relayed is not None:
        return relayed
    relaying = " or ".join(repr(e.name) for e in ENGINES.values() if e.passes_openai_bodies)
    raise BadInput(f"model {route.name!r} runs on the built-in engine, which does not serve {request.path}; deploy "
                   f"it with engine {relaying} for that", code="unsupported_by_engine")


async def _relayed(request: web.Request, body: dict[str, Any], route: Route) -> web.StreamResponse | None:
    """The answer of the replica the request is for, passed through where its engine takes OpenAI bodies; None for
    the built-in engine's."""
    if not relays_bodies(route):
        return None
    dispatcher = request.config_dict[DISPATCHER]
    with dispatcher.observe(route) as seen:
        response = await relay(request, dispatcher, route, body, request.path)
        seen.status = response.status
    return response


async def embeddings(request: web.Request) -> web.Response:
    dispatcher = request.config_dict[DISPATCHER]
    body = await _body(request)
    route = _route(request, body)
    if (relayed := await _relayed(request, body, route)) is not None:
        return relayed
    _check_task(route, "encoder", "/v1/embeddings needs an encoder model; use /v1/completions")
    encoding_format = body.get("encoding_format") or "float"
    if encoding_format not in ("float", "base64"):
        raise BadInput("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    with dispatcher.observe(route) as seen:
        inputs = _embedding_inputs(body.get("input"))
        texts = [i for i in inputs if isinstance(i, str)]
        if texts:  # token ids need no tokenizer: a model without one takes them
            codec = await _codec(request, route, truncate=True)
            if codec.max_chars:  # past what the positions hold, a text is cut before it is tokenized
                texts = [t[: codec.max_chars] for t in texts]
            limit = codec.max_positions
        else:
            limit = request.config_dict[TOKENIZERS].max_positions(route.replicas[0].spec.model_path)
        encoded = iter(await _encode(request, route, texts, truncate=True, param="input") if texts else [])
        sequences = [next(encoded) if isinstance(i, str) else i[:limit] if limit else i for i in inputs]
        if not all(sequences):
            raise BadInput("an input must hold at least one token", param="input")
        _check_dimensions(route, body.get("dimensions"))
        size = min(dispatcher.settings_for(h).max_batch_size for h in route.replicas)
        chunks = [sequences[start : start + size] for start in range(0, len(sequences), size)]
        results = await _all(dispatcher.infer(route, pad_rows(chunk)) for chunk in chunks)
        for result in results:
            seen.record(result)
        vectors = np.concatenate([r.outputs["embeddings"] for r in results])
    tokens = sum(len(s) for s in sequences)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode_vector(vector, encoding_format)}
        for i, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return web.json_response({"object": "list", "data": data, "model": route.name, "usage": usage})


async def completions(request: web.Request) -> web.StreamResponse:
    dispatcher = request.config_dict[DISPATCHER]
    body = await _body(request)
    route = _route(request, body)
    if (relayed := await _relayed(request, body, route)) is not None:
        return relayed
    _check_task(route, "causal-lm", "/v1/completions needs a causal language model")
    with dispatcher.observe(route):
        _refuse_unsupported({name: value for name, value in body.items() if name != "echo"})
        echo = body.get("echo")
        if echo not in (None, True, False):
            raise BadInput(f"'echo' must be true or false, got {json.dumps(echo)}", param="echo")
        codec = await _codec(request, route, truncate=False)
        raw = body.get("prompt")
        prompts = await _prompts(request, route, raw, codec)
        echoes = None
        if echo:  # a text prompt echoes as it came, as OpenAI's and vLLM's do; token ids as they decode
            given = [raw] if isinstance(raw, str) or _is_int(raw[0]) else raw
            echoes = [p if isinstance(p, str) else codec.decode(ids) for p, ids in zip(given, prompts, strict=True)]
        logprobs = _integer(body, "logprobs", None, minimum=0, maximum=MAX_TOP_LOGPROBS)
        params = _params(request, body, route, codec, prompts, logprobs, default_max_tokens=16, echoes=echoes)
        created, ident = int(time.time()), f"cmpl-{uuid.uuid4().hex}"

        def chunk(delta: Delta) -> dict[str, Any]:
            choice = {"text": delta.text, "index": delta.index, "logprobs": _completion_logprobs(delta.logprobs)
                      if logprobs is not None else None, "finish_reason": delta.finish_reason}
            return {"id": ident, "object": "text_completion", "created": created, "model": route.name,
                    "choices": [choice]}

        if params.stream:
            return await stream_sse(request, dispatcher, route, params.choices, codec, params.stops, chunk,
                                    params.usage_chunk(ident, "text_completion", created, route.name))
        done = await run_all(dispatcher, route, params.choices, codec, params.stops)
    choices = [{"text": c.text, "index": c.index, "finish_reason": c.finish_reason,
                "logprobs": _completion_logprobs(c.logprobs) if logprobs is not None else None} for c in done]
    return web.json_response({"id": ident, "object": "text_completion", "created": created, "model": route.name,
                              "choices": choices, "usage": usage_of(done)})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """The model's chat template turns `messages` into its prompt; the answer is the assistant's message."""
    dispatcher = request.config_dict[DISPATCHER]
    body = await _body(request)
    route = _route(request, body)
    if (relayed := await _relayed(request, body, route)) is not None:
        return relayed
    _check_task(route, "causal-lm", "/v1/chat/completions needs a causal language model")
    with dispatcher.observe(route):
        _refuse_unsupported(body)
        codec = await _codec(request, route, truncate=False)
        try:
            messages = parse_messages(body.get("messages"))
        except ChatError as e:
            raise BadInput(f"model {route.name!r}: {e}", param=e.param) from None
        _check_length(route, codec, sum(len(m["content"]) for m in messages), "messages")
        prompt = await request.config_dict[TEXT].chat(route.name, route.replicas[0].spec.model_path, messages)
        if not prompt:
            raise BadInput("the chat template rendered an empty prompt", param="messages")
        wants = body.get("logprobs")
        if wants not in (None, True, False):
            raise BadInput(f"'logprobs' must be true or false, got {json.dumps(wants)}", param="logprobs")
        top = _integer(body, "top_logprobs", None, minimum=0, maximum=MAX_TOP_LOGPROBS)
        if top is not None and not wants:
            raise BadInput("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        logprobs = (top or 0) if wants else None
        params = _params(request, body, route, codec, [prompt], logprobs, default_max_tokens=None,
                         max_name="max_completion_tokens" if body.get("max_completion_tokens") is not None
                         else "max_tokens")  # as vLLM reads them, and the gateway reserves
        created, ident = int(time.time()), f"chatcmpl-{uuid.uuid4().hex}"

        def envelope(choice: dict[str, Any]) -> dict[str, Any]:
            return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": route.name,
                    "choices": [choice]}

        def first(index: int) -> dict[str, Any]:
            return envelope({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None})

        def chunk(delta: Delta) -> dict[str, Any]:
            content = {"content": delta.text} if delta.text or delta.finish_reason is None else {}
            return envelope({"index": delta.index, "delta": content, "finish_reason": delta.finish_reason,
                             "logprobs": _chat_logprobs(delta.logprobs) if logprobs is not None else None})

        if params.stream:
            return await stream_sse(request, dispatcher, route, params.choices, codec, params.stops, chunk,
                                    params.usage_chunk(ident, "chat.completion.chunk", created, route.name), first)
        done = await run_all(dispatcher, route, params.choices, codec, params.stops)
    choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text}, "finish_reason": c.finish_reason,
                "logprobs": _chat_logprobs(c.logprobs) if logprobs is not None else None} for c in done]
    return web.json_response({"id": ident, "object": "chat.completion", "created": created, "model": route.name,
                              "choices": choices, "usage": usage_of(done)})


@dataclass
class _Params:
    """What a generation request asks for, checked: one Choice per prompt and n, stops, streaming."""

    choices: list[Choice]
    stops: list[str]
    stream: bool
    include_usage: bool

    def usage_chunk(self, ident: str, kind: str, created: int, model: str) -> dict[str, Any] | None:
        if not self.include_usage:
            return None
        return {"id": ident, "object": kind, "created": created, "model": model, "choices": []}


def _params(request: web.Request, body: dict[str, Any], route: Route, codec: TextCodec, prompts: list[list[int]],
            logprobs: int | None, default_max_tokens: int | None, max_name: str = "max_tokens",
            echoes: list[str] | None = None) -> _Params:
    """`echoes`: each prompt's text, for a completion that echoes it (which may ask for no new token, and gets the
    prompt's log probabilities with its own)."""
    _check_vocabulary(route, prompts)
    limit = codec.max_positions
    longest = max(len(p) for p in prompts)
    if default_max_tokens is None:  # chat: as long as the model's positions allow
        default_max_tokens = max(1, limit - longest) if limit else 256
    if echoes is None and _is_int(body.get(max_name)) and body.get(max_name) == 0:
        raise BadInput(f"'{max_name}' must be an integer >= 1, got 0 (0, the prompt alone, only with 'echo': true)",
                       param=max_name)
    max_tokens = _integer(body, max_name, default_max_tokens, minimum=0 if echoes is not None else 1)
    if limit and longest + max_tokens > limit:
        raise BadInput(
            f"model {route.name!r} takes at most {limit} tokens; this request asks for "
            f"{longest + max_tokens} ({longest} in the prompt, {max_tokens} for the completion)",
            param=max_name,
        )
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise BadInput("'top_p' must be above 0", param="top_p")
    top_k = _integer(body, "top_k", 0, minimum=-1)
    seed = _integer(body, "seed", None, minimum=0, maximum=MAX_SEED)
    n = _integer(body, "n", 1, minimum=1, maximum=MAX_N)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise BadInput(f"best_of={json.dumps(best_of)} is not supported by this server (only best_of = n)",
                       param="best_of")
    stream = body.get("stream", False)
    if stream not in (True, False, None):
        raise BadInput(f"'stream' must be true or false, got {json.dumps(stream)}", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or options.get("include_usage") not in (None, True, False):
        raise BadInput("'stream_options' must be an object like {\"include_usage\": true}", param="stream_options")
    stops = _stops(body.get("stop"))
    stop_ids = body.get("stop_token_ids") or []  # vLLM's extension: token ids that end a sequence
    if not isinstance(stop_ids, list) or not all(_is_int(i) and 0 <= i < MAX_TOKEN_ID for i in stop_ids):
        raise BadInput("'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    ignore_eos = body.get("ignore_eos", False)  # vLLM's extensions, which benchmarks send for exact lengths
    if ignore_eos not in (True, False, None):
        raise BadInput(f"'ignore_eos' must be true or false, got {json.dumps(ignore_eos)}", param="ignore_eos")
    min_tokens = _integer(body, "min_tokens", 0, minimum=0, maximum=max_tokens)
    deadline = time.monotonic() + _timeout(request, body)
    choices = []
    for index, prompt in enumerate(prompts):
        for copy in range(n):
            # n > 1 with a seed: each copy its own seed, so the choices differ yet repeat as a whole.
            request_seed = None if seed is None else (seed + copy) % (MAX_SEED + 1)
            generation = GenerationRequest(tuple(prompt), max_tokens, temperature, top_p, max(top_k, 0),
                                           request_seed, tuple(stop_ids), route.adapter, logprobs, deadline,
                                           prompt_logprobs=logprobs if echoes is not None else None,
                                           ignore_eos=bool(ignore_eos), min_tokens=min_tokens)
            choices.append(Choice(len(choices), generation, echoes[index] if echoes is not None else None))
    return _Params(choices, stops, bool(stream), bool(stream and options.get("include_usage")))


def _timeout(request: web.Request, body: dict[str, Any]) -> float:
    raw = body.get("timeout", request.headers.get(TIMEOUT_HEADER))
    if raw is None:
        return request.config_dict.get(GENERATION_TIMEOUT, DEFAULT_GENERATION_TIMEOUT)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if isinstance(raw, bool) or not 0 < value <= MAX_GENERATION_TIMEOUT:
        raise BadInput(f"'timeout' (or the {TIMEOUT_HEADER} header) must be a number of seconds above 0 and at "
                       f"most {MAX_GENERATION_TIMEOUT:g}, got {json.dumps(raw)}", param="timeout")
    return value


def _completion_logprobs(entries: list[LogprobEntry]) -> dict[str, Any]:
    """OpenAI's legacy shape. A token that is only part of a character is spelled by its bytes ("bytes:\\xe2\\x80"),
    as OpenAI does, so that two of them never collide as keys of a top_logprobs dict; a log probability too small
    for a float (-inf) is -9999.0, as OpenAI and vLLM send it."""

    def token(text: TokenText) -> str:
        return text.text if text.whole else "bytes:" + text.escaped()

    def top(entry: LogprobEntry) -> dict[str, float] | None:
        if entry.top is None:
            return None
        # The N most likely, best first, then the chosen token unless it is among them (so N or N + 1 entries, as
        # OpenAI and vLLM send); a text twice (two ids, the same bytes) keeps its best.
        alternatives: dict[str, float] = {}
        for text, logprob in (*entry.top, (entry.token, entry.logprob)):
            alternatives.setdefault(token(text), _finite(logprob))
        return alternatives

    return {
        "tokens": [token(e.token) for e in entries],
        "token_logprobs": [None if e.logprob is None else _finite(e.logprob) for e in entries],
        "top_logprobs": [top(e) for e in entries],
        "text_offset": [e.offset for e in entries],
    }


def _chat_logprobs(entries: list[LogprobEntry]) -> dict[str, Any]:
    """OpenAI's chat shape: each token with its bytes (a part of a character as its escaped bytes), and exactly the
    N most likely, best first."""

    def one(text: TokenText, logprob: float) -> dict[str, Any]:
        return {"token": text.text if text.whole else text.escaped(), "logprob": _finite(logprob),
                "bytes": None if text.raw is None else list(text.raw)}

    return {"content": [one(e.token, e.logprob) | {"top_logprobs": [one(t, lp) for t, lp in e.top or ()]}
                        for e in entries]}


def _finite(logprob: float) -> float:
    return logprob if logprob >= MIN_LOGPROB else MIN_LOGPROB  # -inf, and NaN, are not JSON


def _model_card(name: str, parent: str | None) -> dict[str, Any]:
    card = {"id": name, "object": "model", "created": 0, "owned_by": "modelgrid"}
    if parent is not None:
        card["parent"] = parent  # an adapter: served by the replicas of its base deployment
    return card


async def _body(request: web.Request) -> dict[str, Any]:
    # Size, nesting and value-count limits, parsed off the loop (agent.serving.body). Embeddings may carry
    # 2048 inputs of up to 512 token ids each.
    body = await read_json(request, max_values=MAX_INPUTS * 512)
    if not isinstance(body, dict):
        raise BadInput("the request body must be a JSON object")
    check_request(body)  # what it may ask of either engine (n, logprobs, structured outputs), before either sees it
    return body


def _route(request: web.Request, body: dict[str, Any]) -> Route:
    """The replicas `model` names (the one the gateway picked, when it names one)."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise BadInput("'model' must name a model (GET /v1/models lists them)", param="model")
    return request.config_dict[DISPATCHER].route(name, replica_id=picked_replica(request))


def _check_task(route: Route, task: str, hint: str) -> None:
    """The built-in engine serves each endpoint for one task (vLLM answers for itself)."""
    if route.task != task:
        raise BadInput(f"model {route.name!r} is {TASK_NAMES.get(route.task, route.task)}: {hint}", param="model")


async def _codec(request: web.Request, route: Route, *, truncate: bool) -> TextCodec:
    """The model's tokenizer in the daemon (for decoding and lengths), read off the loop the first time."""
    tokenizers, path = request.config_dict[TOKENIZERS], route.replicas[0].spec.model_path
    try:
        return tokenizers.cached(path, truncate) or await asyncio.to_thread(tokenizers.get, path, truncate=truncate)
    except NoTokenizer as e:
        raise BadInput(f"model {route.name!r} has no tokenizer: {e}") from None


async def _encode(request: web.Request, route: Route, texts: list[str], *, truncate: bool, param: str
                  ) -> list[list[int]]:
    return await request.config_dict[TEXT].encode(route.name, route.replicas[0].spec.model_path, texts,
                                                  truncate=truncate, param=param)


def _check_length(route: Route, codec: TextCodec, chars: int, param: str) -> None:
    """Refuse, from its length alone and before any tokenizing, a text the model's positions cannot hold."""
    if codec.max_chars and chars > codec.max_chars:
        raise BadInput(f"'{param}' holds {chars} characters; model {route.name!r} takes at most "
                       f"{codec.max_positions} tokens, which cannot hold more than {codec.max_chars} characters",
                       param=param)


async def _close_text(app: web.Application) -> None:
    await app[TEXT].close()


def _embedding_inputs(raw: Any) -> list[str | list[int]]:
    """OpenAI's forms: a string, a list of strings, a token id list, or a list of token id lists."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw and all(_is_int(v) for v in raw):
        return [raw]
    if isinstance(raw, list) and raw and all(isinstance(v, str) or _is_token_list(v) for v in raw):
        if len(raw) > MAX_INPUTS:
            raise BadInput(f"'input' holds {len(raw)} items; at most {MAX_INPUTS} per request", param="input")
        return raw
    raise BadInput(
        "'input' must be a string, a list of strings, a list of token ids or a list of token id lists, "
        "none of them empty",
        param="input",
    )


async def _prompts(request: web.Request, route: Route, raw: Any, codec: TextCodec) -> list[list[int]]:
    """Token ids of each prompt: a string, a list of strings, a token id list, or a list of those."""
    if isinstance(raw, str):
        raw = [raw]
    elif isinstance(raw, list) and raw and all(_is_int(v) for v in raw):
        raw = [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(v, str) or _is_token_list(v) for v in raw):
        raise BadInput(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of token id lists",
            param="prompt",
        )
    texts = [p for p in raw if isinstance(p, str)]
    for text in texts:
        _check_length(route, codec, len(text), "prompt")
    encoded = iter(await _encode(request, route, texts, truncate=False, param="prompt") if texts else [])
    prompts = [next(encoded) if isinstance(p, str) else p for p in raw]
    if any(not p for p in prompts):
        raise BadInput("a prompt must hold at least one token", param="prompt")
    return prompts


def _stops(raw: Any) -> list[str]:
    stops = [raw] if isinstance(raw, str) else raw if raw is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise BadInput(f"'stop' must be a non-empty string or a list of at most {MAX_STOPS} of them", param="stop")
    return stops


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, defaults in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value not in defaults:
            raise BadInput(f"{name}={json.dumps(value)} is not supported by this server", param=name)


def _integer(
    body: dict[str, Any], name: str, default: int | None, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    too_low = minimum is not None and _is_int(value) and value < minimum
    too_high = maximum is not None and _is_int(value) and value > maximum
    if not _is_int(value) or too_low or too_high:
        bounds = "".join(
            (f" >= {minimum}" if minimum is not None else "", f" and <= {maximum}" if maximum is not None else "")
        )
        raise BadInput(f"'{name}' must be an integer{bounds}, got {json.dumps(value)}", param=name)
    return value


def _check_vocabulary(route: Route, prompts: list[list[int]]) -> None:
    # Checked here because an id past the embedding table is a device-side assert on a GPU, which
    # poisons the worker's CUDA context; the worker checks again.
    sizes = [h.info.get("vocab_size") for h in route.replicas if h.info.get("vocab_size")]
    highest = max(max(p) for p in prompts)
    if sizes and highest >= min(sizes):
        message = f"'prompt' holds token id {highest}, outside this model's range [0, {min(sizes)})"
        raise BadInput(message, param="prompt")


async def _all(calls: Iterable[Awaitable[T]]) -> list[T]:
    # Every call runs to its end (no task is left behind unobserved); the first failure is raised.
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise BadInput(f"'{name}' must be a number from {low:g} to {high:g}, got {json.dumps(value)}", param=name)
    return float(value)


def _check_dimensions(route: Route, dimensions: Any) -> None:
    # Embeddings are not shortened: 'dimensions' may only repeat the model's own width.
    if dimensions is None:
        return
    widths = {h.info.get("output_dim") for h in route.replicas if h.info.get("output_dim")}
    if not _is_int(dimensions) or (widths and dimensions not in widths):
        only = f" ({', '.join(map(str, sorted(widths)))} for model {route.name!r})" if widths else ""
        raise BadInput(f"'dimensions' can only be the model's own width{only}", param="dimensions")


def _encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.asarray(vector, dtype=np.float32).tolist()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(v) and 0 <= v < MAX_TOKEN_ID for v in value)


@web.middleware
async def _openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    # Every failure under /v1 leaves in OpenAI's error shape, whatever raised it.
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = e.reason.lower().replace(" ", "_")
        return openai_error(e.status, f"{e.reason}: {request.method} {request.path}", code=code)
    except ServingError as e:
        return unserved_mark(openai_error(e.status, str(e), e.code, e.param), e)
    except Exception as e:  # a bug of ours: still an answer in the client's shape
        log.exception("%s %s failed", request.method, request.path)
        return openai_error(500, f"internal error: {e}", "server_error")
