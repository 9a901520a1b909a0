"""vLLM as a replica's engine: ModelGrid decides where and when, vLLM does the token work.

A vLLM replica's worker (agent.workers.process, as for the built-in engine) starts vLLM's OpenAI server from
the operator's interpreter (`--vllm-python`) on a loopback port with a key of its own (agent.vllm.server),
and answers the agent's commands for it over vLLM's HTTP API. `launch` turns a desired replica into that
command line (daemon side); the agent's serving passes /v1 requests through to it (agent.serving.relay).
No torch and no vLLM import here: vLLM lives in its own environment.
"""
