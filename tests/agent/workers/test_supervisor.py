"""Real worker processes (spawned, importing torch), shared by the module: they start in parallel."""

import asyncio
import os
import shutil
import signal
import time
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest
import pytest_asyncio

from agent.workers.demo_models import build_tiny_bert, build_tiny_llama
from agent.workers.spec import WorkerSpec
from agent.workers.supervisor import InferenceInputError, Supervisor, WorkerHandle, WorkerUnavailable

pytestmark = pytest.mark.asyncio(loop_scope="module")

IDS = np.array([[1, 5, 42, 7, 300, 2], [3, 3, 9, 100, 8, 1]], dtype=np.int64)


async def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class Workers:
    supervisor: Supervisor
    paths: dict
    events: list = field(default_factory=list)

    def __getitem__(self, replica_id: int) -> WorkerHandle:
        return self.supervisor.get(replica_id)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    llama = build_tiny_llama(root / "tiny-llama")
    bert = build_tiny_bert(root / "tiny-bert")
    # A model whose weights file was cut short: the header promises more bytes than are there.
    broken = root / "broken"
    shutil.copytree(llama, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    return {"llama": llama, "bert": bert, "broken": broken}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workers(paths):
    events = []
    supervisor = Supervisor(on_change=lambda h: events.append((h.spec.replica_id, h.state, h.reason)))
    specs = [
        WorkerSpec(1, str(paths["llama"]), "causal-lm", deployment="chat"),
        WorkerSpec(2, str(paths["bert"]), "encoder", deployment="embed"),
        WorkerSpec(3, str(paths["broken"]), "causal-lm", deployment="broken"),
        WorkerSpec(4, str(paths["llama"]), "causal-lm", deployment="victim"),
        WorkerSpec(5, str(paths["llama"]), "causal-lm", deployment="to-stop"),
    ]
    supervisor.start_spares()  # none: these tests start their workers cold
    for spec in specs:
        supervisor.start(spec)
    try:
        await until(lambda: all(h.state in ("ready", "failed") for h in supervisor.handles()), 120, "workers to load")
        yield Workers(supervisor, paths, events)
    finally:
        await supervisor.stop_all()


def reference_model(path, cls_name: str):
    import torch
    import transformers

    return getattr(transformers, cls_name).from_pretrained(path, dtype=torch.float32).eval()


async def test_it_loads_a_causal_lm_and_reports_ready_with_measured_bytes(workers):
    chat = workers[1]
    assert chat.state == "ready", chat.reason
    assert (1, "loading", "") in workers.events and (1, "ready", "") in workers.events
    # On the CPU a replica measures its parameter and buffer bytes.
    model = reference_model(workers.paths["llama"], "AutoModelForCausalLM")
    tensors = [*model.parameters(), *model.buffers()]
    assert chat.measured_bytes == sum(t.numel() * t.element_size() for t in tensors)
    assert chat.info["output_dim"] == 1024
    assert chat.status().pid == chat.pid and psutil.pid_exists(chat.pid)
    assert workers.supervisor.spares.spares() == []  # warm_spares defaults to 0 here: started cold


async def test_its_logits_equal_exactly_what_transformers_computes(workers):
    import torch

    outputs = await workers[1].infer({"input_ids": IDS})
    model = reference_model(workers.paths["llama"], "AutoModelForCausalLM")
    with torch.inference_mode():
        expected = model(input_ids=torch.from_numpy(IDS)).logits
    assert outputs["logits"].dtype == np.float32 and outputs["logits"].shape == (2, 6, 1024)
    assert torch.equal(torch.from_numpy(outputs["logits"]), expected)


async def test_it_passes_the_attention_mask_through(workers):
    import torch

    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=np.int64)
    outputs = await workers[1].infer({"input_ids": IDS, "attention_mask": mask})
    model = reference_model(workers.paths["llama"], "AutoModelForCausalLM")
    with torch.inference_mode():
        expected = model(input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(mask)).logits
    assert torch.equal(torch.from_numpy(outputs["logits"]), expected)


