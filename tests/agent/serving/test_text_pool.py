"""Tokenizing and chat templating run in the agent's text pool, off its event loop, under a time limit: a
tokenizer regex that backtracks, a template that loops, a prompt too long for any position count and text
that is not Unicode each fail their own request with a 400, while a bystander's stream keeps flowing."""

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from tokenizers import Regex, pre_tokenizers

from agent.serving import make_app
from agent.serving.auth import GatewayAuth
from agent.serving.dispatch import BadInput
from agent.serving.textpool import TextPool
from agent.workers.demo_tokenizer import train_bpe
from tests.agent.serving.test_openai import SECRET, TEMPLATE, FakeReplica

LOOPING_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def hostile_dirs(tmp_path_factory):
    """`evil`: a tokenizer whose pre-tokenizer regex backtracks and a template that loops; `chat`: a sound model."""
    root = tmp_path_factory.mktemp("hostile")
    for name in ("evil", "chat"):
        tokenizer = train_bpe()
        if name == "evil":
            tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("(a|aa)+b"), behavior="isolated")
        (root / name).mkdir()
        tokenizer.save(str(root / name / "tokenizer.json"))
        (root / name / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64}))
        template = LOOPING_TEMPLATE if name == "evil" else TEMPLATE
        (root / name / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "chat_template": template}))
    return root


@pytest.fixture
async def agent(hostile_dirs):
    replicas = [FakeReplica(1, "evil", hostile_dirs / "evil", "causal-lm", info={"vocab_size": 1024}),
                FakeReplica(2, "chat", hostile_dirs / "chat", "causal-lm", info={"vocab_size": 1024})]
    replicas[1].token_seconds = 0.02

    class Source:
        def handles(self):
            return replicas

    pool = TextPool(size=2, timeout_s=1.0)
    server = TestServer(make_app(Source(), auth=GatewayAuth(SECRET), text=pool), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}",
                                     headers={"Authorization": f"Bearer {SECRET}"}) as session:
        session.pool = pool
        yield session
    await server.close()


async def bystander_tokens(session, arrivals: list[float]) -> None:
    """A stream to the sound model; the time each of its events arrived."""
    body = {"model": "chat", "prompt": "Hello", "max_tokens": 12, "stream": True}
    async with session.post("/v1/completions", json=body) as response:
        assert response.status == 200
        async for line in response.content:
            if line.startswith(b"data: {"):
                arrivals.append(time.monotonic())


async def while_a_bystander_streams(session, hostile):
    """Run `hostile` (a coroutine making one request) beside a stream; (its status, body, the bystander's
    events that arrived while it was outstanding)."""
    arrivals: list[float] = []
    stream = asyncio.ensure_future(bystander_tokens(session, arrivals))
    while not arrivals:  # the stream is flowing before the hostile request is sent
        await asyncio.sleep(0.01)
    sent = time.monotonic()
    status, body = await hostile
    answered = time.monotonic()
    await stream
    return status, body, [t for t in arrivals if sent <= t <= answered]


async def post(session, path, body):
    async with session.post(path, json=body) as response:
        return response.status, await response.json()


async def test_a_backtracking_tokenizer_fails_its_request_alone_at_the_time_limit(agent):
    # Each run of 30 "a" costs the regex some 10^6 steps (under Oniguruma's retry limit): seconds in all.
    prompt = ("a" * 30 + " ") * 20
    status, body, during = await while_a_bystander_streams(
        agent, post(agent, "/v1/completions", {"model": "evil", "prompt": prompt, "max_tokens": 2}))
    assert status == 400 and body["error"]["code"] == "text_timeout"
    assert "model 'evil': its tokenizer took longer than 1 s" in body["error"]["message"]
    assert during  # the bystander's tokens kept coming while the tokenizer ran
    assert agent.pool.killed == 1


