"""The agent runs a vllm replica as it runs its own: a worker starts the engine's server (here a stand-in that
starts in a second: tests.agent.fake_vllm) on a loopback port with a key of its own, reports it ready with what
it holds, relays /v1 to it unchanged, loads its adapters at runtime, relays its metrics, and reports it failed
with its last lines when it dies, then starts it again."""

import asyncio
import json
import os
import signal

import aiohttp
import psutil

from agent.daemon import Agent, AgentConfig
from agent.gpus import SimulatedBackend
from agent.protocol import REPLICA_HEADER, DesiredAdapter, Hello, HostReport, ReplicaStatus
from tests.adapter_files import write_adapter
from tests.agent import test_daemon
from tests.agent.fake_vllm import fake_vllm_python
from tests.agent.test_daemon import GATEWAY, desired_state, replica
from tests.conftest import write_model_dir

console, run_agent = test_daemon.console, test_daemon.run_agent  # the fake console and the agent it runs
START_S = 60  # the worker's start and the stand-in's (a bound on what must happen, not a speed)
WIDE = 128  # hidden size: heads 32 wide, which vLLM's CPU attention takes (it refuses narrower ones)


async def post(agent, path, body, headers=None):
    async with aiohttp.ClientSession(headers=GATEWAY | (headers or {})) as http:
        async with http.post(f"{agent.endpoint}{path}", json=body) as response:
            return response.status, await response.json(content_type=None)


