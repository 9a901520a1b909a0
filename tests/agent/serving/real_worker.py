"""One real worker (a demo model under a Supervisor) behind the agent's HTTP server on loopback, for the tests
that drive it with the official openai client."""

import contextlib

import openai

from agent.serving import make_app, start_server
from agent.serving.auth import GatewayAuth
from agent.workers.spec import WorkerSpec
from agent.workers.supervisor import Supervisor
from tests.waiting import until


@contextlib.asynccontextmanager
async def real_agent(model_dir, deployment, secret):
    """Start a causal-lm worker on `model_dir` as `deployment`, wait for it to be ready and serve the agent app
    (holding `secret`) on loopback: an openai.AsyncOpenAI client of /v1 that also carries the server's `.port`
    and the worker's `.handle`."""
    supervisor = Supervisor()
    handle = supervisor.start(WorkerSpec(1, str(model_dir), "causal-lm", deployment=deployment))
    runner = None
    try:
        await until(lambda: handle.state in ("ready", "failed"), 120, "the worker to load")
        assert handle.state == "ready", handle.reason
        runner, port = await start_server(make_app(supervisor, auth=GatewayAuth(secret)), "127.0.0.1", 0)
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=secret, max_retries=0) as c:
            c.port, c.handle = port, handle
            yield c
    finally:
        if runner is not None:
            await runner.cleanup()
        await supervisor.stop_all()
