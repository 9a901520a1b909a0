"""Log probabilities in /v1/completions and /v1/chat/completions, and /v1/completions echoing its prompt (what
`lm_eval --model local-completions` scores loglikelihood tasks with), driven by the official openai client over a
scripted replica whose log probabilities are known (no torch)."""

import json

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from agent.serving import make_app
from agent.serving.auth import GatewayAuth
from agent.workers.demo_tokenizer import train_bpe
from agent.workers.generation_spec import GenerationResult, Token, TokenLogprob
from agent.workers.spec import WorkerSpec

SECRET = "gw-secret-for-logprob-tests"
BPE = train_bpe()
GENERATED = BPE.encode(" the quick brown fox", add_special_tokens=False).ids
# Two byte-level pieces ("Ã" is byte 0xC3, "¼" byte 0xBC) that each decode to U+FFFD on their own.
HALF_A, HALF_B = BPE.token_to_id("Ã"), BPE.token_to_id("¼")
OTHERS = BPE.encode(" dog cat", add_special_tokens=False).ids + [BPE.token_to_id("e")]
TOP = ((HALF_A, -0.5), (HALF_B, -0.7), (OTHERS[0], -1.0), (OTHERS[1], -1.25), (OTHERS[2], -1.5))
CHOSEN_LOGPROB = -2.0


def chosen_lp(position):
    return CHOSEN_LOGPROB - position / 8


def prompt_lp(position):
    return -0.25 * position


class ScriptedReplica:
    """A causal LM replica that always continues with GENERATED; each token's log probability is scripted, and its top
    alternatives are TOP (or, for a token that is itself in TOP, TOP with its own log probability)."""

    def __init__(self, path):
        self.spec = WorkerSpec(1, str(path), "causal-lm", deployment="lm")
        self.state, self.reason, self.adapters = "ready", "", set()
        self.info = {"vocab_size": 1024}
        self.queued = 0
        self.generations = []
        self.token_seconds = 0
        self.neg_inf = False

    def generate(self, request):
        self.generations.append(request)
        return ScriptedStream(request, self)


class ScriptedStream:
    def __init__(self, request, replica):
        self.request, self.replica = request, replica
        self.ids = GENERATED[: request.max_new_tokens]
        self.sent = 0
        self.result = None

    def prompt_logprobs(self):
        count = self.request.prompt_logprobs
        if count is None:
            return None
        ids = self.request.input_ids
        return (None,) + tuple(TokenLogprob(prompt_lp(i), (((ids[i], prompt_lp(i)),) + TOP)[:count])
                               for i in range(1, len(ids)))

    def logprob(self, position):
        if self.request.logprobs is None:
            return None
        value = float("-inf") if self.replica.neg_inf else chosen_lp(position)
        return TokenLogprob(value, TOP[: self.request.logprobs])

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.sent < len(self.ids):
            first = self.sent == 0
            token = Token(1, self.ids[self.sent], self.logprob(self.sent), self.prompt_logprobs() if first else None)
            self.sent += 1
            return token
        self.result = GenerationResult(tuple(self.ids), "length", None, None if self.ids else self.prompt_logprobs())
        raise StopAsyncIteration

    def close(self):
        if self.result is None:
            self.result = GenerationResult((), "stop")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "lm"
    path.mkdir()
    BPE.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64}))
    template = {"bos_token": "<s>", "chat_template": "{{ bos_token }}{{ messages[0].content }}"}
    (path / "tokenizer_config.json").write_text(json.dumps(template))
    return path


@pytest.fixture
def replica(model_dir):
    return ScriptedReplica(model_dir)


@pytest.fixture
async def client(replica):
    class Source:
        def handles(self):
            return [replica]

    server = TestServer(make_app(Source(), auth=GatewayAuth(SECRET)), host="127.0.0.1")
    await server.start_server()
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=SECRET, max_retries=0) as c:
        c.server = server
        yield c
    await server.close()


