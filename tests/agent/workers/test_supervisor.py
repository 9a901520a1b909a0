"""Real worker processes (spawned, importing torch), shared by the module: they start in parallel."""

import asyncio
import os
import shutil
import signal
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest
import pytest_asyncio

from agent.artifacts import read_safetensors_header
from agent.workers.demo_models import build_tiny_bert, build_tiny_llama
from agent.workers.spec import WorkerSpec
from agent.workers.supervisor import (
    InferenceInputError,
    InferenceOutOfMemory,
    Supervisor,
    WorkerHandle,
    WorkerUnavailable,
)
from tests.model_files import with_reshaped_tensor
from tests.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

IDS = np.array([[1, 5, 42, 7, 300, 2], [3, 3, 9, 100, 8, 1]], dtype=np.int64)


MIB = 1 << 20
HEARTBEAT_TIMEOUT = 1.5


@dataclass
class Workers:
    supervisor: Supervisor
    paths: dict
    events: list = field(default_factory=list)
    progress: list = field(default_factory=list)

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
    # A checkpoint with a norm's weight in another shape than the architecture's (config.json is unchanged).
    mismatched = with_reshaped_tensor(llama, root / "mismatched", "model.norm.weight", (8, 8))
    return {"llama": llama, "bert": bert, "broken": broken, "wide": build_wide_llama(root / "wide-llama"),
            "mismatched": mismatched}


def build_wide_llama(directory):
    """A one-layer Llama with a 16k vocabulary: about 70 MB of weights, two 32 MiB embedding tables."""
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=16384, hidden_size=512, num_hidden_layers=1, num_attention_heads=8,
                                      num_key_value_heads=2, intermediate_size=1024, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workers(paths):
    events, progress = [], []

    def listen(h, progress_only):
        if progress_only:
            progress.append((h.spec.replica_id, h.loaded_bytes, h.total_bytes))
        else:
            events.append((h.spec.replica_id, h.state, h.reason))

    supervisor = Supervisor(
        listen,
        heartbeat_interval=0.2,
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
    )
    specs = [
        WorkerSpec(1, str(paths["llama"]), "causal-lm", deployment="chat"),
        WorkerSpec(2, str(paths["bert"]), "encoder", deployment="embed"),
        WorkerSpec(3, str(paths["broken"]), "causal-lm", deployment="broken"),
        WorkerSpec(4, str(paths["llama"]), "causal-lm", deployment="victim"),
        WorkerSpec(5, str(paths["llama"]), "causal-lm", deployment="to-stop"),
        WorkerSpec(6, str(paths["llama"]), "causal-lm", deployment="sleeper", batch=2, seq=1000),
        # Held to 40 MiB of address space above its baseline: the 70 MB model cannot fit.
        WorkerSpec(7, str(paths["wide"]), "causal-lm", deployment="too-big", memory_limit_bytes=40 * MIB),
        # Room for the tiny model, not for the largest request the agent lets through (its logits: 64 MiB).
        WorkerSpec(8, str(paths["llama"]), "causal-lm", deployment="capped", memory_limit_bytes=48 * MIB, threads=1),
        WorkerSpec(9, str(paths["mismatched"]), "causal-lm", deployment="mismatched"),
    ]
    supervisor.start_spares()  # none: these tests start their workers cold
    for spec in specs:
        supervisor.start(spec)
    try:
        await until(lambda: all(h.state in ("ready", "failed") for h in supervisor.handles()), 120, "workers to load")
        yield Workers(supervisor, paths, events, progress)
    finally:
        await supervisor.stop_all()


def reference_model(path, cls_name: str):
    import torch
    import transformers

    return getattr(transformers, cls_name).from_pretrained(path, dtype=torch.float32).eval()


async def test_it_loads_a_causal_lm_and_reports_ready_with_a_measurement(workers):
    chat = workers[1]
    assert chat.state == "ready", chat.reason
    assert [e[1] for e in workers.events if e[0] == 1] == ["starting", "loading", "ready"]
    # On the CPU a replica measures its parameter and buffer bytes, then the warm-up forward's peak on top.
    model = reference_model(workers.paths["llama"], "AutoModelForCausalLM")
    tensors = [*model.parameters(), *model.buffers()]
    m = chat.measurement
    assert m.device == "cpu" and m.weights_bytes == sum(t.numel() * t.element_size() for t in tensors)
    assert (m.batch, m.seq) == (1, 256)  # the default shape: min(max positions, 2048)
    assert m.peak_bytes > m.weights_bytes and m.total_bytes == m.peak_bytes == chat.measured_bytes
    assert m.allocated_bytes is m.reserved_bytes is m.process_bytes is None
    assert m.load_seconds > 0 and m.load_bandwidth > 0
    assert chat.info["output_dim"] == 1024
    status = chat.status()
    assert status.pid == chat.pid and psutil.pid_exists(chat.pid)
    assert status.measurement == m and status.measured_bytes == m.total_bytes
    assert workers.supervisor.spares.spares() == []  # warm_spares defaults to 0 here: started cold