async def status_where(console, predicate, timeout=20):
    """The next status of replica 7 for which `predicate` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        status = await console.expect(ReplicaStatus, replica_id=7,
                                      timeout=max(0.1, deadline - asyncio.get_running_loop().time()))
        if predicate(status):
            return status


async def start_vllm_replica(console, run_agent, tmp_path, **extra):
    agent = await run_agent(warm_workers=0, engine_programs={"vllm": fake_vllm_python(tmp_path)})
    hello = await console.expect(Hello)
    assert {(e.name, e.version) for e in hello.engines} >= {("vllm", "0.0.0+fake")}
    model = write_model_dir(tmp_path / "m", hidden=WIDE)
    await console.send(desired_state(1, [replica(model, engine="vllm", **extra)]))
    ready = await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=START_S)
    return agent, ready


async def test_a_vllm_replica_starts_serves_through_the_relay_and_is_refused_v2(console, run_agent, tmp_path):
    agent, ready = await start_vllm_replica(console, run_agent, tmp_path,
                                            engine_args=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    handle = agent.supervisor.get(7)
    assert ready.measurement.device == "cpu" and ready.measured_bytes > 0  # what its processes hold
    assert handle.info["port"] and handle.info["key"] and len(handle.device_pids) >= 2  # the worker and vLLM
    vllm = psutil.Process(handle.info["pids"][0])
    command = vllm.cmdline()
    assert command[command.index("--served-model-name") + 1] == "chat" and "--tool-call-parser" in command
    assert handle.info["key"] not in " ".join(command)  # the key is in its environment only

    # The body goes through as the client wrote it, fields this agent does not know included.
    body = {"model": "chat", "prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}], "x": [1]}
    status, answer = await post(agent, "/v1/completions", body)
    assert status == 200 and json.loads(answer["raw"]) == body and answer["path"] == "/v1/completions"
    status, answer = await post(agent, "/v1/responses", {"model": "chat", "input": "hi"})
    assert status == 200 and answer["path"] == "/v1/responses"
    # Routed once: the replica the gateway names, or a refusal that another replica may take.
    status, answer = await post(agent, "/v1/completions", body, {REPLICA_HEADER: "7"})
    assert status == 200
    async with aiohttp.ClientSession(headers=GATEWAY | {REPLICA_HEADER: "8"}) as http:
        async with http.post(f"{agent.endpoint}/v1/completions", json=body) as response:
            assert response.status == 503 and response.headers.get("X-ModelGrid-Unserved") == "1"
            assert "has no replica 8 on this agent (it has: 7)" in (await response.json())["error"]["message"]
    # v2 tensors are the built-in engine's.
    status, answer = await post(agent, "/v2/models/chat/infer", {"inputs": []})
    assert status == 400 and "runs on the vllm engine" in answer["error"]


async def test_streams_pass_through_and_an_abandoned_one_is_cancelled_in_vllm(console, run_agent, tmp_path):
    agent, _ = await start_vllm_replica(console, run_agent, tmp_path, index=0)
    async with aiohttp.ClientSession(headers=GATEWAY) as http:
        body = {"model": "chat", "prompt": "hi", "stream": True, "max_tokens": 400}
        async with http.post(f"{agent.endpoint}/v1/completions", json=body) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            first = await response.content.readline()
            assert first.startswith(b"data: ")
        # Gone after one event of 400 (20 s of them): the relay drops vLLM's connection, and vLLM stops.
        for _ in range(200):  # up to 20 s
            if await _metrics(agent, "fake_cancelled_total"):
                break
            await asyncio.sleep(0.1)
        assert await _metrics(agent, "fake_cancelled_total") == 1.0
        assert agent.supervisor.get(7).picked == 0  # nothing left counted against the drain
        # Its events count as the built-in engine's tokens do, and its end as a client's cancellation.
        async with http.get(f"{agent.endpoint}/metrics") as response:
            text = await response.text()
        assert 'modelgrid_time_to_first_token_seconds_count{deployment="chat"} 1.0' in text
        assert 'modelgrid_generations_cancelled_total{deployment="chat",reason="client"} 1.0' in text


async def _metrics(agent, name):
    async with aiohttp.ClientSession(headers=GATEWAY) as http:
        async with http.get(f"{agent.endpoint}/metrics") as response:
            text = await response.text()
    for line in text.splitlines():
        if line.startswith(name + "{"):
            assert 'deployment="chat"' in line and 'replica="chat#0"' in line  # labelled as the console names it
            value = float(line.rsplit(" ", 1)[1])
            return value or None
    return None


async def test_adapters_load_at_runtime_and_a_refused_one_says_why(console, run_agent, tmp_path):
    good = write_adapter(tmp_path / "sql", {"model.layers.0.mlp.up_proj": (8, 16, 32)})
    adapters = [DesiredAdapter(name="sql", path=str(good)), DesiredAdapter(name="gone", path=str(tmp_path / "gone"))]
    agent, _ = await start_vllm_replica(console, run_agent, tmp_path, adapters=adapters[:1])
    command = psutil.Process(agent.supervisor.get(7).info["pids"][0]).cmdline()
    assert command[command.index("--max-lora-rank") + 1] == "8" and "--enable-lora" in command
    status = await status_where(console, lambda s: s.adapters)
    assert [a.name for a in status.adapters] == ["sql"]
    assert (await post(agent, "/v1/completions", {"model": "sql", "prompt": "hi"}))[0] == 200

    # An adapter whose directory vLLM cannot read is refused with vLLM's reason; the rest still apply.
    await console.send(desired_state(2, [replica(write_model_dir(tmp_path / "m", hidden=WIDE), engine="vllm",
                                                 adapters=adapters)]))
    status = await status_where(console, lambda s: s.adapter_error)
    assert "adapter 'gone'" in status.adapter_error and "No adapter found" in status.adapter_error
    # A request for it is told that reason, as the server's failure (it was a 400 "not loaded" from vLLM).
    code, body = await post(agent, "/v1/completions", {"model": "gone", "prompt": "hi"})
    assert code == 503 and body["error"]["code"] == "adapter_failed", body
    assert body["error"]["message"].startswith("adapter 'gone' of model 'chat' could not be loaded: ")
    assert "No adapter found" in body["error"]["message"]


async def test_a_model_vllm_cannot_run_on_this_cpu_fails_before_any_process_starts_and_is_not_retried(
        console, run_agent, tmp_path):
    """The demo tiny-llama's heads (16 wide) on vLLM's CPU build: it started, read ready and died at every first
    request. Now the agent's capability check refuses it before a worker starts, with the reason, once."""
    agent = await run_agent(warm_workers=0, engine_programs={"vllm": fake_vllm_python(tmp_path)})
    await console.expect(Hello)
    await console.send(desired_state(1, [replica(write_model_dir(tmp_path / "m", hidden=64), engine="vllm")]))
    failed = await console.expect(ReplicaStatus, replica_id=7, state="failed", timeout=20)
    assert failed.reason == "vLLM's CPU attention needs head_dim >= 32; this model's heads are 16 wide"
    assert failed.pid is None and agent.supervisor.get(7).pid is None  # nothing was started
    assert agent.backoff.failures(7) == 0  # nor will be: the same files would be refused again


async def test_a_vllm_that_dies_fails_its_replica_with_its_last_lines_and_is_started_again(console, run_agent,
                                                                                          tmp_path):
    agent, ready = await start_vllm_replica(console, run_agent, tmp_path)
    vllm_pid = agent.supervisor.get(7).info["pids"][0]
    os.kill(vllm_pid, signal.SIGKILL)
    failed = await console.expect(ReplicaStatus, replica_id=7, state="failed", timeout=20)
    assert failed.reason.startswith("vLLM was killed by signal SIGKILL; its last lines:")
    assert "Application startup complete." in failed.reason
    core = int(failed.reason.split("engine core pid ")[1].split()[0])
    gone = await asyncio.to_thread(psutil.wait_procs, [psutil.Process(core)] if psutil.pid_exists(core) else [], 10)
    assert gone[1] == []  # what the server started went with it
    again = await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=START_S)
    assert again.pid != ready.pid and agent.supervisor.get(7).info["pids"][0] != vllm_pid
    assert not psutil.pid_exists(ready.pid) or psutil.Process(ready.pid).status() == psutil.STATUS_ZOMBIE