def text_of(token_id):
    return BPE.decode([token_id], skip_special_tokens=False)


# --- top_logprobs -------------------------------------------------------------------------------------------------


async def test_completion_top_logprobs_keep_all_n_alternatives_and_the_chosen_token(client):
    response = await client.completions.create(model="lm", prompt="Hello", max_tokens=2, logprobs=5)
    logprobs = response.choices[0].logprobs
    for position, top in enumerate(logprobs.top_logprobs):
        # The two half characters keep an entry each, spelled by their bytes as OpenAI does; the chosen token (not
        # among the five best here) is added, as OpenAI and vLLM do: five and one.
        assert top == {"bytes:\\xc3": -0.5, "bytes:\\xbc": -0.7, text_of(OTHERS[0]): -1.0, text_of(OTHERS[1]): -1.25,
                       text_of(OTHERS[2]): -1.5, logprobs.tokens[position]: chosen_lp(position)}
    assert logprobs.tokens == [text_of(t) for t in GENERATED[:2]]
    assert logprobs.token_logprobs == [chosen_lp(0), chosen_lp(1)]


async def test_completion_top_logprobs_of_zero_alternatives_still_hold_the_chosen_token(client):
    response = await client.completions.create(model="lm", prompt="Hello", max_tokens=1, logprobs=0)
    assert response.choices[0].logprobs.top_logprobs == [{text_of(GENERATED[0]): chosen_lp(0)}]


async def test_the_text_offsets_of_the_completion_are_where_each_token_starts_in_its_text(client):
    response = await client.completions.create(model="lm", prompt="Hello", max_tokens=4, logprobs=1)
    choice = response.choices[0]
    assert choice.text == " the quick brown fox"
    assert [choice.text[o:].startswith(t) for o, t in zip(choice.logprobs.text_offset, choice.logprobs.tokens,
                                                            strict=True)] == [True] * 4
    assert choice.logprobs.text_offset == [0, 4, 10, 16]


async def test_chat_top_logprobs_are_exactly_n_best_first_with_each_tokens_own_bytes(client):
    response = await client.chat.completions.create(
        model="lm", messages=[{"role": "user", "content": "Hello"}], max_tokens=2, logprobs=True, top_logprobs=5)
    for entry in response.choices[0].logprobs.content:
        top = [(t.token, t.bytes, t.logprob) for t in entry.top_logprobs]
        assert top[:2] == [("\\xc3", [0xC3], -0.5), ("\\xbc", [0xBC], -0.7)]
        assert [lp for _, _, lp in top] == [lp for _, lp in TOP]
        assert entry.bytes == list(entry.token.encode())


async def test_a_log_probability_of_minus_infinity_is_sent_as_minus_9999(client, replica):
    replica.neg_inf = True
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {SECRET}"}) as http:
        url = f"http://127.0.0.1:{client.server.port}/v1/completions"
        async with http.post(url, json={"model": "lm", "prompt": "Hi", "max_tokens": 1, "logprobs": 1}) as r:
            body = json.loads(await r.text(), parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert body["choices"][0]["logprobs"]["token_logprobs"] == [-9999.0]


# --- echo ---------------------------------------------------------------------------------------------------------


async def test_echo_with_no_new_tokens_returns_the_prompt_with_its_log_probabilities(client, replica):
    prompt = "Hello world"
    response = await client.completions.create(model="lm", prompt=prompt, echo=True, logprobs=5, max_tokens=0)
    [request] = replica.generations
    ids = BPE.encode(prompt).ids  # <s> in front
    assert (request.max_new_tokens, request.prompt_logprobs, request.logprobs) == (0, 5, 5)
    [choice] = response.choices
    assert choice.text == prompt and choice.finish_reason == "length"
    assert choice.logprobs.tokens == [text_of(i) for i in ids]
    assert choice.logprobs.token_logprobs == [None] + [prompt_lp(i) for i in range(1, len(ids))]
    assert choice.logprobs.top_logprobs[0] is None
    for position in range(1, len(ids)):
        top = choice.logprobs.top_logprobs[position]
        assert len(top) == 5 and top[text_of(ids[position])] == prompt_lp(position)
    # <s> is no text: it and "H" both start at 0.
    assert choice.logprobs.text_offset == [0, 0, 1, 5]
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(ids), 0)


