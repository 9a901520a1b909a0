"""The OpenAI-style /v1 endpoints, driven by the official openai client, over fake replicas on loopback."""

import asyncio
import json
import shutil
import time

import aiohttp
import numpy as np
import openai
import pytest
from aiohttp.test_utils import TestServer

from agent.cli import build_parser
from agent.serving import make_app
from agent.serving.app import METRICS
from agent.serving.auth import GatewayAuth
from agent.serving.batching import BatchSettings
from agent.workers.demo_tokenizer import train_bpe, train_wordpiece
from agent.workers.errors import InferenceTimeout
from agent.workers.generation_spec import GenerationResult, Token
from agent.workers.spec import WorkerSpec

CONTINUATION = " and the quick brown fox jumps over the lazy dog again"
SECRET = "gw-secret-for-openai-tests"
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}[SYS]{{ m.content }}[/SYS]"
    "{% elif m.role == 'user' %}[USER]{{ m.content }}[/USER]{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
)  # the official client sends its api_key as the bearer token


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A causal-LM directory (BPE, 64 positions) and an encoder directory (WordPiece, 8 positions)."""
    root = tmp_path_factory.mktemp("models")
    for name, tokenizer, model_type, positions in (
        ("chat", train_bpe(), "llama", 64),
        ("embed", train_wordpiece(), "bert", 8),
    ):
        (root / name).mkdir()
        # Padding and truncation saved in the file (as all-MiniLM-L6-v2 has them) must not leak into requests.
        tokenizer.enable_padding(length=16)
        tokenizer.enable_truncation(3)
        tokenizer.save(str(root / name / "tokenizer.json"))
        config = {"model_type": model_type, "max_position_embeddings": positions}
        (root / name / "config.json").write_text(json.dumps(config))
    shutil.copytree(root / "chat", root / "plain")  # the same model without a chat template
    (root / "chat" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "chat_template": TEMPLATE}))
    return root


class FakeReplica:
    """An encoder embeds a row as (sum of ids, tokens, 1 with an adapter); a causal LM continues with CONTINUATION."""

    def __init__(self, replica_id, deployment, path, task, state="ready", adapters=(), info=None):
        self.spec = WorkerSpec(replica_id, str(path), task, deployment=deployment)
        self.state, self.reason, self.adapters = state, "", set(adapters)
        self.info = info or {"output_dim": 3}
        self.queued = 0
        self.forwards, self.generations = [], []
        self.cancelled = 0
        self.token_seconds = 0
        self.fail_with = None

    async def infer(self, inputs, adapters=None):
        self.forwards.append((inputs, adapters))
        ids, mask = inputs["input_ids"], inputs.get("attention_mask", np.ones_like(inputs["input_ids"]))
        flags = [0.0 if a is None else 1.0 for a in adapters or [None] * len(ids)]
        return {"embeddings": np.stack([(ids * mask).sum(1), mask.sum(1), flags], axis=1).astype(np.float32)}

    def generate(self, request):
        self.generations.append(request)
        ids = train_bpe().encode(CONTINUATION, add_special_tokens=False).ids
        if request.max_new_tokens < len(ids):
            return FakeStream(ids[: request.max_new_tokens], "length", self)
        return FakeStream(ids, "stop", self)


class FakeStream:
    """The worker's stream of one sequence: its tokens, then how it ended; records a cancel."""

    def __init__(self, ids, finish, replica):
        self.ids, self.finish, self.replica = list(ids), finish, replica
        self.result = None
        replica.queued += 1

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(self.replica.token_seconds)
        if self.replica.fail_with is not None:
            self.result = GenerationResult((), "stop")
            raise self.replica.fail_with
        if self.ids:
            return Token(1, self.ids.pop(0))
        self.result = GenerationResult((), self.finish)
        self.replica.queued -= 1
        raise StopAsyncIteration

    def close(self):
        if self.result is None:
            self.result = GenerationResult((), "stop")
            self.replica.queued -= 1
            self.replica.cancelled += 1


@pytest.fixture
def replicas(model_dirs):
    return {
        "chat": FakeReplica(
            1, "chat", model_dirs / "chat", "causal-lm", adapters={"chat-fr"}, info={"vocab_size": 1024}
        ),
        "embed": FakeReplica(2, "embed", model_dirs / "embed", "encoder", adapters={"legal"}),
        "slow": FakeReplica(3, "slow", model_dirs / "embed", "encoder", state="loading"),
        "plain": FakeReplica(4, "plain", model_dirs / "plain", "causal-lm", info={"vocab_size": 1024}),
    }


