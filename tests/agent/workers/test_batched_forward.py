"""Right-padded batches give each request what it gets alone, on the real tiny demo models (imports torch)."""

import numpy as np
import pytest

from agent.serving.batching import merge, split

torch = pytest.importorskip("torch")

REQUESTS = [[1, 42, 449], [1, 7, 8, 9, 10, 11], [3]]


def batched_and_alone(model, output):
    inputs = [{"input_ids": np.array([r])} for r in REQUESTS]
    lengths = [len(r) for r in REQUESTS]
    merged = merge(inputs, lengths)
    with torch.inference_mode():
        batched = {"out": output(model(**{k: torch.from_numpy(v) for k, v in merged.items()}), merged)}
        alone = [output(model(input_ids=torch.tensor([r])), {"attention_mask": np.ones((1, len(r)))}) for r in REQUESTS]
    return split(batched, [1] * len(REQUESTS), lengths), alone


def test_a_padded_causal_lm_batch_gives_each_request_its_own_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    from agent.workers.demo_models import build_tiny_llama

    model = AutoModelForCausalLM.from_pretrained(build_tiny_llama(tmp_path / "llama")).eval()
    parts, alone = batched_and_alone(model, lambda out, inputs: out.logits.numpy())
    for part, reference in zip(parts, alone, strict=True):
        assert part["out"].shape == reference.shape
        np.testing.assert_allclose(part["out"], reference, atol=1e-4)


def test_a_padded_encoder_batch_gives_each_request_its_own_embedding(tmp_path):
    from transformers import AutoModel

    from agent.workers.demo_models import build_tiny_bert

    def mean_pool(out, inputs):
        mask = torch.as_tensor(np.asarray(inputs["attention_mask"]), dtype=torch.float32).unsqueeze(-1)
        return ((out.last_hidden_state * mask).sum(1) / mask.sum(1)).numpy()

    model = AutoModel.from_pretrained(build_tiny_bert(tmp_path / "bert")).eval()
    parts, alone = batched_and_alone(model, mean_pool)
    for part, reference in zip(parts, alone, strict=True):
        np.testing.assert_allclose(part["out"], reference, atol=1e-4)
