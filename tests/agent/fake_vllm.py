"""A stand-in for vLLM's OpenAI server, for tests of the agent's vLLM engine without vLLM (which takes a minute to
start): the same command line, key, health, model list, runtime LoRA endpoints and metrics, and completions that
echo what they were sent. Started by `fake_vllm_python()`'s interpreter in place of vLLM's.

Streams send one event per 50 ms, and count the streams whose client went away (fake_cancelled_total).

A `fake-vllm.json` in the model directory makes it fail as vLLM does: `{"fail_at_start": "ValueError: ..."}` prints
that root cause in its engine core's traceback, its API server's wrapper traceback and some noise, and exits 1;
`{"die_on_first_request": "RuntimeError: ..."}` starts, then answers its first completion 500 after printing that
traceback, and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from aiohttp import web

STATE = {"requests": 0, "cancelled": 0, "adapters": {}}


def fake_vllm_python(directory: Path) -> str:
    """An executable that answers the agent's version probe (`-c`) and starts this server for
    `-m vllm.entrypoints.openai.api_server ...`, as a vLLM environment's interpreter would."""
    script = directory / "fake-vllm-python"
    root = Path(__file__).resolve().parents[2]
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-c" ]; then echo 0.0.0+fake; exit 0; fi\n'
        "shift 2\n"
        f'cd "{root}" && exec "{sys.executable}" -m tests.agent.fake_vllm "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--served-model-name")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args, rest = parser.parse_known_args()
    key = os.environ.get("VLLM_API_KEY", "")
    print(f"fake vLLM for {args.model} as {args.served_model_name}; args {' '.join(rest)}", flush=True)
    faults = Path(args.model or ".") / "fake-vllm.json"
    faults = json.loads(faults.read_text()) if faults.is_file() else {}
    if faults.get("fail_at_start"):
        print_failure(faults["fail_at_start"])
        sys.exit(1)
    print("Loading weights took 0.00 seconds", flush=True)
    # vLLM's engine core: a process of its own in the server's session, which outlives a server killed outright.
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "fake-vllm-engine-core"])
    print(f"engine core pid {core.pid}", flush=True)
    served = args.served_model_name

    @web.middleware
    async def keyed(request: web.Request, handler):
        if request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(_request):
        return web.Response()

    async def models(_request):
        data = [{"id": served, "max_model_len": 256}] + [{"id": a, "parent": served} for a in STATE["adapters"]]
        return web.json_response({"object": "list", "data": data})

    async def completions(request: web.Request):
        if faults.get("die_on_first_request"):
            print_failure(faults["die_on_first_request"], starting=False)
            asyncio.get_running_loop().call_later(0.2, os._exit, 1)
            return web.json_response({"error": {"message": "EngineCore encountered an issue. See stack trace (above) "
                                                "for the root cause.", "type": "InternalServerError"}}, status=500)
        raw = await request.read()
        body = json.loads(raw)
        STATE["requests"] += 1
        if body.get("model") not in (served, *STATE["adapters"]):
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "param": "model", "code": 404}}, status=404)
        if not body.get("stream"):
            return web.json_response({"object": "text_completion", "model": body["model"], "path": request.path,
                                      "raw": raw.decode(), "choices": [{"index": 0, "text": "ok"}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i in range(int(body.get("max_tokens", 4))):
                await response.write(f"data: {json.dumps({'choices': [{'index': 0, 'text': str(i)}]})}\n\n".encode())
                await asyncio.sleep(0.05)
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            STATE["cancelled"] += 1
            raise
        return response

    async def load_lora(request: web.Request):
        body = await request.json()
        if not Path(body["lora_path"]).is_dir():
            return web.json_response({"error": {"message": f"No adapter found for {body['lora_path']}",
                                                "type": "BadRequestError", "code": 400}}, status=400)
        STATE["adapters"][body["lora_name"]] = body["lora_path"]
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    async def unload_lora(request: web.Request):
        body = await request.json()
        STATE["adapters"].pop(body["lora_name"], None)
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")

    async def metrics(_request):
        text = ("# HELP vllm:num_requests_running Requests running.\n# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="{served}"}} 0.0\n'
                "# HELP fake_requests Requests seen.\n# TYPE fake_requests counter\n"
                f"fake_requests_total {STATE['requests']}\n"
                "# HELP fake_cancelled Streams whose client went away.\n# TYPE fake_cancelled counter\n"
                f"fake_cancelled_total {STATE['cancelled']}\n")
        return web.Response(text=text, content_type="text/plain")

    app = web.Application(middlewares=[keyed])
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize"):
        app.router.add_post(path, completions)
    app.router.add_post("/v1/load_lora_adapter", load_lora)
    app.router.add_post("/v1/unload_lora_adapter", unload_lora)
    print("Application startup complete.", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, handler_cancellation=True)


def print_failure(cause: str, starting: bool = True) -> None:
    """The root cause in the engine core's traceback, the API server's own wrapper after it, and noise, as vLLM
    prints them."""
    core = "(EngineCore_DP0 pid=4242) "
    lines = [f"{core}ERROR 11-29 10:00:00 [core.py:708] EngineCore {'failed to start' if starting else 'died'}.",
             f"{core}Traceback (most recent call last):",
             f'{core}  File "vllm/v1/engine/core.py", line 699, in run_engine_core',
             f"{core}    engine_core = EngineCoreProc(*args, **kwargs)", f"{core}{cause}"]
    if starting:
        lines += ["Traceback (most recent call last):", '  File "<frozen runpy>", line 198, in _run_module_as_main',
                  '  File "vllm/v1/engine/utils.py", line 1021, in wait_for_engine_startup',
                  "    raise RuntimeError(", "RuntimeError: Engine core initialization failed. See root cause above. "
                  "Failed core proc(s): {'EngineCore_DP0': 1}"]
    lines += [f"/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There "
              f"appear to be {n} leaked shared_memory objects to clean up at shutdown" for n in range(1, 14)]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
