"""One replica's llama-server, run by its worker process (agent.workers.process) in place of the built-in engine.

`load()` starts llama.cpp's server (host.py, in the interpreter the agent names for this engine) on a free loopback
port with a key of its own (LLAMA_API_KEY in its environment, never on its command line), waits for /health, and
returns LlamacppModel: the worker's engine.
Requests never pass through here: the agent relays OpenAI bodies to the port as they are (agent.serving.relay).

llama-server has no sleep mode and takes no adapters at runtime: its replicas are stopped, not put to sleep, and a
command for either is refused with that reason. It runs in a session of its own, killed with its worker (a SIGTERM
handler, and the kernel's parent-death signal when the worker is killed outright). Its output goes to the replica's
log; when it exits on its own, the worker reports the replica failed with the line that says why (failure.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from agent.engines.llamacpp.failure import failure_reason
from agent.engines.process import die_with_parent, exit_text, free_port, stop_on_sigterm
from agent.workers.environment import child_environment
from agent.workers.spec import WorkerSpec

log = logging.getLogger("agent.worker")

START_TIMEOUT = 600.0  # it maps the file and warms up once: seconds for small models, minutes for large ones
HEALTH_POLL = 0.2
CALL_TIMEOUT = 30.0
STOP_GRACE = 3.0
TAIL_LINES = 200  # its load prints a line per metadata key; the cause comes near the end
TOLD_LINES = 12  # of the tail, in a failure whose cause no line names
OUTPUT_DRAIN_S = 2.0
HOST = str(Path(__file__).with_name("host.py"))  # run as a script: the engine's interpreter need not hold ModelGrid


class InputError(ValueError):
    """A request this engine refuses (the worker replies "input")."""


class EngineExited(RuntimeError):
    """llama-server exited; the message says why."""


class LlamaServer:
    """llama-server's process for one replica: start, health, log tail, reads, stop."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.port = free_port()
        self.key = secrets.token_urlsafe(24)
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._reader: threading.Thread | None = None
        self.process: subprocess.Popen | None = None
        self.stopping = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [program(self.spec), HOST, *self.spec.engine_args, "--port", str(self.port)]
        # The allowlist (no LLAMA_ARG_* from the agent's environment: each would set a flag), then its own key.
        env = child_environment() | dict(self.spec.engine_env) | {"LLAMA_API_KEY": self.key}
        log.info("starting llama-server: %s", " ".join(argv))
        self.process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=die_with_parent)
        self._reader = threading.Thread(target=self._read_output, name="modelgrid-llamacpp-log", daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            print(line, file=sys.stderr, flush=True)  # the replica's log (agent.workers.logs)

    def exited(self, when: str = "") -> EngineExited | None:
        """Why llama-server is gone ("llama-server exited with code 1{when}: error loading model: ..."), or its
        last lines where none says; None while it runs."""
        if self.process is None or self.process.poll() is None:
            return None
        if self._reader is not None:
            self._reader.join(OUTPUT_DRAIN_S)
        code = self.process.returncode
        cause = failure_reason(list(self.tail))
        if cause:
            return EngineExited(f"llama-server {exit_text(code)}{when}: {cause}")
        lines = "\n".join(list(self.tail)[-TOLD_LINES:])
        return EngineExited(f"llama-server {exit_text(code)}{when}; its last lines:\n{lines}")

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        """Block until /health answers 200 (503 while it loads); EngineExited if it exits first, TimeoutError past
        `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            ended = self.exited(" before it was ready")
            if ended is not None:
                raise ended
            with contextlib.suppress(OSError):
                if self.read("/health", timeout=2.0)[0] == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama-server did not become healthy within {timeout:g} s")
            time.sleep(HEALTH_POLL)

    def read(self, path: str, timeout: float = CALL_TIMEOUT) -> tuple[int, str]:
        """GET's status and text."""
        request = urllib.request.Request(self.base_url + path, headers={"Authorization": f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, ""

    def pids(self) -> list[int]:
        if self.process is None:
            return []
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.process.pid)
            return [root.pid, *(p.pid for p in root.children(recursive=True))]
        return []

    def host_bytes(self) -> int:
        """Memory its process holds on its own (unique set size; the mapped model file counts once it is read)."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_full_info().uss
        return total

    def stop(self) -> None:
        """SIGTERM to its session, SIGKILL after a grace period."""
        self.stopping = True
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_GRACE)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class LlamacppModel:
    """The worker's engine for a llama-server replica: what it tells the agent, and the commands it refuses."""

    batcher = None  # generations go to llama-server directly, through the agent's relay
    asleep = False

    def __init__(self, spec: WorkerSpec, server: LlamaServer, weights_bytes: int, load_seconds: float) -> None:
        self.spec = spec
        self.server = server
        self.device = spec.device
        self.weights_bytes = weights_bytes
        self.load_seconds = load_seconds
        self.commands: dict[str, Callable[[Any], Any]] = {
            "adapters": self.configure_adapters,
            "adapter_stats": lambda _payload: {"stats": _no_adapters()},
            "sleep": self.sleep,
            "wake": self.sleep,
        }
        self.max_positions = context_per_slot(server)

    def describe(self) -> dict[str, Any]:
        """What the agent needs to relay requests (the port and key) and what metadata shows."""
        return {"engine": "llamacpp", "port": self.server.port, "key": self.server.key, "pids": self.server.pids(),
                "max_positions": self.max_positions}

    def measure(self) -> dict[str, Any]:
        held = self.server.host_bytes()
        cuda = self.device.startswith("cuda")
        return {"device": "cuda" if cuda else "cpu", "batch": 1, "seq": max(1, self.max_positions),
                "weights_bytes": self.weights_bytes, "peak_bytes": held, "total_bytes": held,
                "load_seconds": self.load_seconds}

    def configure_adapters(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Every adapter is refused: llama-server loads LoRA only at start, from files on its command line."""
        why = "llama.cpp's server takes no adapters at runtime here"
        names = [a["name"] for a in payload.get("load", ())]
        return {"stats": _no_adapters(), "errors": [f"adapter {n!r}: {why}" for n in names],
                "failures": dict.fromkeys(names, why)}

    def sleep(self, _payload: Any = None) -> dict[str, Any]:
        raise InputError("llama.cpp's server has no sleep mode: its replicas are stopped instead")

    def recover_from_oom(self) -> None:
        """Nothing of llama-server's memory is this process's to free."""

    def watch(self, failed: Callable[[str], None]) -> None:
        """Call `failed` with why llama-server exited should it exit on its own."""
        threading.Thread(target=self._watch, args=(failed,), name="modelgrid-llamacpp-watch", daemon=True).start()

    def _watch(self, failed: Callable[[str], None]) -> None:
        assert self.server.process is not None
        self.server.process.wait()
        if not self.server.stopping:
            reason = str(self.server.exited())
            self.server.stop()
            failed(reason)


def load(spec: WorkerSpec, progress: Callable[[int, int], Any] | None = None, artifact: Any = None) -> LlamacppModel:
    """Start llama-server for `spec` and wait until it serves; the worker's engine for it. Stops it if it fails."""
    weights = int(getattr(artifact, "weights_bytes", 0) or 0)
    started = time.monotonic()
    server = LlamaServer(spec)
    stop_on_sigterm(server)
    server.start()
    try:
        server.wait_healthy()
        if progress:
            progress(weights, weights)
        model = LlamacppModel(spec, server, weights, time.monotonic() - started)
    except BaseException:
        server.stop()
        raise
    return model


def program(spec: WorkerSpec) -> str:
    """The interpreter with xllamacpp the agent was told of (the spec's program; else this one)."""
    return spec.engine_python or sys.executable


def context_per_slot(server: LlamaServer) -> int:
    """The tokens one request may take (its slots' context); 0 where it does not say."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        props = json.loads(server.read("/props")[1])
        return int(props["default_generation_settings"]["n_ctx"])
    return 0


def _no_adapters() -> dict[str, Any]:
    return {"adapters": [], "totals": {"hits": 0, "misses": 0, "evictions": 0, "adapters": 0}}


