"""What admission reserves for a request (console/gateway/reservation.py): its body's bytes for its prompts and its
max_tokens (or what the engines use without it) for each choice, each sequence bounded by the deployment's context;
nothing for requests the engines count no tokens for."""

from __future__ import annotations

import json

from console.gateway.reservation import NOTHING, UNKNOWN_CONTEXT, need


def _need(path: str, body: dict, context: int | None = None):
    return need(path, body, len(json.dumps(body)), context)


def test_a_completion_reserves_its_bodys_bytes_and_its_max_tokens_else_sixteen():
    body = {"model": "chat", "prompt": "count the sheep", "max_tokens": 40}
    size = len(json.dumps(body))
    assert _need("/v1/completions", body) == (size + 40, size, 40, 1)
    del body["max_tokens"]
    assert _need("/v1/completions", body).completion == 16  # both engines' default, and OpenAI's


def test_each_choice_of_each_prompt_reserves_its_completion():
    body = {"model": "chat", "prompt": ["one", "two", "three"], "max_tokens": 10, "n": 2}
    assert _need("/v1/completions", body).choices == 6
    assert _need("/v1/completions", body).tokens == len(json.dumps(body)) + 60
    token_lists = {"model": "chat", "prompt": [[1, 2], [3]], "max_tokens": 10, "best_of": 3, "n": 2}
    assert _need("/v1/completions", token_lists).choices == 6
    one_token_list = {"model": "chat", "prompt": [1, 2, 3], "max_tokens": 10}
    assert _need("/v1/completions", one_token_list).choices == 1


def test_a_chat_without_max_tokens_reserves_the_rest_of_its_context_and_max_completion_tokens_comes_first():
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    assert _need("/v1/chat/completions", body, context=4096).tokens == 4096  # prompt and completion fit in it
    assert _need("/v1/chat/completions", body).completion == UNKNOWN_CONTEXT  # vLLM's when a config declares none
    body |= {"max_tokens": 500, "max_completion_tokens": 50}
    assert _need("/v1/chat/completions", body, context=4096).completion == 50
    assert _need("/v1/responses", {"model": "chat", "input": "hi", "max_output_tokens": 30}).completion == 30


def test_the_context_bounds_a_huge_max_tokens_and_a_huge_prompt():
    body = {"model": "chat", "prompt": "x" * 10_000, "max_tokens": 10**9, "n": 2}
    assert _need("/v1/completions", body, context=2048) == (2 * 2048, 2048, 2048, 2)
    assert _need("/v1/completions", {"model": "chat", "prompt": "hi", "max_tokens": 100}, context=2048).tokens == \
        len(json.dumps({"model": "chat", "prompt": "hi", "max_tokens": 100})) + 100


def test_a_count_an_engine_reads_laxly_reserves_what_it_reads_and_a_null_max_tokens_the_rest_of_the_context():
    # vLLM's parser (pydantic, lax) reads "4000", 4000.0, " 4000 " and "4_000" as 4000, a string "16" as n=16, and a
    # completion's null max_tokens as none at all: it generates to the end of the context.
    def completion(**fields):
        return _need("/v1/completions", {"model": "chat", "prompt": "hi", **fields}, context=8192)

    for lax in ("4000", 4000.0, " 4000 ", "4_000"):
        assert completion(max_tokens=lax).completion == 4000, lax
    assert completion(max_tokens=None).completion == 8192
    assert completion(max_tokens="many").completion == 8192  # refused by the engine: holding the most costs nothing
    assert completion(max_tokens=10, n="16").choices == 16 and completion(max_tokens=10, best_of=8.0).choices == 8
    assert _need("/v1/chat/completions", {"model": "chat", "messages": [], "max_completion_tokens": "50"},
                 context=8192).completion == 50


def test_embeddings_reserve_their_input_and_v2_tokenize_and_detokenize_nothing():
    body = {"model": "embed", "input": ["a", "b"]}
    assert _need("/v1/embeddings", body) == (len(json.dumps(body)),) * 2 + (0, 0)
    assert need("/v2/models/chat/infer", None, 10_000, None) == NOTHING
    assert _need("/tokenize", {"model": "chat", "prompt": "hi"}) == NOTHING


def test_the_words_say_what_was_counted_and_what_max_tokens_would_fit():
    body = {"model": "chat", "prompt": "hi", "max_tokens": 100, "n": 3}
    need_ = _need("/v1/completions", body)
    size = len(json.dumps(body))
    assert str(need_) == (f"up to {size + 300} tokens ({size} for its prompt, counted as its body's bytes, and 100 "
                          "for each of its 3 choices)")
    assert need_.completion_within(size + 90) == 30
    assert need_.completion_within(size - 1) == 0