async def test_it_reports_loading_progress_in_bytes_up_to_the_checkpoint_size(workers):
    size = sum(t.nbytes for t in read_safetensors_header(workers.paths["llama"] / "model.safetensors"))
    mine = [(loaded, total) for replica, loaded, total in workers.progress if replica == 1]
    assert mine and all(total == size for _, total in mine)
    assert [loaded for loaded, _ in mine] == sorted(loaded for loaded, _ in mine)
    assert mine[-1] == (size, size)
    assert workers[1].status().loaded_bytes == workers[1].status().total_bytes == size


async def test_it_warms_up_at_the_declared_shape_clamped_to_the_model(workers):
    m = workers[6].measurement
    assert (m.batch, m.seq) == (2, 256)  # 1000 tokens asked; the model has 256 positions
    assert m.peak_bytes > workers[1].measurement.peak_bytes  # twice the activations of batch 1


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


async def test_a_checkpoint_the_architecture_cannot_take_fails_naming_the_tensor_and_both_shapes(workers):
    mismatched = workers[9]
    assert mismatched.state == "failed"
    assert mismatched.reason == (f"ArtifactError: {workers.paths['mismatched']}: tensor 'model.norm.weight' has shape "
                                 "[8, 8] in the checkpoint, but LlamaForCausalLM built from config.json expects [64]")


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


async def test_a_sleeping_replica_frees_its_weights_and_wakes_bit_exact(workers):
    sleeper = workers[6]
    before = await sleeper.infer({"input_ids": IDS})
    await sleeper.sleep()
    assert sleeper.state == "sleeping" and sleeper.status().state == "sleeping"
    assert sleeper.host_bytes >= sleeper.measurement.weights_bytes
    assert sleeper.status().host_bytes == sleeper.host_bytes
    assert sleeper.sleep_wake.direction == "sleep" and sleeper.sleep_wake.bytes == sleeper.host_bytes
    with pytest.raises(WorkerUnavailable, match="replica 6 is sleeping"):
        await sleeper.infer({"input_ids": IDS}, timeout=5)
    await sleeper.sleep()  # already asleep: nothing to do

    await asyncio.gather(sleeper.wake(), sleeper.wake())  # two callers share one wake
    assert sleeper.state == "ready" and sleeper.status().host_bytes is None
    assert sleeper.sleep_wake.direction == "wake" and sleeper.sleep_wake.seconds > 0
    after = await sleeper.infer({"input_ids": IDS})
    assert np.array_equal(before["logits"], after["logits"])
    assert [e[1] for e in workers.events if e[0] == 6][-2:] == ["sleeping", "ready"]


async def test_a_request_queued_behind_a_sleep_is_refused_with_the_reason(workers):
    sleeper = workers[6]
    sleeping = asyncio.create_task(sleeper.sleep())
    await asyncio.sleep(0)
    with pytest.raises(WorkerUnavailable, match="replica 6 is going to sleep"):
        await sleeper.infer({"input_ids": IDS}, timeout=5)
    await sleeping
    await sleeper.wake(then="preloaded")
    assert sleeper.state == "preloaded"  # on the device, but it takes no requests
    with pytest.raises(WorkerUnavailable, match="replica 6 is preloaded"):
        await sleeper.infer({"input_ids": IDS}, timeout=5)
    sleeper.promote()
    assert sleeper.state == "ready" and (await sleeper.infer({"input_ids": IDS}))["logits"].shape == (2, 6, 1024)


async def test_a_worker_out_of_memory_while_loading_fails_with_the_reason_and_harms_no_other(workers):
    too_big = workers[7]
    assert too_big.state == "failed"
    assert too_big.reason.startswith("out of memory while loading on cpu: ")
    await until(lambda: too_big.exitcode is not None, 10, "the failed worker to exit")
    assert workers[1].state == "ready" and (await workers[1].infer({"input_ids": IDS}))["logits"].shape == (2, 6, 1024)


async def test_a_request_out_of_memory_is_refused_and_the_worker_serves_on(workers):
    capped = workers[8]
    assert capped.state == "ready", capped.reason
    huge = np.ones((64, 256), dtype=np.int64)  # logits alone: 64 x 256 x 1024 floats, 64 MiB
    with pytest.raises(InferenceOutOfMemory, match="out of memory during infer on cpu: .*can't allocate memory"):
        await capped.infer({"input_ids": huge})
    assert capped.state == "ready" and psutil.pid_exists(capped.pid)
    small = await capped.infer({"input_ids": IDS})
    assert np.array_equal(small["logits"], (await workers[1].infer({"input_ids": IDS}))["logits"])


async def test_a_hung_worker_is_killed_after_missing_heartbeats(workers):
    capped = workers[8]
    assert capped.state == "ready"
    os.kill(capped.pid, signal.SIGSTOP)  # frozen: neither its main thread nor its pipe thread runs
    await until(lambda: capped.state == "failed", HEARTBEAT_TIMEOUT + 10, "the hung worker to be declared failed")
    assert capped.reason == f"no heartbeat for {HEARTBEAT_TIMEOUT:g} s"
    await until(lambda: capped.exitcode is not None, 10, "the hung worker to be reaped")
    assert capped.exitcode == -signal.SIGKILL and not psutil.pid_exists(capped.pid)
    assert workers[1].state == "ready"  # a slow but answering worker is left alone