async def test_a_worker_killed_outright_takes_all_of_its_vllm_with_it(console, run_agent, tmp_path):
    agent, ready = await start_vllm_replica(console, run_agent, tmp_path)
    server = psutil.Process(agent.supervisor.get(7).info["pids"][0])
    engine = server.children(recursive=True)  # the stand-in's engine core, in the server's session
    assert engine
    os.kill(ready.pid, signal.SIGKILL)
    failed = await console.expect(ReplicaStatus, replica_id=7, state="failed", timeout=20)
    assert "killed by signal SIGKILL" in failed.reason
    gone = await asyncio.to_thread(psutil.wait_procs, [server, *engine], timeout=10)
    assert gone[1] == []  # the kernel took the server with its worker; the agent took the rest
    await console.expect(ReplicaStatus, replica_id=7, state="ready", timeout=START_S)


async def test_a_stopped_vllm_replica_leaves_no_process(console, run_agent, tmp_path):
    agent, ready = await start_vllm_replica(console, run_agent, tmp_path)
    pids = agent.supervisor.get(7).device_pids
    await console.send(desired_state(2, []))
    await console.expect(ReplicaStatus, replica_id=7, state="stopped", timeout=20)
    gone = await asyncio.to_thread(psutil.wait_procs, [psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                   timeout=10)
    assert gone[1] == []  # none still alive
    assert isinstance(await console.expect(HostReport), HostReport)


class CudaKind(SimulatedBackend):
    """Simulated GPUs whose replicas run on "cuda:N" devices (the stand-in vLLM touches no GPU)."""

    device_kind = "cuda"


async def test_vllm_replicas_on_one_gpu_start_one_at_a_time(console, tmp_path):
    agent = Agent(AgentConfig(console=console.url, token=test_daemon.TOKEN, name="test-host", report_interval=0.2,
                              warm_workers=0, engine_programs={"vllm": fake_vllm_python(tmp_path)}),
                  CudaKind("sim:1x80GiB,1x24GiB", host="test-host"))
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.listening.wait(), 10)
        await console.expect(Hello)
        model = write_model_dir(tmp_path / "m")
        both = [replica(model, replica_id=i, deployment=f"d{i}", engine="vllm") for i in (7, 8)]  # both on GPU 1
        await console.send(desired_state(1, both))
        seen = []
        while len({rid for rid, state in seen if state == "ready"}) < 2 and len(seen) < 100:
            status = await console.expect(ReplicaStatus, timeout=START_S)
            seen.append((status.replica_id, status.state))
        # vLLM sizes its KV cache from what is free as it starts: the second starts once the first is loaded.
        # (A ready replica's status may come again while the other starts: each is counted once, when first seen.)
        order = list(dict.fromkeys((rid, state) for rid, state in seen if state in ("starting", "ready")))
        assert order == [(7, "starting"), (7, "ready"), (8, "starting"), (8, "ready")], seen
        assert agent.supervisor.get(8).spec.device == "cuda:1"
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 30)


MAX_LEN = "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored " \
          "in KV cache (2048). Try increasing `VLLM_CPU_KVCACHE_SPACE` or decreasing `max_model_len`."


async def vllm_that_fails(console, run_agent, tmp_path, **faults):
    """A vLLM replica whose stand-in fails as `faults` say; the statuses of replica 7 up to its failure (or its
    being ready)."""
    await run_agent(warm_workers=0, engine_programs={"vllm": fake_vllm_python(tmp_path)})
    await console.expect(Hello)
    model = write_model_dir(tmp_path / "m", hidden=WIDE)
    (model / "fake-vllm.json").write_text(json.dumps(faults))
    await console.send(desired_state(1, [replica(model, engine="vllm")]))
    seen = []
    while len(seen) < 20 and (not seen or seen[-1].state not in ("failed", "ready")):
        seen.append(await console.expect(ReplicaStatus, replica_id=7, timeout=START_S))
    return seen


async def test_a_vllm_that_fails_to_start_fails_its_replica_with_the_engines_own_error_line(console, run_agent,
                                                                                           tmp_path):
    """vLLM prints its root cause in its engine core's traceback, then its API server's wrapper ("See root cause
    above") and shutdown noise: the replica's reason was the last 12 lines, all noise. It is the root cause now."""
    seen = await vllm_that_fails(console, run_agent, tmp_path, fail_at_start=MAX_LEN)
    reason = seen[-1].reason
    assert f"vLLM exited with code 1 before it was ready: {MAX_LEN}; restarts in" in reason, reason
    assert "resource_tracker" not in reason and "See root cause above" not in reason


async def test_a_vllm_that_dies_at_its_first_request_fails_before_it_reads_ready(console, run_agent, tmp_path):
    """The demo tiny-llama on vLLM's CPU build started, read ready, then died at every first request: a warm-up
    request before ready makes that failure land before ready, with the engine's own line."""
    cause = "RuntimeError: Unsupported head size: 16"
    seen = await vllm_that_fails(console, run_agent, tmp_path, die_on_first_request=cause)
    assert "ready" not in [s.state for s in seen]
    assert f"vLLM exited with code 1 at its warm-up request: {cause}; restarts in" in seen[-1].reason, seen[-1].reason
