"""Reading the engines' `usage` on the gateway: non-streamed OpenAI answers (completions, chat, embeddings, vLLM's
responses), streams with and without the client asking for the usage chunk, and the tally that the flusher drains."""

from __future__ import annotations

import json

from console.gateway.usage import Meter, Tally, ask_for_usage, find_usage


def _sse(*events: dict | str) -> bytes:
    return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)


CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
USAGE_CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
               "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def test_it_reads_a_completions_usage():
    body = {"id": "x", "choices": [{"text": "a \"usage\": {\"prompt_tokens\": 99}"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    assert find_usage(json.dumps(body).encode()) == (5, 2)


def test_a_string_usage_after_the_usage_object_does_not_hide_it():
    # vLLM puts prompt_logprobs after usage; a decoded token may be the word itself.
    body = {"id": "x", "choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": 2},
            "prompt_logprobs": [None, {"17": {"logprob": -1.0, "decoded_token": "usage"}}]}
    assert find_usage(json.dumps(body).encode()) == (6, 2)


def test_it_reads_an_embeddings_usage_without_completion_tokens():
    body = {"object": "list", "data": [{"embedding": [0.1] * 50}], "usage": {"prompt_tokens": 4, "total_tokens": 4}}
    assert find_usage(json.dumps(body, separators=(",", ":")).encode()) == (4, 0)


def test_it_reads_a_responses_usage_as_input_and_output_tokens():
    body = {"id": "r", "output": [], "usage": {"input_tokens": 9, "output_tokens": 4, "total_tokens": 13,
                                               "input_tokens_details": {"cached_tokens": 0}}}
    assert find_usage(json.dumps(body).encode()) == (9, 4)


def test_a_body_without_usage_or_with_a_bad_one_reads_as_none():
    assert find_usage(b'{"outputs": []}') is None
    assert find_usage(b'{"usage": null}') is None
    assert find_usage(b'{"usage": {"prompt_tokens": -1}}') is None
    assert find_usage(b'{"usage": {"prompt_tokens": "5"}}') is None


def test_a_stream_the_client_did_not_ask_usage_of_loses_its_usage_chunk_and_is_counted():
    parsed = {"model": "m", "stream": True}
    meter = Meter(strip=ask_for_usage(parsed))
    assert parsed["stream_options"] == {"include_usage": True} and meter.strip
    sent = _sse(CHUNK, USAGE_CHUNK, "[DONE]")
    got = b"".join(meter.events(sent[i:i + 7]) for i in range(0, len(sent), 7)) + meter.events(b"", last=True)
    assert got == _sse(CHUNK, "[DONE]")
    assert (meter.prompt, meter.completion) == (7, 3)


def test_a_stream_the_client_asked_usage_of_keeps_its_usage_chunk():
    parsed = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    meter = Meter(strip=ask_for_usage(parsed))
    assert not meter.strip
    sent = _sse(CHUNK, USAGE_CHUNK, "[DONE]")
    assert meter.events(sent) + meter.events(b"", last=True) == sent
    assert (meter.prompt, meter.completion) == (7, 3)


def test_other_stream_options_are_kept_when_usage_is_asked_for():
    parsed = {"stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": False}}
    assert ask_for_usage(parsed)
    assert parsed["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}


def test_the_last_usage_of_a_stream_counts_as_its_usage_is_cumulative():
    meter = Meter()
    first = {**CHUNK, "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
    meter.events(_sse(first, USAGE_CHUNK))
    assert (meter.prompt, meter.completion) == (7, 3)


def test_the_tally_adds_per_minute_team_token_and_deployment_and_counts_errors():
    tally = Tally()
    tally.add("chat", 1, 2, 200, 0.5, 5, 2, now=120.5)
    tally.add("chat", 1, 2, 429, 0.0, 0, 0, now=170.0)
    tally.add("chat", 1, 3, 200, 0.0, 1, 1, now=170.0)
    tally.add("chat", 1, 2, 200, 0.0, 1, 1, now=180.0)
    rows = tally.drain()
    assert rows == {(120, 1, 2, "chat"): [2, 1, 5, 2, 0.5], (120, 1, 3, "chat"): [1, 0, 1, 1, 0.0],
                    (180, 1, 2, "chat"): [1, 0, 1, 1, 0.0]}
    assert tally.drain() == {}
    tally.restore(rows)
    tally.add("chat", 1, 2, 500, 0.0, 0, 0, now=130.0)
    assert tally.drain()[(120, 1, 2, "chat")] == [3, 2, 5, 2, 0.5]


def test_a_responses_stream_is_counted_from_its_completed_event():
    meter = Meter()
    done = {"type": "response.completed", "response": {"id": "r", "output": [{"content": [{"text": "hi"}]}],
                                                       "usage": {"input_tokens": 5, "output_tokens": 2}, "user": None}}
    sent = b"event: response.created\ndata: {\"type\": \"response.created\"}\n\n" + \
        f"event: response.completed\ndata: {json.dumps(done)}\n\n".encode()
    assert meter.events(sent) == sent and (meter.prompt, meter.completion) == (5, 2)


def test_a_stream_without_event_boundaries_is_passed_on_rather_than_held():
    meter = Meter()
    assert meter.events(b"x" * 10) == b""
    passed = meter.events(b"y" * (70 * 1024))
    assert len(passed) + len(meter.events(b"", last=True)) == 10 + 70 * 1024


def test_a_tally_the_database_never_took_stays_bounded(monkeypatch):
    import console.gateway.usage as usage

    monkeypatch.setattr(usage, "MAX_KEYS", 2)
    tally = Tally()
    tally.add("a", 1, 1, 200, 0.0, 1, 1, now=0)
    tally.add("b", 1, 1, 200, 0.0, 1, 1, now=0)
    rows = tally.drain()
    tally.add("c", 1, 1, 200, 0.0, 1, 1, now=0)
    tally.restore(rows)  # would be three entries: dropped
    assert list(tally.drain()) == [(0, 1, 1, "c")]


def test_a_stream_cut_before_its_usage_chunk_is_charged_an_event_a_token():
    meter = Meter(strip=True)
    passed = meter.events(_sse(CHUNK, CHUNK, CHUNK))  # the client goes away here
    meter.cut(passed.count(b"data:"))
    assert (meter.prompt, meter.completion) == (0, 3)
    whole = Meter(strip=True)
    whole.events(_sse(CHUNK, USAGE_CHUNK, "[DONE]"))
    whole.cut(2)
    assert (whole.prompt, whole.completion) == (7, 3)  # the engine's own count stands where it came


def test_a_stream_of_crlf_events_passes_event_by_event_and_loses_its_usage_chunk():
    meter = Meter(strip=True)
    crlf = lambda event: _sse(event).replace(b"\n", b"\r\n")  # noqa: E731
    assert meter.events(crlf(CHUNK)) == crlf(CHUNK)  # at once, not held for more
    assert meter.events(crlf(USAGE_CHUNK) + crlf("[DONE]")) == crlf("[DONE]")
    assert (meter.prompt, meter.completion) == (7, 3)
