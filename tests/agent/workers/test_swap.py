"""Sleep and wake in-process on the CPU: the same code path a CUDA worker runs, checked bit for bit."""

import numpy as np
import pytest
import torch
import transformers

from agent.workers.memory_probe import weights_bytes
from agent.workers.swap import WeightSwap, pin, unpin

IDS = torch.tensor([[1, 5, 42, 7, 300, 2]])


def tiny_llama(tie: bool = False) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=tie)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=IDS).logits


def registered(model) -> list[torch.Tensor]:
    return [t for m in model.modules() for t in [*m._parameters.values(), *m._buffers.values()] if t is not None]


def test_sleep_releases_every_weight_and_wake_restores_them_bit_exact():
    model = tiny_llama()
    expected, state = logits(model), {k: v.clone() for k, v in model.state_dict().items()}
    held = weights_bytes(model)
    swap = WeightSwap(model, torch.device("cpu"))

    slept = swap.sleep()
    assert swap.asleep and slept.direction == "sleep"
    assert all(t.numel() == 0 and t.untyped_storage().nbytes() == 0 for t in registered(model))
    assert held <= swap.host_bytes == slept.bytes < held + 256 * len(registered(model))

    woke = swap.wake()
    assert not swap.asleep and swap.host_bytes == 0 and woke.bytes == slept.bytes
    assert torch.equal(logits(model), expected)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_tied_weights_and_shared_buffers_stay_shared_after_a_wake():
    model = tiny_llama(tie=True)
    shared = torch.arange(4.0)
    model.model.register_buffer("shared_a", shared, persistent=False)
    model.lm_head.register_buffer("shared_b", shared, persistent=False)
    embed = model.model.embed_tokens.weight
    assert model.lm_head.weight is embed
    expected = logits(model)
    swap = WeightSwap(model, torch.device("cpu"))
    swap.sleep()
    swap.wake()
    assert model.lm_head.weight is embed and model.model.embed_tokens.weight is embed  # the same Parameter
    assert model.model.shared_a is model.lm_head.shared_b and torch.equal(model.model.shared_a, torch.arange(4.0))
    assert torch.equal(logits(model), expected)


def test_it_sleeps_and_wakes_again_and_again_without_growing():
    model = tiny_llama()
    expected = logits(model)
    swap = WeightSwap(model, torch.device("cpu"))
    sizes = []
    for _ in range(3):
        sizes.append(swap.sleep().bytes)
        assert swap.sleep().seconds == 0  # asleep already: nothing moves
        swap.wake()
        assert torch.equal(logits(model), expected)
    # After the first wake every weight lives in one block, which later sleeps copy whole.
    assert sizes[1] == sizes[2] <= sizes[0]
    assert swap.wake().bytes == 0  # awake already


def test_views_keep_their_offsets_and_strides():
    module = torch.nn.Module()
    base = torch.arange(24, dtype=torch.float64)
    module.register_buffer("whole", base)
    module.register_buffer("view", base[4:16].view(3, 4).t())  # a transposed view into the same storage
    swap = WeightSwap(module, torch.device("cpu"))
    swap.sleep()
    swap.wake()
    assert module.view.stride() == (1, 4) and torch.equal(module.view, torch.arange(4, 16.0).view(3, 4).t())
    assert module.view.untyped_storage().data_ptr() == module.whole.untyped_storage().data_ptr()
    np.testing.assert_array_equal(module.whole.numpy(), np.arange(24.0))


def test_a_sleeping_model_refuses_inference_in_the_worker_runtime(tmp_path):
    from agent.workers.demo_models import build_tiny_llama
    from agent.workers.runtime import load
    from agent.workers.spec import WorkerSpec

    model = load(WorkerSpec(1, str(build_tiny_llama(tmp_path / "llama")), "causal-lm"))
    ids = {"input_ids": IDS.numpy()}
    before = model.infer(ids)["logits"]
    held = weights_bytes(model.model)
    slept = model.sleep()
    assert slept["direction"] == "sleep" and slept["host_bytes"] >= held
    with pytest.raises(RuntimeError, match="asleep"):
        model.infer(ids)
    woke = model.wake()
    assert woke["direction"] == "wake" and woke["host_bytes"] == 0
    assert np.array_equal(model.infer(ids)["logits"], before)


class FakeCudart:
    def __init__(self, code, calls):
        self.code, self.calls = code, calls

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append(("register", ptr, size, flags))
        return self.code

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0

    def cudaGetLastError(self):
        self.calls.append(("clear",))
        return 0


def test_the_host_copy_is_page_locked_at_its_exact_size_and_a_refusal_leaves_it_pageable(monkeypatch):
    calls = []
    host = torch.empty(1000, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart(0, calls))
    assert pin(host) and calls == [("register", host.data_ptr(), 1000, 1)]  # 1000, not rounded to 1024
    unpin(host)
    assert calls[-1] == ("unregister", host.data_ptr())
    calls.clear()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart(712, calls))  # cudaErrorHostMemoryAlreadyRegistered
    assert not pin(host) and calls[-1] == ("clear",)


def test_a_wake_leaves_unlocking_its_page_locked_copy_until_after_its_answer(monkeypatch):
    # On CUDA the host copy is page-locked; unlocking it took 37 ms of an 84 ms wake (2 GiB, H100), so the wake
    # answers first and the worker's after_reply unlocks. Here on the CPU the lock is the fake cudart's.
    calls = []
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart(0, calls))
    model = tiny_llama()
    expected = logits(model)
    swap = WeightSwap(model, torch.device("cpu"))
    swap.sleep()
    host = swap._host.data_ptr()
    swap._pinned = True  # as sleep() leaves it on CUDA
    woke = swap.wake()
    assert woke.pinned and not swap.asleep and calls == []  # answered with the buffer still locked
    assert torch.equal(logits(model), expected)
    swap.release_host()
    assert calls == [("unregister", host)]
    swap.release_host()  # once only
    assert calls == [("unregister", host)]

    swap.sleep()
    swap._pinned = True
    swap.wake()
    swap.sleep()  # asleep again before the wake's after_reply: the old buffer is unlocked first
    assert calls[-1][0] == "unregister" and len(calls) == 2


def test_the_worker_releases_the_host_copy_once_a_wake_is_answered(monkeypatch):
    # LoadedModel.after_reply is what the worker process runs after every command's answer: after a wake it must
    # unlock the host copy, or a CUDA replica would keep a page-locked copy of its weights until its next sleep.
    from types import SimpleNamespace

    from agent.workers.runtime import LoadedModel

    released = []
    model = SimpleNamespace(swap=SimpleNamespace(release_host=lambda: released.append(1)),
                            device=torch.device("cpu"))
    LoadedModel.after_reply(model, "infer")
    LoadedModel.after_reply(model, "sleep")
    assert released == []
    LoadedModel.after_reply(model, "wake")
    assert released == [1]


def test_a_failed_unlock_is_logged_and_its_cuda_error_cleared(monkeypatch, caplog):
    calls = []

    class Refusing(FakeCudart):
        def cudaHostUnregister(self, ptr):
            self.calls.append(("unregister", ptr))
            return 713  # cudaErrorHostMemoryNotRegistered

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Refusing(0, calls))
    host = torch.empty(64, dtype=torch.uint8)
    unpin(host)
    assert calls == [("unregister", host.data_ptr()), ("clear",)]
    assert "cudaHostUnregister of a 64-byte host copy failed (CUDA error 713)" in caplog.text
