"""/v1/completions with echo and logprobs over a real worker (the demo tiny-llama), driven by the official openai client
as `lm_eval --model local-completions` drives it for loglikelihood tasks: the prompt's log probabilities equal a plain
transformers forward of the same model."""

import pytest
import pytest_asyncio

from agent.workers.demo_models import build_tiny_llama
from tests.agent.serving.real_worker import real_agent

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET = "gw-secret-for-real-echo-tests"
CONTEXT, CONTINUATION = "The quick brown fox jumps over the", " lazy dog"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def reference(model_dir):
    """The same model in this process, and its tokenizer."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    return model, Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(model_dir):
    async with real_agent(model_dir, "lm", SECRET) as c:
        yield c


def log_softmax(model, ids):
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # row p: the distribution of the token after position p


async def test_echo_with_no_new_tokens_gives_the_prompts_log_probabilities_of_a_plain_forward(client, reference):
    model, tokenizer = reference
    prompt = CONTEXT + CONTINUATION
    ids = tokenizer.encode(prompt).ids
    response = await client.completions.create(model="lm", prompt=prompt, echo=True, logprobs=5, max_tokens=0)
    [choice] = response.choices
    assert choice.text == prompt and choice.finish_reason == "length"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(ids), 0)
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == len(ids)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    table = log_softmax(model, ids)
    for position in range(1, len(ids)):
        row = table[position - 1]
        assert logprobs.token_logprobs[position] == pytest.approx(float(row[ids[position]]), abs=1e-4)
        top = logprobs.top_logprobs[position]
        best = torch.topk(row, 5).values.tolist()
        # The five best, and the prompt's own token when it is not among them.
        assert len(top) in (5, 6) and top[logprobs.tokens[position]] == logprobs.token_logprobs[position]
        assert sorted(top.values(), reverse=True)[:5] == pytest.approx(best, abs=1e-4)
    for token, offset in zip(logprobs.tokens[1:], logprobs.text_offset[1:], strict=True):
        assert prompt[offset:].startswith(token)


async def test_a_loglikelihood_request_as_lm_eval_sends_it_scores_the_continuation(client, reference):
    model, tokenizer = reference
    context_ids = tokenizer.encode(CONTEXT).ids
    ids = tokenizer.encode(CONTEXT + CONTINUATION).ids
    # lm-eval's local-completions: token ids, echo, one new token, greedy, logprobs=1; it sums the continuation's.
    response = await client.completions.create(model="lm", prompt=[ids], echo=True, logprobs=1, max_tokens=1,
                                               temperature=0, seed=1234)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(ids) + 1
    table = log_softmax(model, ids)
    continuation = range(len(context_ids), len(ids))
    expected = sum(float(table[p - 1, ids[p]]) for p in continuation)
    assert sum(logprobs.token_logprobs[len(context_ids) : len(ids)]) == pytest.approx(expected, abs=1e-3)
    greedy = all(max(logprobs.top_logprobs[p].values()) == logprobs.token_logprobs[p]
                 for p in continuation)
    assert greedy == all(int(table[p - 1].argmax()) == ids[p] for p in continuation)
    # The new token is the greedy one after the whole prompt.
    assert logprobs.token_logprobs[-1] == pytest.approx(float(table[-1].max()), abs=1e-4)


async def test_a_streamed_echo_sends_the_prompt_first_and_adds_up_to_the_plain_answer(client):
    kwargs = dict(model="lm", prompt=CONTEXT, echo=True, logprobs=3, max_tokens=6, temperature=0)
    whole = (await client.completions.create(**kwargs)).choices[0]
    chunks = [c async for c in await client.completions.create(stream=True, **kwargs)]
    assert chunks[0].choices[0].text == CONTEXT and chunks[0].choices[0].logprobs.token_logprobs[0] is None
    assert "".join(c.choices[0].text for c in chunks) == whole.text and whole.text.startswith(CONTEXT)
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        streamed = sum((getattr(c.choices[0].logprobs, field) for c in chunks), [])
        assert streamed == getattr(whole.logprobs, field), field
