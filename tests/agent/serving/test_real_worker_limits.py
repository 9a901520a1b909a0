"""The agent's app over a real worker process (the demo tiny-llama: vocab 1024, 256 positions): one large v2
request leaves health checks and heartbeats their turns, and lengths past the model's positions are refused by
the agent and by the worker itself."""

import asyncio
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from agent.serving import make_app
from agent.serving.auth import GatewayAuth
from agent.workers.demo_models import build_tiny_llama
from agent.workers.spec import WorkerSpec
from agent.workers.supervisor import InferenceInputError, Supervisor
from tests.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET = "gw-secret-for-real-worker-tests"
# The longest the loop may go without answering a health check, as a share of the whole request: encoding on the
# loop held it for 16 of 17 s; a loaded machine slows both alike.
HEALTH_SHARE = 0.25
HEARTBEAT_TIMEOUT = 3.0  # a loop held this long would get the healthy worker killed

# Parses a v2 answer in a child process (a 360 MB json.loads here would hold this test's own event loop, and the
# worker's heartbeats with it): one line of JSON without the data, then the data as float32 bytes.
READ_ANSWER = """
import json, sys
import numpy as np
body = json.load(sys.stdin.buffer)
[output] = body.pop("outputs")
data = output.pop("data")
sys.stdout.buffer.write(json.dumps(body | {"output": output, "values": len(data)}).encode() + b"\\n")
sys.stdout.buffer.write(np.asarray(data, dtype=np.float32).tobytes())
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def supervisor(tmp_path_factory):
    llama = build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    supervisor = Supervisor(heartbeat_interval=0.2, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    handle = supervisor.start(WorkerSpec(1, str(llama), "causal-lm", deployment="chat"))
    try:
        await until(lambda: handle.state in ("ready", "failed"), 120, "the worker to load")
        assert handle.state == "ready", handle.reason
        yield supervisor
    finally:
        await supervisor.stop_all()


@pytest_asyncio.fixture(loop_scope="module")
async def client(supervisor):
    client = TestClient(TestServer(make_app(supervisor, auth=GatewayAuth(SECRET))),
                        headers={"Authorization": f"Bearer {SECRET}"})
    await client.start_server()
    yield client
    await client.close()


def infer_body(ids: np.ndarray) -> dict:
    tensor = {"name": "input_ids", "shape": list(ids.shape), "datatype": "INT64", "data": ids.ravel().tolist()}
    return {"inputs": [tensor]}


async def test_a_causal_lm_worker_reports_its_positions_and_refuses_longer_rows_itself(supervisor, client):
    handle = supervisor.get(1)
    assert handle.info["max_positions"] == 256
    with pytest.raises(InferenceInputError, match=r"has 257 tokens per row; this model takes at most 256"):
        await handle.infer({"input_ids": np.ones((1, 257), np.int64)})
    with pytest.raises(InferenceInputError, match=r"'attention_mask' holds 2; its values must be 0 \(padding\) or 1"):
        await handle.infer({"input_ids": np.ones((1, 3), np.int64), "attention_mask": np.array([[1, 2, 1]])})
    response = await client.post("/v2/models/chat/infer", json=infer_body(np.ones((1, 257), np.int64)))
    assert response.status == 400 and "takes at most 256" in (await response.json())["error"]
    assert handle.state == "ready"


async def test_a_64_by_256_request_leaves_health_checks_and_heartbeats_their_turns(supervisor, client):
    handle = supervisor.get(1)
    pid = handle.pid
    ids = np.random.default_rng(0).integers(0, 1024, (64, 256), dtype=np.int64)

    async def infer():
        response = await client.post("/v2/models/chat/infer", json=infer_body(ids))
        # Logits [64, 256, 1024]: ~360 MB of JSON, kept in pieces (joining them here would hold the loop itself).
        return response.status, [chunk async for chunk in response.content.iter_chunked(1 << 20)]

    gaps = []  # from one health answer to the next: a held loop shows here, whether it held the request or the pause
    began = time.monotonic()
    async with asyncio.timeout(240):
        request = asyncio.create_task(infer())
        last = time.monotonic()
        while not request.done():
            live = await client.get("/v2/health/live")
            assert live.status == 200
            await asyncio.sleep(0.05)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()
        status, chunks = await request
    raw = b"".join(chunks)
    assert status == 200, raw[:500]
    assert len(gaps) > 10 and max(gaps) < HEALTH_SHARE * (time.monotonic() - began), sorted(gaps)[-5:]
    assert handle.state == "ready" and handle.pid == pid  # heartbeats kept answering: the worker lives on

    parsed = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", READ_ANSWER], input=raw, capture_output=True, check=True, timeout=120
    )
    line, _, data = parsed.stdout.partition(b"\n")
    meta = json.loads(line)
    assert meta.pop("id")  # made up, as the request gave none
    assert meta == {
        "model_name": "chat",
        "output": {"name": "logits", "datatype": "FP32", "shape": [64, 256, 1024]},
        "values": 64 * 256 * 1024,
    }
    direct = (await handle.infer({"input_ids": ids}))["logits"]
    received = np.frombuffer(data, dtype=np.float32).reshape(64, 256, 1024)
    np.testing.assert_allclose(received, direct, rtol=1e-5, atol=1e-5)
