"""Worker-side generation on the tiny demo Llama (imports torch)."""

import pytest

from agent.workers.generation_spec import GenerationRequest

torch = pytest.importorskip("torch")

PROMPT = (1, 42, 449, 601, 14)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from agent.workers.demo_models import build_tiny_llama

    path = build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


def run(model, **kwargs):
    from agent.workers.generation import generate

    return generate(model, GenerationRequest(PROMPT, **kwargs), eos_ids=())  # random weights: no early eos


def test_greedy_generation_matches_transformers_generate(model):
    result = run(model, max_new_tokens=12, temperature=0)
    with torch.inference_mode():
        reference = model.generate(
            torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert list(result.token_ids) == reference[0, len(PROMPT) :].tolist()
    assert result.finish_reason == "length" and len(result.token_ids) == 12


def test_seeded_sampling_repeats_itself_and_another_seed_differs(model):
    first = run(model, max_new_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    assert run(model, max_new_tokens=16, temperature=1.0, top_p=0.9, seed=7) == first
    assert run(model, max_new_tokens=16, temperature=1.0, top_p=0.9, seed=8) != first


def test_it_stops_on_a_stop_sequence_or_eos_and_leaves_it_out(model):
    from agent.workers.generation import generate

    tokens = run(model, max_new_tokens=10, temperature=0).token_ids
    stop = tokens[4:6]
    first_end = next(i + 2 for i in range(len(tokens) - 1) if tokens[i : i + 2] == stop)
    stopped = run(model, max_new_tokens=10, temperature=0, stop_sequences=(stop,))
    assert stopped.token_ids == tokens[: first_end - 2] and stopped.finish_reason == "stop"
    at_eos = generate(model, GenerationRequest(PROMPT, max_new_tokens=10, temperature=0), eos_ids={tokens[3]})
    assert at_eos.token_ids == tokens[: tokens.index(tokens[3])] and at_eos.finish_reason == "stop"


def test_a_token_id_outside_the_vocabulary_is_a_prompt_error(model):
    from agent.workers.generation import generate
    from agent.workers.generation_spec import PromptError

    with pytest.raises(PromptError, match="token id 5000, outside this model's range"):
        generate(model, GenerationRequest((1, 5000), max_new_tokens=2, temperature=0))
