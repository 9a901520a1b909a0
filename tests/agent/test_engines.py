"""An agent says which engines it runs in its hello, and refuses, with the reason, a replica for one it does not."""

from importlib import metadata

from agent.protocol import Hello, ReplicaStatus
from tests.agent import test_daemon
from tests.agent.test_daemon import desired_state, replica
from tests.conftest import write_model_dir

console, run_agent = test_daemon.console, test_daemon.run_agent  # the fake console and the agent it runs


async def test_the_hello_names_the_engines_and_a_replica_for_another_is_refused_saying_why(console, run_agent,
                                                                                            tmp_path):
    await run_agent(warm_workers=0)
    hello = await console.expect(Hello)
    assert [(e.name, e.version) for e in hello.engines] == [("torch", metadata.version("torch")[:50])]
    await console.send(desired_state(1, [replica(write_model_dir(tmp_path / "m"), engine="vllm")]))
    failed = await console.expect(ReplicaStatus, replica_id=7, state="failed")
    assert failed.reason == "this agent runs no vllm engine (it runs: torch)" and failed.pid is None
