"""What one request may ask of an engine is bounded in one place, for both engines, before either sees it: choices
per prompt, log probabilities, and the structured outputs a grammar is compiled from, in every spelling vLLM has
had. A request over a bound is a 400 naming the field and the bound; vLLM never receives it."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agent.serving.dispatch import BadInput
from agent.serving.request_bounds import (
    MAX_CHOICES,
    MAX_LOGPROBS,
    MAX_N,
    MAX_REPEAT_WEIGHT,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_VALUES,
    check_request,
)
from agent.workers.spec import WorkerSpec
from tests.agent.serving.test_openai import FakeReplica

WORDS = [f"w{i}" for i in range(100_000)]


def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def wide(properties: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(properties)}}


@pytest.mark.parametrize("body, field, words", [
    ({"n": 10_000}, "n", f"at most {MAX_N} sequences per prompt"),
    ({"n": 17}, "n", "at most 16"),
    ({"n": "10000"}, "n", "at most 16"),  # vLLM's parser reads a numeric string as a number
    ({"n": 1e9}, "n", "at most 16"),
    ({"best_of": 64}, "best_of", "at most 16"),
    ({"logprobs": 21}, "logprobs", f"from 0 to {MAX_LOGPROBS}"),
    ({"logprobs": -1}, "logprobs", "from 0 to 20"),  # -1: the whole vocabulary
    ({"top_logprobs": 100}, "top_logprobs", "from 0 to 20"),
    ({"prompt_logprobs": -1}, "prompt_logprobs", "from 0 to 20"),
    ({"structured_outputs": {"choice": WORDS}}, "structured_outputs.choice",
     f"100,000 choices; at most {MAX_CHOICES:,} are taken"),
    ({"guided_choice": WORDS[:2000]}, "guided_choice", "2,000 choices"),
    ({"structured_outputs": {"choice": ["x" * 100] * 1000}}, "structured_outputs.choice", "characters in all"),
    ({"structured_outputs": {"json": nested(20)}}, "structured_outputs.json",
     f"nests more than {MAX_SCHEMA_DEPTH} levels deep"),
    ({"guided_json": json.dumps(nested(20))}, "guided_json", "nests more than 32"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": wide(5000)}}},
     "response_format", f"{MAX_SCHEMA_VALUES:,} JSON values in all"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": nested(20)}}}, "text.format", "nests more"),
    ({"structured_outputs": {"regex": "a" * 20_000}}, "structured_outputs.regex", "16,384 characters in all"),
    ({"guided_grammar": "root ::= " + "x" * 20_000}, "guided_grammar", "16,384 characters"),
    ({"structured_outputs": {"regex": "[a-z]{1,64}[0-9]{1,64}-{1,64}"}}, "structured_outputs.regex",
     f"weigh more than {MAX_REPEAT_WEIGHT}"),
    ({"structured_outputs": {"regex": "(([a-z]{1,999}){1,998}){1,997}"}}, "structured_outputs.regex", "weigh more"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {  # 31.6 s to compile, measured
        "type": "array", "maxItems": 1000, "items": {"type": "array", "maxItems": 1000, "items": {
            "type": "string", "maxLength": 999}}}}}}, "response_format", "minItems/maxItems"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "pattern": f"[a-z]{{{i + 40}}}"} for i in range(4)}}}}}, "response_format",
     "weigh more"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "format": "date-time"} for i in range(512)}}}}}, "response_format",
     "formats and number ranges (1 each)"),  # 6.7 s to compile, measured
    ({"structured_outputs": {"json": {"type": "object", "properties": {
        f"p{i}": {"type": "integer", "minimum": -i, "maximum": i} for i in range(1000)}}}}, "structured_outputs.json",
     "weigh more than 128"),  # 8.9 s to compile, measured
    ({"structured_outputs": {"structural_tag": json.dumps({"structures": [{"begin": f"<f{i}>", "end": "</f>",
        "schema": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 64}}}} for i in range(3)],
        "triggers": ["<f"]})}}, "structured_outputs.structural_tag", "weigh more"),  # a JSON string of schemas
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools",
     "129 tools; at most 128"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": nested(20)}}]}, "tools", "nests more"),
])
def test_a_request_over_a_bound_is_refused_naming_the_field_and_the_bound(body, field, words):
    with pytest.raises(BadInput) as e:
        check_request(body)
    assert e.value.param == field and words in str(e.value), str(e.value)


@pytest.mark.parametrize("body", [
    {"n": 16, "best_of": 16, "logprobs": 20, "top_logprobs": 20, "prompt_logprobs": 0},
    {"logprobs": True, "top_logprobs": 5},  # chat's logprobs is a switch
    {"structured_outputs": {"choice": ["positive", "negative", "neutral"]}},
    {"structured_outputs": {"regex": r"\d{3}-\d{4}", "whitespace_pattern": r"[ ]?"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
        "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "why": {"type": "string",
                                                                                  "maxLength": 64}},
        "required": ["answer"]}}}},
    {"response_format": {"type": "json_object"}},
    {"structured_outputs": {"json": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "format": "date"} for i in range(64)} | {"n": {"type": "integer", "minimum": 0}}}}},
    {"tools": [{"type": "function", "function": {"name": f"f{i}", "parameters": wide(8)}} for i in range(128)],
     "tool_choice": "required"},
    {"n": None, "logprobs": None, "structured_outputs": None},
])
def test_a_request_within_the_bounds_is_taken(body):
    check_request(body)


class Engine:
    """A stand-in for a vLLM server: counts what reaches it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def completions(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return web.json_response({"object": "text_completion", "choices": []})


@pytest.fixture
async def engine():
    fake = Engine()
    app = web.Application()
    app.router.add_post("/v1/completions", fake.completions)
    app.router.add_post("/v1/chat/completions", fake.completions)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    fake.port = server.port
    yield fake
    await server.close()


def vllm_replica(port: int) -> FakeReplica:
    replica = FakeReplica(1, "chat", "/models/chat", "causal-lm", info={"port": port, "key": "engine-key"})
    replica.spec = WorkerSpec(1, "/models/chat", "causal-lm", deployment="chat", engine="vllm")
    replica.picked, replica.last_used = 0, 0.0
    return replica


async def test_vllm_never_receives_a_request_over_a_bound(serve, engine):
    client = await serve(vllm_replica(engine.port))
    for path, body, field in [
        ("/v1/completions", {"model": "chat", "prompt": "hi", "n": 10_000}, "n"),
        ("/v1/chat/completions", {"model": "chat", "messages": [], "structured_outputs": {"choice": WORDS}},
         "structured_outputs.choice"),
        ("/v1/chat/completions", {"model": "chat", "messages": [], "logprobs": True, "top_logprobs": -1},
         "top_logprobs"),
    ]:
        response = await client.post(path, json=body)
        error = (await response.json())["error"]
        assert response.status == 400 and error["param"] == field, error
    assert engine.bodies == []
    response = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi", "n": 16})
    assert response.status == 200 and [b["n"] for b in engine.bodies] == [16]


async def test_the_built_in_engine_takes_the_same_bound(serve):
    client = await serve(FakeReplica(1, "chat", "/models/chat", "causal-lm"))
    response = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi", "n": 17})
    error = (await response.json())["error"]
    assert response.status == 400 and error["param"] == "n" and "at most 16 sequences per prompt" in error["message"]
