"""Text generation over the dispatcher, for /v1/completions and /v1/chat/completions (torch-free).

Each choice is one sequence in a replica's continuous batcher: its tokens become text as they arrive
(agent.serving.detokenize), stop strings end it early (the worker is told to drop it), and every piece is
handed to a sink: the streaming endpoints write it out as a server-sent event, the others keep it. The
non-streamed answer is assembled from the very same pieces, so the two are equal for the same tokens. A choice
that echoes its prompt (/v1/completions' `echo`) hands out the prompt's text, and its log probabilities when
asked for, as its first piece, once the worker has taken the sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agent.serving.detokenize import TextStream, TokenText, text_offsets, token_text
from agent.serving.dispatch import Dispatcher, Route, serving_error
from agent.serving.tokenization import TextCodec
from agent.workers.errors import InferenceTimeout
from agent.workers.generation_spec import GenerationRequest, PromptLogprobs, TokenLogprob


@dataclass(frozen=True)
class LogprobEntry:
    """One token of a choice's text: the token, its log probability and the top alternatives (token, logprob),
    best first, and where its text starts in the choice's text. A prompt's first token has no log probability
    and no alternatives (None), nor has any prompt token the replica sent none for."""

    token: TokenText
    logprob: float | None
    top: tuple[tuple[TokenText, float], ...] | None
    offset: int = 0


@dataclass
class Delta:
    """New text of one choice; `finish_reason` is set on its last one."""

    index: int
    text: str
    logprobs: list[LogprobEntry] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Choice:
    """One sequence to generate, and what it made."""

    index: int
    request: GenerationRequest
    echo: str | None = None  # the prompt's text, to put before the completion; None: no echo
    text: str = ""  # the echo, then the completion
    finish_reason: str = "length"
    completion_tokens: int = 0
    logprobs: list[LogprobEntry] = field(default_factory=list)


Sink = Callable[[Delta], None]


async def run_choice(dispatcher: Dispatcher, route: Route, choice: Choice, codec: TextCodec, stops: Sequence[str],
                     sink: Sink | None = None) -> Choice:
    """Generate one choice to its end (or its first stop string), handing each settled piece to `sink`."""
    stream = await dispatcher.generate(route, choice.request)
    text = TextStream(codec, stops)
    texts: dict[int, TokenText] = {}  # each token id's, worked out once
    start = len(choice.echo or "")  # where the completion starts in the choice's text
    echoing = choice.echo is not None
    pending: list[LogprobEntry] = []
    metrics, last = dispatcher.metrics, time.monotonic()
    try:
        async for token in stream:
            if echoing:  # the worker took the sequence: the prompt goes first
                _echo(choice, codec, texts, token.prompt_logprobs, sink)
                echoing = False
            if metrics is not None:
                now = time.monotonic()
                metrics.token(route.deployment, now - last, first=not choice.completion_tokens)
                last = now
            choice.completion_tokens += 1
            offset = start + len(text.text)
            piece = text.push(token.token_id)
            if token.logprob is not None:
                entry = _entry(codec, texts, token.token_id, token.logprob, offset)
                choice.logprobs.append(entry)
                pending.append(entry)
            if piece and sink is not None:
                sink(Delta(choice.index, piece, pending))
                pending = []
            if text.stopped:
                break
        if echoing:  # it ended without a token (none asked for, or the first one ended it)
            _echo(choice, codec, texts, stream.result.prompt_logprobs, sink)
        rest = text.finish()
        choice.finish_reason = "stop" if text.stopped else stream.result.finish_reason
    except (asyncio.CancelledError, ConnectionResetError, InferenceTimeout) as e:
        if metrics is not None:
            metrics.cancelled(route.deployment, "timeout" if isinstance(e, InferenceTimeout) else "client")
        raise
    finally:
        stream.close()  # ended early (stop string, error, client gone): the worker drops the sequence
    choice.text = (choice.echo or "") + text.text
    if sink is not None:
        sink(Delta(choice.index, rest, pending, choice.finish_reason))
    return choice


async def run_all(dispatcher: Dispatcher, route: Route, choices: list[Choice], codec: TextCodec,
                  stops: Sequence[str]) -> list[Choice]:
    """Every choice at once, to its end; the first failure is raised once all have stopped."""
    tasks = [asyncio.ensure_future(run_choice(dispatcher, route, c, codec, stops)) for c in choices]
    try:
        results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for task in tasks:
            task.cancel()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


_END = object()


async def stream_sse(
    request: web.Request,
    dispatcher: Dispatcher,
    route: Route,
    choices: list[Choice],
    codec: TextCodec,
    stops: Sequence[str],
    chunk: Callable[[Delta], dict[str, Any]],
    usage: dict[str, Any] | None,
    first: Callable[[int], dict[str, Any]] | None = None,
) -> web.StreamResponse:
    """Server-sent events in OpenAI's chunk format: `data: {...}` per piece, `data: [DONE]` at the end.

    The response starts with the first piece, so a failure before any token is still a plain HTTP error
    (which the console's gateway may retry elsewhere); one after it is an `error` event. `usage` (filled in
    at the end) is sent as a last chunk when the client asked for it. A client that goes away cancels every
    choice's sequence in the worker."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def produce(choice: Choice) -> None:
        try:
            await run_choice(dispatcher, route, choice, codec, stops, queue.put_nowait)
            queue.put_nowait(_END)
        except Exception as e:  # noqa: BLE001 (handed to the writer, which decides how to tell the client)
            queue.put_nowait(e)

    tasks = [asyncio.ensure_future(produce(c)) for c in choices]
    response: web.StreamResponse | None = None
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is _END:
                remaining -= 1
                continue
            if isinstance(item, Exception):
                if response is None:
                    raise item
                failure = serving_error(item, route.name)
                await _send(response, {"error": {"message": str(failure), "type": "server_error",
                                                 "code": failure.code, "param": None}})
                break
            if response is None:
                response = await _start(request)
                for choice in choices if first is not None else ():
                    await _send(response, first(choice.index))
            await _send(response, chunk(item))
        else:
            if usage is not None:
                usage.update(_usage(choices))
                await _send(response, usage)
        await response.write(b"data: [DONE]\n\n")
        return response
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