async def test_a_tokenizer_that_panics_on_a_prompt_fails_that_request_alone(agent):
    # 40 "a" pass Oniguruma's retry limit: the Rust tokenizer panics (a BaseException in Python).
    status, body, during = await while_a_bystander_streams(
        agent, post(agent, "/v1/completions", {"model": "evil", "prompt": "a" * 40, "max_tokens": 2}))
    assert status == 400 and body["error"]["param"] == "prompt"
    assert "model 'evil': its tokenizer or chat template failed on this request: PanicException" in \
        body["error"]["message"]
    status, body = await post(agent, "/v1/completions", {"model": "evil", "prompt": "b", "max_tokens": 2})
    assert status == 200  # the replaced process tokenizes what the regex does not choke on


async def test_a_looping_chat_template_fails_its_request_alone_at_the_time_limit(agent):
    chat = {"model": "evil", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, body, during = await while_a_bystander_streams(agent, post(agent, "/v1/chat/completions", chat))
    assert status == 400 and body["error"]["param"] == "messages"
    assert "its chat template took longer than 1 s" in body["error"]["message"]
    assert during


async def test_a_prompt_no_position_count_could_hold_is_refused_from_its_length_before_tokenizing(agent):
    status, body = await post(agent, "/v1/completions", {"model": "chat", "prompt": "x" * (12 << 20)})
    assert status == 400 and body["error"]["param"] == "prompt"
    assert f"holds {12 << 20} characters; model 'chat' takes at most 64 tokens" in body["error"]["message"]
    assert agent.pool.killed == 0
    messages = [{"role": "user", "content": "x" * (1 << 20)}]
    status, body = await post(agent, "/v1/chat/completions", {"model": "chat", "messages": messages})
    assert status == 400 and body["error"]["param"] == "messages"


async def test_text_that_is_not_unicode_is_a_400_that_says_so(agent):
    raw = b'{"model": "chat", "prompt": "a\\ud800b", "max_tokens": 2}'
    async with agent.post("/v1/completions", data=raw, headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["param"] == "prompt" and "not valid Unicode" in error["message"]


async def test_a_text_process_killed_from_outside_is_replaced_before_it_is_used(agent):
    assert (await post(agent, "/v1/completions", {"model": "chat", "prompt": "Hello", "max_tokens": 1}))[0] == 200
    for process in list(agent.pool._all):
        process.popen.kill()
        process.popen.wait()
    assert (await post(agent, "/v1/completions", {"model": "chat", "prompt": "Hello", "max_tokens": 1}))[0] == 200


async def test_an_encoder_without_a_tokenizer_still_takes_token_ids(tmp_path):
    (tmp_path / "ids").mkdir()
    (tmp_path / "ids" / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 4}))
    replica = FakeReplica(5, "ids", tmp_path / "ids", "encoder")

    class Source:
        def handles(self):
            return [replica]

    server = TestServer(make_app(Source(), auth=GatewayAuth(SECRET)), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}",
                                         headers={"Authorization": f"Bearer {SECRET}"}) as session:
            ids = await post(session, "/v1/embeddings", {"model": "ids", "input": [[5, 6, 7, 8, 9]],
                                                        "encoding_format": "float"})
            text = await post(session, "/v1/embeddings", {"model": "ids", "input": "hello"})
    finally:
        await server.close()
    assert ids[0] == 200 and ids[1]["data"][0]["embedding"][:2] == [26, 4]  # cut to its 4 positions
    assert text[0] == 400 and "has no tokenizer" in text[1]["error"]["message"]


async def test_a_closed_pool_leaves_no_process_behind_even_with_a_job_under_way(hostile_dirs):
    from agent.serving.textpool import TextBusy

    pool = TextPool(size=1, timeout_s=5.0)
    chat = str(hostile_dirs / "chat")
    assert await pool.encode("chat", chat, ["hello"], truncate=False, param="prompt")
    (process,) = pool._all
    looping = asyncio.ensure_future(pool.chat("evil", str(hostile_dirs / "evil"), [{"role": "user", "content": "hi"}]))
    await asyncio.sleep(0.5)  # the looping template holds the process
    await pool.close()
    with pytest.raises(BadInput):
        await looping  # its process was killed under it
    assert process.popen.poll() is not None and pool._all == set()  # none started again
    with pytest.raises(TextBusy):
        await pool.encode("chat", chat, ["hello"], truncate=False, param="prompt")