async def test_echo_puts_the_prompt_before_the_completion_and_its_offsets_count_on(client):
    response = await client.completions.create(model="lm", prompt="Hello world", echo=True, logprobs=1,
                                               max_tokens=2)
    choice = response.choices[0]
    assert choice.text == "Hello world the quick"
    assert choice.logprobs.tokens == ["<s>", "H", "ello", " world", " the", " quick"]
    assert choice.logprobs.token_logprobs[4:] == [chosen_lp(0), chosen_lp(1)]
    assert choice.logprobs.text_offset == [0, 0, 1, 5, 11, 15]
    assert response.usage.completion_tokens == 2


async def test_echo_takes_token_ids_and_several_prompts(client, replica):
    ids = BPE.encode("Hello world").ids
    response = await client.completions.create(model="lm", prompt=[ids, "Hi"], echo=True, logprobs=0, max_tokens=0)
    assert [c.text for c in response.choices] == ["Hello world", "Hi"]
    assert response.choices[0].logprobs.tokens == [text_of(i) for i in ids]
    assert response.choices[0].logprobs.top_logprobs[1] == {text_of(ids[1]): prompt_lp(1)}
    assert response.usage.prompt_tokens == len(ids) + len(BPE.encode("Hi").ids)


async def test_echo_without_logprobs_returns_the_prompt_and_asks_for_none(client, replica):
    response = await client.completions.create(model="lm", prompt="Hello", echo=True, max_tokens=1)
    assert response.choices[0].text == "Hello the" and response.choices[0].logprobs is None
    assert replica.generations[0].prompt_logprobs is None


async def test_a_streamed_echo_sends_the_prompt_and_its_log_probabilities_first(client):
    kwargs = dict(model="lm", prompt="Hello world", echo=True, logprobs=2, max_tokens=3)
    whole = (await client.completions.create(**kwargs)).choices[0]
    chunks = [c async for c in await client.completions.create(stream=True, **kwargs)]
    first = chunks[0].choices[0]
    assert first.text == "Hello world"
    assert first.logprobs.tokens == ["<s>", "H", "ello", " world"] and first.logprobs.token_logprobs[0] is None
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert sum((getattr(c.choices[0].logprobs, field) for c in chunks), []) == getattr(whole.logprobs, field)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_a_streamed_echo_of_no_new_tokens_is_the_prompt_then_the_end(client):
    chunks = [c async for c in await client.completions.create(model="lm", prompt="Hi", echo=True, logprobs=1,
                                                               max_tokens=0, stream=True)]
    assert "".join(c.choices[0].text for c in chunks) == "Hi" and chunks[0].choices[0].text == "Hi"
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("call", "param", "message"),
    [
        (dict(prompt="hi", max_tokens=0), "max_tokens", "'max_tokens' must be an integer >= 1"),
        (dict(prompt="hi", echo="yes"), "echo", "'echo' must be true or false"),
        (dict(prompt="hi", max_tokens=-1, echo=True), "max_tokens", "'max_tokens' must be an integer >= 0"),
    ],
)
async def test_a_bad_echo_request_is_a_400_naming_the_parameter(client, call, param, message):
    with pytest.raises(openai.BadRequestError) as raised:
        await client.completions.create(model="lm", **call)
    assert raised.value.param == param and message in raised.value.message


async def test_chat_still_refuses_echo(client, replica):
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="lm", messages=[{"role": "user", "content": "hi"}],
                                             extra_body={"echo": True})
    assert raised.value.param == "echo" and replica.generations == []