def usage_of(choices: Sequence[Choice]) -> dict[str, int]:
    return _usage(choices)["usage"]


def _usage(choices: Sequence[Choice]) -> dict[str, Any]:
    prompts = {}
    for choice in choices:  # n choices of one prompt count its tokens once, as OpenAI does
        prompts[choice.request.input_ids] = len(choice.request.input_ids)
    prompt_tokens = sum(prompts.values())
    completion_tokens = sum(c.completion_tokens for c in choices)
    return {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


async def _start(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")


def _echo(choice: Choice, codec: TextCodec, texts: dict[int, TokenText], logprobs: PromptLogprobs | None,
          sink: Sink | None) -> None:
    """The choice's first piece: its prompt's text, with the prompt tokens' log probabilities when asked for."""
    entries = []
    if choice.request.prompt_logprobs is not None:
        ids = choice.request.input_ids
        _text, starts = text_offsets(codec, ids)
        got = logprobs or ()
        for position, (token_id, offset) in enumerate(zip(ids, starts, strict=True)):
            logprob = got[position] if position < len(got) else None
            entries.append(LogprobEntry(_token(codec, texts, token_id), None, None, offset) if logprob is None
                           else _entry(codec, texts, token_id, logprob, offset))
    choice.logprobs.extend(entries)
    if sink is not None:
        sink(Delta(choice.index, choice.echo or "", entries))


def _entry(codec: TextCodec, texts: dict[int, TokenText], token_id: int, logprob: TokenLogprob,
           offset: int) -> LogprobEntry:
    return LogprobEntry(_token(codec, texts, token_id), logprob.logprob,
                        tuple((_token(codec, texts, t), lp) for t, lp in logprob.top), offset)


def _token(codec: TextCodec, texts: dict[int, TokenText], token_id: int) -> TokenText:
    if token_id not in texts:
        texts[token_id] = token_text(token_id, codec.token_text(token_id), codec.token_piece(token_id))
    return texts[token_id]

