"""One replica's vLLM server, run by its worker process (agent.workers.process) in place of the built-in engine.

`load()` starts vLLM's OpenAI server from the configured interpreter on a free loopback port, with a key of its
own (in its environment, never on its command line), waits for /health while it reports its phases, and returns
a VllmModel: the worker's engine, whose commands load and unload LoRA adapters, sleep and wake over vLLM's HTTP
API. Requests never pass through here: the agent relays them to the port (agent.serving.relay).

vLLM runs in a session of its own, killed with its worker (a SIGTERM handler, and the kernel's parent-death
signal when the worker is killed outright). Its output goes to the replica's log; the exception lines of its
tracebacks and its last lines are kept: when it exits on its own, the worker reports the replica failed with the
line that says why (tracebacks.py; its last lines where it printed none), and exits too.

Before it reports ready, one warm-up request: a model vLLM starts but cannot run (heads its CPU attention has no
kernel for) fails there, before ready, instead of at a client's first request.
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
from typing import Any

import psutil

from agent.engines.process import die_with_parent, exit_text, free_port, stop_on_sigterm
from agent.engines.vllm.tracebacks import Tracebacks
from agent.workers.environment import child_environment
from agent.workers.spec import WorkerSpec

log = logging.getLogger("agent.worker")

START_TIMEOUT = 900.0  # vLLM imports torch, compiles and profiles: 60-150 s on 2 CPU cores, minutes on big GPUs
HEALTH_POLL = 0.5
CALL_TIMEOUT = 120.0  # an adapter load or a sleep
STOP_GRACE = 3.0
TAIL_LINES = 40
TOLD_LINES = 12  # of the tail, in a failure that printed no traceback
OUTPUT_DRAIN_S = 2.0  # for the last of its output after it exited (its engine core may hold the pipe longer)
WARM_UP_EXIT_S = 5.0  # a vLLM whose engine died at the warm-up request exits within this
# Lines of vLLM's log that mark how far its start has come (weights read: the load's bytes are done).
WEIGHTS_LOADED = ("Loading weights took", "Model loading took")


class InputError(ValueError):
    """A request this engine refuses (the worker replies "input")."""


class EngineExited(RuntimeError):
    """vLLM exited; the message carries its exit status and last lines."""


class VllmServer:
    """vLLM's server process for one replica: start, health, log tail, calls, stop."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.port = free_port()
        self.key = secrets.token_urlsafe(24)
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.tracebacks = Tracebacks()
        self._reader: threading.Thread | None = None
        self.process: subprocess.Popen | None = None
        self.weights_loaded = threading.Event()
        self.stopping = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        python = self.spec.engine_python or sys.executable
        argv = [python, *self.spec.engine_args, "--port", str(self.port)]
        # The allowlist again (an adopted worker may predate it), then its settings and its own key: no other secret.
        env = child_environment() | dict(self.spec.engine_env) | {"VLLM_API_KEY": self.key, "PYTHONUNBUFFERED": "1"}
        log.info("starting vLLM: %s", " ".join(argv))
        self.process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=die_with_parent)
        self._reader = threading.Thread(target=self._read_output, name="modelgrid-vllm-log", daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            self.tracebacks.feed(line)
            print(line, file=sys.stderr, flush=True)  # the replica's log (agent.workers.logs)
            if any(mark in line for mark in WEIGHTS_LOADED):
                self.weights_loaded.set()

    def exited(self, when: str = "") -> EngineExited | None:
        """Why vLLM is gone ("vLLM exited with code 1{when}: ValueError: ..."): the exception that ended it, or
        its last lines where it printed none (a signal); None while it runs."""
        if self.process is None or self.process.poll() is None:
            return None
        if self._reader is not None:
            self._reader.join(OUTPUT_DRAIN_S)  # its last lines, still in the pipe
        code = self.process.returncode
        cause = self.tracebacks.cause() if code and code > 0 else ""
        if cause:
            return EngineExited(f"vLLM {exit_text(code)}{when}: {cause}")
        lines = "\n".join(list(self.tail)[-TOLD_LINES:])
        return EngineExited(f"vLLM {exit_text(code)}{when}; its last lines:\n{lines}")

    def wait_healthy(self, progress: Callable[[bool], None], timeout: float = START_TIMEOUT) -> None:
        """Block until /health answers 200; EngineExited if vLLM exits first, TimeoutError past `timeout`."""
        deadline = time.monotonic() + timeout
        told = False
        while True:
            ended = self.exited(" before it was ready")
            if ended is not None:
                raise ended
            if self.weights_loaded.is_set() and not told:
                progress(True)
                told = True
            try:
                if self.get("/health", timeout=2.0) == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM did not become healthy within {timeout:g} s")
            time.sleep(HEALTH_POLL)

    def warm_up(self, served: str) -> None:
        """One request of one token, before the replica reads ready: EngineExited with vLLM's own line when its
        engine dies of it, RuntimeError with vLLM's answer when it refuses it."""
        try:
            self.post("/v1/completions", {"model": served, "prompt": "Hello", "max_tokens": 1, "temperature": 0})
            return
        except (RuntimeError, OSError) as e:
            failure = e
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(WARM_UP_EXIT_S)
        ended = self.exited(" at its warm-up request")
        if ended is not None:
            raise ended from None
        raise RuntimeError(f"vLLM failed its warm-up request: {failure}") from None

    def get(self, path: str, timeout: float = CALL_TIMEOUT) -> int:
        """GET's status."""
        return self.read(path, timeout)[0]

    def read(self, path: str, timeout: float = CALL_TIMEOUT) -> tuple[int, str]:
        """GET's status and text."""
        request = urllib.request.Request(self.base_url + path, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, ""

    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = CALL_TIMEOUT) -> str:
        """POST to vLLM; its answer's text, or RuntimeError with vLLM's own message on an error status."""
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(self.base_url + path, data=data, method="POST",
                                         headers=self._headers() | {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            raise RuntimeError(f"vLLM answered {e.code} to {path}: {_message(text)}") from None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def pids(self) -> list[int]:
        """vLLM's processes: its API server and what it started (engine core, workers)."""
        if self.process is None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root.pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.Error:
            return []

    def host_bytes(self) -> int:
        """Memory vLLM's processes hold on their own (unique set sizes: shared libraries counted once)."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_full_info().uss
        return total

    def stop(self) -> None:
        """SIGTERM to vLLM's whole session, SIGKILL after a grace period."""
        self.stopping = True
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                pass
        self.kill_rest()

    def kill_rest(self) -> None:
        """SIGKILL whatever of vLLM's session is left: its engine core and workers outlive an API server that was
        killed outright, holding their memory."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class VllmModel:
    """The worker's engine for a vLLM replica: what it tells the agent, and the commands it takes."""

    batcher = None  # generations go to vLLM directly, through the agent's relay
    asleep = False

    def __init__(self, spec: WorkerSpec, server: VllmServer, weights_bytes: int, load_seconds: float) -> None:
        self.spec = spec
        self.server = server
        self.device = spec.device
        self.weights_bytes = weights_bytes
        self.load_seconds = load_seconds
        self.adapters: dict[str, dict[str, Any]] = {}  # name -> {"path", "nbytes"}
        self.commands: dict[str, Callable[[Any], Any]] = {
            "adapters": self.configure_adapters,
            "adapter_stats": lambda _payload: {"stats": self._stats()},
            "sleep": self.sleep,
            "wake": self.wake,
        }
        self.max_positions = 0
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
            self.max_positions = int(json.loads(server.read("/v1/models")[1])["data"][0]["max_model_len"])

    def describe(self) -> dict[str, Any]:
        """What the agent needs to relay requests (the port and key) and what metadata shows."""
        return {"engine": "vllm", "port": self.server.port, "key": self.server.key, "pids": self.server.pids(),
                "max_positions": self.max_positions}

    def measure(self) -> dict[str, Any]:
        """On CPU: what vLLM's processes hold; on CUDA the agent reads NVML for its pids (describe's "pids")."""
        held = self.server.host_bytes()
        cuda = self.device.startswith("cuda")
        return {"device": "cuda" if cuda else "cpu", "batch": 1, "seq": max(1, self.max_positions),
                "weights_bytes": self.weights_bytes, "peak_bytes": held, "total_bytes": held,
                "load_seconds": self.load_seconds}

    def configure_adapters(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Unload, then load at runtime what the placement lists; a refused adapter is reported (`failures`: each
        one's reason, which requests for it are answered with), the rest apply."""
        errors, failures = [], {}
        for name in payload.get("unload", ()):
            if name in self.adapters:
                try:
                    self.server.post("/v1/unload_lora_adapter", {"lora_name": name})
                    del self.adapters[name]
                except (RuntimeError, OSError) as e:
                    errors.append(f"adapter {name!r}: {e}")
        for adapter in payload.get("load", ()):
            name, path = adapter["name"], adapter["path"]
            if self.adapters.get(name, {}).get("path") == path:
                continue
            try:
                self.server.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
                self.adapters[name] = {"path": path, "nbytes": _directory_bytes(path)}
            except (RuntimeError, OSError) as e:
                errors.append(f"adapter {name!r}: {e}")
                failures[name] = str(e)
        return {"stats": self._stats(), "errors": errors, "failures": failures}

    def _stats(self) -> dict[str, Any]:
        # vLLM keeps its own device and host tiers and counts no hits: every loaded adapter is reported on the
        # device tier, which is where a request finds it.
        adapters = [{"name": n, "tier": "gpu", "pinned": False, "nbytes": a["nbytes"], "requests": 0, "hits": 0,
                     "misses": 0} for n, a in sorted(self.adapters.items())]
        return {"adapters": adapters, "totals": {"hits": 0, "misses": 0, "evictions": 0, "adapters": len(adapters)}}

    def sleep(self, _payload: Any = None) -> dict[str, Any]:
        """vLLM sleep level 1 (weights to host memory, KV cache dropped); CUDA only."""
        if not self.device.startswith("cuda"):
            raise InputError("vLLM cannot sleep on CPU (its sleep mode needs CUDA)")
        started = time.monotonic()
        self.server.post("/sleep?level=1")
        return self._moved("sleep", started, host_bytes=self.weights_bytes)

    def wake(self, _payload: Any = None) -> dict[str, Any]:
        started = time.monotonic()
        self.server.post("/wake_up")
        return self._moved("wake", started, host_bytes=0)

    def _moved(self, direction: str, started: float, host_bytes: int) -> dict[str, Any]:
        seconds = time.monotonic() - started
        return {"direction": direction, "bytes": self.weights_bytes, "seconds": seconds, "host_bytes": host_bytes,
                "bandwidth": self.weights_bytes / seconds if seconds > 0 else 0.0}

    def recover_from_oom(self) -> None:
        """Nothing of vLLM's memory is this process's to free."""

    def watch(self, failed: Callable[[str], None]) -> None:
        """Call `failed` with vLLM's exit status and last lines should it exit on its own."""
        threading.Thread(target=self._watch, args=(failed,), name="modelgrid-vllm-watch", daemon=True).start()

    def _watch(self, failed: Callable[[str], None]) -> None:
        assert self.server.process is not None
        self.server.process.wait()
        if not self.server.stopping:
            reason = str(self.server.exited())
            self.server.kill_rest()
            failed(reason)


def load(spec: WorkerSpec, progress: Callable[[int, int], Any] | None = None, artifact: Any = None) -> VllmModel:
    """Start vLLM for `spec` and wait until it serves; the worker's engine for it. Stops vLLM if it fails."""
    weights = int(getattr(artifact, "weights_bytes", 0) or 0)
    started = time.monotonic()
    server = VllmServer(spec)
    stop_on_sigterm(server)
    server.start()
    try:
        server.wait_healthy(lambda _done: progress(weights, weights) if progress else None)
        server.warm_up(spec.deployment or spec.model_path)
        model = VllmModel(spec, server, weights, time.monotonic() - started)
    except BaseException:
        server.stop()
        raise
    return model


def _message(text: str) -> str:
    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
        body = json.loads(text)
        return str(body.get("error", {}).get("message") or body.get("message") or body.get("detail") or text)[:500]
    return text[:500]


def _directory_bytes(path: str) -> int:
    with contextlib.suppress(OSError):
        return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())
    return 0