async def test_it_answers_concurrent_requests_each_with_its_own_result(workers):
    batches = [np.array([[i, i + 1, i + 2]], dtype=np.int64) for i in range(8)]
    results = await asyncio.gather(*(workers[1].infer({"input_ids": b}) for b in batches))
    for batch, result in zip(batches, results, strict=True):
        alone = await workers[1].infer({"input_ids": batch})
        assert np.array_equal(result["logits"], alone["logits"])
    assert workers[1].queued == 0


async def test_its_encoder_embeddings_are_mean_pooled_and_normalised(workers):
    import torch

    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=np.int64)
    outputs = await workers[2].infer({"input_ids": IDS, "attention_mask": mask})
    model = reference_model(workers.paths["bert"], "AutoModel")
    with torch.inference_mode():
        hidden = model(input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(mask)).last_hidden_state
    expected = []
    for row in range(2):
        kept = hidden[row, : int(mask[row].sum())]
        mean = kept.mean(dim=0)
        expected.append(mean / mean.norm())
    embeddings = torch.from_numpy(outputs["embeddings"])
    assert embeddings.shape == (2, 64)
    assert torch.allclose(embeddings, torch.stack(expected), rtol=0, atol=1e-6)
    assert torch.allclose(embeddings.norm(dim=1), torch.ones(2), atol=1e-6)


async def test_it_refuses_token_ids_outside_the_vocabulary_as_a_client_error(workers):
    with pytest.raises(InferenceInputError, match=r"holds 5000, outside this model's range \[0, 1024\)"):
        await workers[1].infer({"input_ids": np.array([[1, 5000]], dtype=np.int64)})
    assert workers[1].state == "ready"


async def test_a_worker_given_a_broken_model_reports_failed_with_a_reason(workers):
    broken = workers[3]
    assert broken.state == "failed"
    assert "model.safetensors" in broken.reason and "run past the end of the file" in broken.reason
    # "failed" arrives just before the process exits: wait for the exit to be seen.
    await until(lambda: broken.exitcode is not None, 10, "the failed worker to exit")
    assert broken.exitcode == 1
    assert broken.status().state == "failed" and broken.status().reason == broken.reason
    with pytest.raises(WorkerUnavailable, match="is failed"):
        await broken.infer({"input_ids": IDS}, timeout=5)


async def test_a_killed_worker_is_reported_failed_and_its_request_gets_an_error(workers):
    victim = workers[4]
    assert victim.state == "ready"
    os.kill(victim.pid, signal.SIGSTOP)  # it cannot answer, so the request is surely in flight
    request = asyncio.create_task(victim.infer({"input_ids": IDS}, timeout=30))
    await asyncio.sleep(0.2)
    assert not request.done()
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(WorkerUnavailable, match="killed by signal SIGKILL"):
        await asyncio.wait_for(request, 10)
    assert victim.state == "failed" and "killed by signal SIGKILL while serving" in victim.reason
    assert (4, "failed", victim.reason) in workers.events


async def test_stopping_a_worker_leaves_no_process(workers):
    handle = workers[5]
    pid = handle.pid
    assert handle.state == "ready" and psutil.pid_exists(pid)
    await workers.supervisor.stop(5)
    assert handle.state == "stopped" and workers.supervisor.get(5) is None
    assert not psutil.pid_exists(pid)
    assert (5, "stopped", "") in workers.events


async def test_stopping_a_worker_while_it_loads_leaves_no_process(workers):
    supervisor = Supervisor()
    handle = supervisor.start(WorkerSpec(9, str(workers.paths["llama"]), "causal-lm"))
    await asyncio.sleep(0.3)
    await supervisor.stop_all()
    assert handle.state == "stopped" and not psutil.pid_exists(handle.pid)
