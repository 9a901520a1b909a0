"""Cold load in-process: bit-identical to from_pretrained, with progress in bytes read from the files."""

import pytest
import torch
import transformers

from agent.artifacts import ArtifactError, read_safetensors_header
from agent.workers import loader
from agent.workers.demo_models import build_tiny_bert, build_tiny_llama
from tests.model_files import with_reshaped_tensor

IDS = torch.tensor([[1, 5, 42, 7, 300, 2], [3, 3, 9, 100, 8, 1]])


def file_bytes(directory) -> int:
    return sum(t.nbytes for f in sorted(directory.glob("*.safetensors")) for t in read_safetensors_header(f))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    llama = build_tiny_llama(root / "tiny-llama")
    sharded = root / "sharded-llama"
    transformers.LlamaForCausalLM.from_pretrained(llama).save_pretrained(sharded, max_shard_size="300KB")
    return {"llama": llama, "bert": build_tiny_bert(root / "tiny-bert"), "sharded": sharded}


@pytest.mark.parametrize(("name", "task", "cls"), [("llama", "causal-lm", "AutoModelForCausalLM"),
                                                   ("sharded", "causal-lm", "AutoModelForCausalLM"),
                                                   ("bert", "encoder", "AutoModel")])
def test_it_loads_exactly_what_from_pretrained_loads(models, name, task, cls):
    progress = []
    model, stats = loader.load_to_device(models[name], task, torch.float32, torch.device("cpu"),
                                         lambda done, total: progress.append((done, total)))
    reference = getattr(transformers, cls).from_pretrained(models[name], dtype=torch.float32).eval()
    assert not model.training and type(model) is type(reference)
    with torch.inference_mode():
        out, expected = model(input_ids=IDS), reference(input_ids=IDS)
    key = "logits" if task == "causal-lm" else "last_hidden_state"
    assert torch.equal(out[key], expected[key])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values(),
                                                 strict=True))
    size = file_bytes(models[name])
    assert stats.bytes == size and stats.seconds > 0 and stats.bandwidth > 0
    assert progress[-1] == (size, size) and [d for d, _ in progress] == sorted(d for d, _ in progress)
    if name == "sharded":
        assert len(list(models[name].glob("*.safetensors"))) > 1


def test_it_converts_to_the_serving_dtype_like_from_pretrained(models):
    model, stats = loader.load_to_device(models["llama"], "causal-lm", torch.bfloat16, torch.device("cpu"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(models["llama"], dtype=torch.bfloat16).eval()
    assert model.dtype == torch.bfloat16 and stats.bytes == file_bytes(models["llama"])  # float32 bytes read
    with torch.inference_mode():
        assert torch.equal(model(input_ids=IDS).logits, reference(input_ids=IDS).logits)


def test_progress_is_reported_every_five_percent_and_at_the_end():
    seen = []
    # A frozen clock: only the byte steps count.
    throttle = loader.Throttle(1000, lambda done, total: seen.append(done), clock=lambda: 100.0)
    for _ in range(333):
        throttle.add(3)
    throttle.add(1)
    assert seen[-1] == 1000 and len(seen) == 20  # 51, 102, ... about one per 5% of the bytes, then 1000
    assert all(b - a >= 50 for a, b in zip(seen[:-2], seen[1:-1], strict=True))


def test_progress_is_also_reported_when_time_passes():
    now = [0.0]
    seen = []
    throttle = loader.Throttle(10**9, lambda done, total: seen.append(done), clock=lambda: now[0])
    throttle.add(1)
    now[0] = 0.3  # past the 250 ms interval, far below 5% of the bytes
    throttle.add(1)
    assert seen == [2]


def file_mappings(path) -> list[tuple[int, int]]:
    with open("/proc/self/maps") as maps:
        return [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in maps if str(path) in line]


def test_on_the_cpu_the_weights_are_the_process_own_memory_not_a_view_of_the_file(models):
    model, _ = loader.load_to_device(models["llama"], "causal-lm", torch.float32, torch.device("cpu"))
    mapped = file_mappings(models["llama"] / "model.safetensors")
    inside = [n for n, p in model.named_parameters() if any(a <= p.data_ptr() < b for a, b in mapped)]
    assert inside == []  # resident once ready, and independent of the file and the page cache


def test_progress_from_many_threads_never_goes_backwards():
    import threading
    import time

    seen = []

    def report(done, total):
        time.sleep(0)  # let another thread run between counting and reporting, if it could
        seen.append(done)

    throttle = loader.Throttle(8 * 400, report, clock=lambda: 100.0)
    threads = [threading.Thread(target=lambda: [throttle.add(1) for _ in range(400)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) >= 10 and seen == sorted(seen) and seen[-1] == 8 * 400


def test_a_tensor_the_architecture_cannot_take_is_named_with_both_shapes(models, tmp_path):
    # A norm's weight: no config-only check (agent.artifacts.weight_shapes) knows its shape, the model does.
    mismatched = with_reshaped_tensor(models["llama"], tmp_path / "mismatched", "model.layers.1.input_layernorm.weight",
                                      (8, 8))
    with pytest.raises(ArtifactError) as refused:
        loader.load_to_device(mismatched, "causal-lm", torch.float32, torch.device("cpu"))
    assert str(refused.value) == (f"{mismatched}: tensor 'model.layers.1.input_layernorm.weight' has shape [8, 8] in "
                                  "the checkpoint, but LlamaForCausalLM built from config.json expects [64]")


def test_many_mismatches_name_the_first_three_and_count_the_rest():
    mismatched = [(f"layers.{i}.norm.weight", (8, 8), (64,)) for i in range(5)]
    text = loader.mismatch_text("/m", "LlamaForCausalLM", mismatched)
    assert text.count("has shape [8, 8] in the checkpoint") == 3 and text.endswith("; and 2 more")
    assert text.startswith("/m: tensor 'layers.0.norm.weight' has shape [8, 8]")