@pytest.fixture
async def client(replicas):
    class Source:
        def handles(self):
            return list(replicas.values())

    app = make_app(Source(), batching=BatchSettings(max_batch_size=8, max_delay=0.01), auth=GatewayAuth(SECRET))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=SECRET, max_retries=0) as c:
        c.server = server
        yield c
    await server.close()


async def test_it_lists_deployments_and_adapters_as_models(client):
    models = {m.id: m for m in (await client.models.list()).data}
    assert sorted(models) == ["chat", "chat-fr", "embed", "legal", "plain", "slow"]
    assert models["chat-fr"].model_extra["parent"] == "chat" and models["chat"].owned_by == "modelgrid"
    assert (await client.models.retrieve("legal")).id == "legal"


async def test_embeddings_of_strings_come_back_batched_with_usage(client, replicas, model_dirs):
    from tokenizers import Tokenizer

    texts = ["hello world", "the quick brown fox"]
    tokenizer = Tokenizer.from_file(str(model_dirs / "embed" / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    ids = [e.ids for e in tokenizer.encode_batch(texts)]
    assert [len(i) for i in ids] == [4, 6]
    response = await client.embeddings.create(model="embed", input=texts)  # the client asks for base64
    assert [d.embedding for d in response.data] == [[sum(i), len(i), 0.0] for i in ids]
    assert [d.index for d in response.data] == [0, 1] and response.model == "embed"
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(len(i) for i in ids)
    [(batch, _)] = replicas["embed"].forwards  # both texts in one right-padded forward
    assert batch["input_ids"].shape == (2, max(len(i) for i in ids))

    floats = await client.embeddings.create(model="embed", input="hello world", encoding_format="float")
    assert floats.data[0].embedding == [sum(ids[0]), len(ids[0]), 0.0]


async def test_embeddings_take_token_ids_and_truncate_to_the_models_positions(client):
    response = await client.embeddings.create(model="embed", input=[[5, 6, 7], [8]], encoding_format="float")
    assert [d.embedding for d in response.data] == [[18, 3, 0], [8, 1, 0]]
    long = await client.embeddings.create(model="embed", input="hello world " * 20, encoding_format="float")
    assert long.data[0].embedding[1] == 8 and long.usage.prompt_tokens == 8  # [CLS] ... [SEP] kept within 8
    ids = await client.embeddings.create(model="embed", input=list(range(1, 30)), encoding_format="float")
    assert ids.data[0].embedding[:2] == [sum(range(1, 9)), 8]


async def test_completions_tokenize_generate_decode_and_count(client, replicas):
    response = await client.completions.create(model="chat", prompt="Hello", max_tokens=4, temperature=0, seed=3)
    [choice] = response.choices
    [request] = replicas["chat"].generations
    assert request.input_ids == tuple(train_bpe().encode("Hello").ids)  # with <s> in front
    assert (request.max_new_tokens, request.temperature, request.seed, request.adapter) == (4, 0.0, 3, None)
    assert choice.text == " and the quick brown" and choice.finish_reason == "length"
    assert response.object == "text_completion" and response.model == "chat"
    assert response.usage.prompt_tokens == len(request.input_ids) and response.usage.completion_tokens == 4
    assert response.usage.total_tokens == len(request.input_ids) + 4


async def test_completions_stop_at_a_stop_string_and_take_several_prompts(client, replicas):
    response = await client.completions.create(
        model="chat", prompt=["Hello", [1, 42, 7]], max_tokens=50, stop=[" fox", "zebra"], top_p=0.5
    )
    assert [c.text for c in response.choices] == [" and the quick brown"] * 2
    assert [c.finish_reason for c in response.choices] == ["stop", "stop"]
    first, second = replicas["chat"].generations
    assert second.input_ids == (1, 42, 7) and first.top_p == 0.5
    assert first.stop_token_ids == ()
    # The worker is told to drop each sequence as soon as its text reaches the stop string.
    assert replicas["chat"].cancelled == 2 and replicas["chat"].queued == 0


async def test_an_adapter_is_chosen_by_using_its_name_as_the_model(client, replicas):
    completion = await client.completions.create(model="chat-fr", prompt="Hello", max_tokens=2)
    assert replicas["chat"].generations[0].adapter == "chat-fr" and completion.model == "chat-fr"
    embedding = await client.embeddings.create(model="legal", input=["a", "b"], encoding_format="float")
    assert [d.embedding[2] for d in embedding.data] == [1.0, 1.0]
    assert replicas["embed"].forwards[0][1] == ["legal", "legal"]


async def test_an_adapter_that_could_not_load_is_a_503_adapter_failed_with_its_reason(client, replicas):
    replicas["chat"].adapter_failures = {"chat-fr": "LoRA rank 600 is more than vLLM serves (512)"}
    with pytest.raises(openai.InternalServerError) as raised:
        await client.completions.create(model="chat-fr", prompt="Hello", max_tokens=2)
    assert raised.value.status_code == 503 and raised.value.code == "adapter_failed"
    assert raised.value.body["message"] == ("adapter 'chat-fr' of model 'chat' could not be loaded: LoRA rank 600 is "
                                            "more than vLLM serves (512)")
    assert replicas["chat"].generations == []


async def test_an_unknown_model_is_a_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as raised:
        await client.embeddings.create(model="nope", input="hi")
    assert raised.value.code == "model_not_found" and raised.value.type == "invalid_request_error"
    assert raised.value.body["message"] == (
        "model 'nope' is not served by this agent (it serves: chat, chat-fr, embed, legal, plain, slow)"
    )


@pytest.mark.parametrize(
    ("call", "param", "message"),
    [
        (dict(model="embed", prompt="hi"), "model", "model 'embed' is an encoder: /v1/completions needs"),
        (dict(model="chat", prompt="hi", n=17), "n", "'n' is 17; a request may ask for at most 16 sequences"),
        (dict(model="chat", prompt="hi", logprobs=6), "logprobs", "'logprobs' must be an integer >= 0 and <= 5"),
        (dict(model="chat", prompt="hi", extra_body={"stop_token_ids": [-1]}), "stop_token_ids", "token ids"),
        (dict(model="chat", prompt="hi", extra_body={"timeout": 0}), "timeout", "must be a number of seconds"),
        (dict(model="chat", prompt="hi", max_tokens=4, extra_body={"min_tokens": 5}), "min_tokens",
         "'min_tokens' must be an integer >= 0 and <= 4"),
        (dict(model="chat", prompt="hi", extra_body={"ignore_eos": "yes"}), "ignore_eos", "must be true or false"),
        (dict(model="chat", prompt="hi", suffix="!"), "suffix", 'suffix="!" is not supported'),
        (dict(model="chat", prompt="hi", temperature=3), "temperature", "'temperature' must be a number from 0 to 2"),
        (dict(model="chat", prompt="hi", max_tokens=0), "max_tokens", "'max_tokens' must be an integer >= 1"),
        (dict(model="chat", prompt="hi", max_tokens=100), "max_tokens", "takes at most 64 tokens"),
        (dict(model="chat", prompt=[]), "prompt", "'prompt' must be a string"),
        (dict(model="chat", prompt=[1, 5000]), "prompt", "token id 5000, outside this model's range [0, 1024)"),
        (dict(model="chat", prompt="hi", seed=-1), "seed", "'seed' must be an integer >= 0 and <= "),
        (dict(model="chat", prompt="hi", stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
    ],
)
async def test_a_bad_completion_request_is_a_400_naming_the_parameter(client, call, param, message):
    with pytest.raises(openai.BadRequestError) as raised:
        await client.completions.create(**call)
    assert raised.value.param == param and message in raised.value.message
    assert raised.value.type == "invalid_request_error"


async def test_bad_embedding_input_is_a_400(client):
    for bad in ([], [[]], [1.5], [["a"]]):
        with pytest.raises(openai.BadRequestError) as raised:
            await client.embeddings.create(model="embed", input=bad)
        assert raised.value.param == "input"
    with pytest.raises(openai.BadRequestError, match="'dimensions' can only be the model's own width"):
        await client.embeddings.create(model="embed", input="hi", dimensions=2)


async def test_a_model_that_is_not_ready_is_a_503(client):
    with pytest.raises(openai.InternalServerError) as raised:
        await client.embeddings.create(model="slow", input="hi")
    assert raised.value.status_code == 503 and raised.value.code == "model_not_ready"
    assert raised.value.body["message"] == "model 'slow' is not ready: replica 3 of 'slow' is loading"


async def test_a_full_queue_is_a_429(model_dirs):
    gate, started = asyncio.Event(), asyncio.Event()

    class Blocking(FakeReplica):
        async def infer(self, inputs, adapters=None):
            started.set()
            await gate.wait()
            return await super().infer(inputs, adapters)

    replica = Blocking(1, "embed", model_dirs / "embed", "encoder")

    class Source:
        def handles(self):
            return [replica]

    app = make_app(Source(), batching=BatchSettings(max_batch_size=1, max_delay=0, max_queue=1),
                   auth=GatewayAuth(SECRET))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key=SECRET, max_retries=0) as client:
            async with asyncio.timeout(10):
                running = asyncio.ensure_future(client.embeddings.create(model="embed", input=[[1]]))
                await started.wait()
                waiting = asyncio.ensure_future(client.embeddings.create(model="embed", input=[[2]]))
                while app[METRICS].snapshot().deployments[0].queue_depth < 2:
                    await asyncio.sleep(0.01)
                with pytest.raises(openai.RateLimitError) as raised:
                    await client.embeddings.create(model="embed", input=[[3]])
                gate.set()
                await asyncio.gather(running, waiting)
        assert raised.value.code == "queue_full" and "retry later" in raised.value.message
    finally:
        gate.set()
        await server.close()


async def test_unknown_routes_and_bad_bodies_under_v1_keep_the_openai_shape(client):
    base = f"http://127.0.0.1:{client.server.port}/v1"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        async with http.get(f"{base}/nothing") as response:
            body = await response.json()
            assert response.status == 404 and set(body["error"]) == {"message", "type", "param", "code"}
        async with http.post(f"{base}/completions", data=b"{not json") as response:
            assert response.status == 400 and "not valid JSON" in (await response.json())["error"]["message"]



async def test_a_sleeping_model_is_a_503_at_once_and_stays_asleep(client, replicas):
    replicas["chat"].state = "sleeping"  # the agent does not wake it for a request: the console decides
    with pytest.raises(openai.InternalServerError) as raised:
        await client.completions.create(model="chat", prompt="Hello", max_tokens=2)
    assert raised.value.status_code == 503 and raised.value.code == "model_not_ready"
    assert raised.value.body["message"] == "model 'chat' is not ready: replica 1 of 'chat' is sleeping"
    assert replicas["chat"].state == "sleeping" and replicas["chat"].generations == []


async def test_chat_renders_the_models_template_and_answers_as_the_assistant(client, replicas):
    response = await client.chat.completions.create(
        model="chat", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        max_tokens=4, temperature=0, extra_body={"stop_token_ids": [2]})
    [request] = replicas["chat"].generations
    assert request.stop_token_ids == (2,)
    rendered = "<s>[SYS]Be brief.[/SYS][USER]hi[/USER][ASSISTANT]"
    assert request.input_ids == tuple(train_bpe().encode(rendered, add_special_tokens=False).ids)
    [choice] = response.choices
    assert choice.message.role == "assistant" and choice.message.content == " and the quick brown"
    assert response.object == "chat.completion" and choice.finish_reason == "length"
    assert response.usage.completion_tokens == 4


async def test_a_chats_null_max_completion_tokens_leaves_max_tokens_in_force_as_vllm_reads_them(client, replicas):
    await client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                         extra_body={"max_completion_tokens": None})
    [request] = replicas["chat"].generations
    assert request.max_new_tokens == 3  # what the gateway reserved, not the rest of the context


async def test_a_model_without_a_chat_template_is_a_400_that_says_so(client, replicas):
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="plain", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.param == "model" and "has no chat template" in raised.value.message
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="chat", messages=[{"role": "wizard", "content": "hi"}])
    assert raised.value.param == "messages" and "messages[0].role" in raised.value.message
    assert replicas["plain"].generations == replicas["chat"].generations == []


async def test_streamed_completions_and_chat_add_up_to_the_plain_answer(client):
    plain = await client.completions.create(model="chat", prompt="Hello", max_tokens=8, stop=" fox")
    chunks = [c async for c in await client.completions.create(
        model="chat", prompt="Hello", max_tokens=8, stop=" fox", stream=True, stream_options={"include_usage": True})]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    messages = [{"role": "user", "content": "hi"}]
    whole = await client.chat.completions.create(model="chat", messages=messages, max_tokens=6, n=2)
    parts = [c async for c in await client.chat.completions.create(model="chat", messages=messages, max_tokens=6,
                                                                    n=2, stream=True)]
    for index in (0, 1):
        mine = [c.choices[0] for c in parts if c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == whole.choices[index].message.content
        assert mine[-1].finish_reason == "length"


async def test_a_stream_whose_client_goes_away_cancels_its_sequence(client, replicas):
    replicas["chat"].token_seconds = 0.02  # 30 tokens take 0.6 s: the client is gone long before the end
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        url = f"http://127.0.0.1:{client.server.port}/v1/completions"
        async with http.post(url, json={"model": "chat", "prompt": "hi", "stream": True, "max_tokens": 30}) as r:
            await r.content.readline()  # the first event, then hang up
    for _ in range(100):
        if replicas["chat"].cancelled:
            break
        await asyncio.sleep(0.01)
    assert replicas["chat"].cancelled == 1 and replicas["chat"].queued == 0
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        async with http.get(f"http://127.0.0.1:{client.server.port}/metrics") as response:
            scrape = await response.text()
    assert 'modelgrid_generations_cancelled_total{deployment="chat",reason="client"} 1.0' in scrape
    assert 'modelgrid_time_to_first_token_seconds_count{deployment="chat"} 1.0' in scrape
    assert 'modelgrid_queue_depth{deployment="chat"} 0.0' in scrape  # idle, yet present


async def test_a_generation_past_its_deadline_is_a_504_counted_as_a_timeout(client, replicas):
    replicas["chat"].fail_with = InferenceTimeout("the request's deadline passed after 0 generated tokens")
    with pytest.raises(openai.APIStatusError) as raised:
        await client.completions.create(model="chat", prompt="hi", max_tokens=4, extra_headers={
            "X-ModelGrid-Timeout": "0.5"})
    assert raised.value.status_code == 504 and "deadline passed" in raised.value.message
    [request] = replicas["chat"].generations
    assert 0.3 < request.deadline - time.monotonic() < 0.5
    scrape = client.server.app[METRICS].render().decode()
    assert 'modelgrid_generations_cancelled_total{deployment="chat",reason="timeout"} 1.0' in scrape


async def test_the_official_client_without_the_gateway_secret_gets_a_401(client, replicas):
    base_url = f"http://127.0.0.1:{client.server.port}/v1"
    async with openai.AsyncOpenAI(base_url=base_url, api_key="not-the-secret", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError) as raised:
            await stranger.completions.create(model="chat", prompt="Hello", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            await stranger.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 401 and raised.value.code == "invalid_gateway_secret"
    assert raised.value.body["message"].startswith("this agent serves only the ModelGrid console's gateway")
    assert raised.value.response.headers["WWW-Authenticate"] == "Bearer"
    assert replicas["chat"].generations == []


async def test_the_agents_default_generation_timeout_applies_when_a_request_names_none(replicas):
    class Source:
        def handles(self):
            return list(replicas.values())

    server = TestServer(make_app(Source(), auth=GatewayAuth(SECRET), generation_timeout=7), host="127.0.0.1")
    await server.start_server()
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=SECRET, max_retries=0) as c:
        await c.completions.create(model="chat", prompt="hi", max_tokens=2)
    await server.close()
    [request] = replicas["chat"].generations
    assert 6 < request.deadline - time.monotonic() <= 7
    args = build_parser().parse_args(["run", "--console", "http://c", "--generation-timeout", "30"])
    assert args.generation_timeout == 30.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--console", "http://c", "--generation-timeout", "0"])


async def test_ignore_eos_and_min_tokens_reach_the_worker(client, replicas):
    # vLLM's extensions, which GuideLLM sends for exact output lengths.
    await client.completions.create(model="chat", prompt="hi", max_tokens=8,
                                    extra_body={"ignore_eos": True, "min_tokens": 8})
    [request] = replicas["chat"].generations
    assert (request.ignore_eos, request.min_tokens) == (True, 8)
