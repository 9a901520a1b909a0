"""The agent's text pool: a few processes that tokenize prompts and render chat templates off the event loop.

A tokenizer or a chat template is code that came with a model: a pre-tokenizer regex can backtrack for
minutes, a template can loop, a Rust tokenizer can panic. Run on the daemon's loop, one such request stalled
the agent until the console gave it up for dead. Here each job runs in a process of the pool (the connection
is waited on in a thread), under a time limit: a job past it fails its request with a 400 that says so, and its
process is killed and replaced; a job that breaks the tokenizer fails alone. Every other request, and every
stream already running, goes on meanwhile. Jobs beyond `max_waiting` are refused (503) rather than queued
without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from agent.serving.dispatch import BadInput, ServingError
from agent.workers.environment import child_environment

log = logging.getLogger(__name__)

DEFAULT_TEXT_TIMEOUT = 5.0  # seconds one tokenizing or templating job may take (agent --text-timeout)
DEFAULT_TEXT_WORKERS = 2
DEFAULT_MAX_WAITING = 256
LOAD_TIMEOUT = 60.0  # a model's tokenizer and template read ahead of its first job, and a process's start
MEMORY_BYTES = 4 << 30  # address space per text process: a template that builds a huge string fails alone
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


class TextTimeout(BadInput):
    code = "text_timeout"


class TextBusy(ServingError):
    status, code = 503, "text_pool_busy"


class _Process:
    """One text process and the models it has read."""

    def __init__(self, memory_bytes: int) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = child_environment()  # no secret of the agent's: it renders a team's chat templates
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, os.environ.get("PYTHONPATH")]))
        env["TOKENIZERS_PARALLELISM"] = "false"  # one job at a time; no thread pool per process
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "agent.serving.textproc", str(theirs.fileno()), str(os.getpid()),
                 str(memory_bytes)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(mine.detach())
        self.loaded: set[str] = set()
        self.started = False

    def call(self, job: tuple, timeout: float) -> tuple:
        """Send `job` and wait for its answer (blocking: run it in a thread); TimeoutError past `timeout`,
        EOFError or OSError when the process died."""
        if not self.started:
            self._expect(LOAD_TIMEOUT)  # its "ready", once its imports are done
            self.started = True
        self.conn.send(job)
        return self._expect(timeout)

    def _expect(self, timeout: float) -> tuple:
        if not self.conn.poll(timeout):
            raise TimeoutError
        return self.conn.recv()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.popen.kill()
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.popen.wait(5)


class TextPool:
    """`size` text processes, started on first use; each job waits for a free one."""

    def __init__(self, size: int = DEFAULT_TEXT_WORKERS, timeout_s: float = DEFAULT_TEXT_TIMEOUT,
                 max_waiting: int = DEFAULT_MAX_WAITING, memory_bytes: int = MEMORY_BYTES) -> None:
        self.size, self.timeout_s, self.max_waiting, self.memory_bytes = size, timeout_s, max_waiting, memory_bytes
        self._idle: asyncio.Queue[_Process] | None = None
        self._all: set[_Process] = set()
        self._waiting = 0
        self._closed = False
        self.killed = 0  # processes killed at the time limit or found dead (for tests and metrics)

    async def encode(self, model: str, model_path: str, texts: list[str], *, truncate: bool, param: str
                     ) -> list[list[int]]:
        """Token ids of `texts` with the model's special tokens; `model` and `param` name the model and the
        request's field in errors."""
        return await self._job(("encode", model_path, truncate, texts), model, param, "its tokenizer")

    async def chat(self, model: str, model_path: str, messages: Any) -> list[int]:
        """Token ids of the prompt the model's chat template makes of OpenAI `messages`."""
        return await self._job(("chat", model_path, messages), model, "messages", "its chat template")

    async def close(self) -> None:
        self._closed = True  # a job still running finds its process killed, and nothing is started again
        processes, self._all = list(self._all), set()
        await asyncio.gather(*(asyncio.to_thread(p.kill) for p in processes))

    async def _job(self, job: tuple, model: str, param: str, doer: str) -> Any:
        if self._waiting >= self.max_waiting:
            raise TextBusy(f"{self._waiting} requests are waiting to be tokenized on this host; try again shortly")
        self._waiting += 1
        try:
            process = await self._take()
        finally:
            self._waiting -= 1
        # Shielded: a client that goes away leaves its job to finish (within the time limit), so the process
        # goes back to the pool with its connection in step instead of being killed.
        job_task = asyncio.ensure_future(self._run(process, job, f"model {model!r}: {doer}", param))
        job_task.add_done_callback(_retrieved)  # its caller may be gone: its failure is then nobody's to report
        answer = await asyncio.shield(job_task)
        if answer[0] == "ok":
            return answer[1]
        _, kind, message, where = answer
        if kind == "failed":
            raise BadInput(f"model {model!r}: its tokenizer or chat template failed on this request: {message}",
                           param=param)
        raise BadInput(f"model {model!r}: {message}", param=(where or param) if kind == "input" else "model")

    async def _run(self, process: _Process, job: tuple, doer: str, param: str) -> tuple:
        healthy = False
        try:
            path = job[1]
            if path not in process.loaded:
                answer = await self._call(process, ("load", path), LOAD_TIMEOUT, param, doer)
                if answer[0] != "ok":  # no tokenizer, say: the job would only fail the same way
                    healthy = True
                    return answer
                process.loaded.add(path)
            answer = await self._call(process, job, self.timeout_s, param, doer)
            healthy = True
            return answer
        finally:
            self._give_back(process, healthy)

    async def _call(self, process: _Process, job: tuple, timeout: float, param: str, doer: str) -> tuple:
        began = time.monotonic()
        try:
            return await asyncio.to_thread(process.call, job, timeout)
        except TimeoutError:
            raise TextTimeout(f"{doer} took longer than {timeout:g} s on this request (the agent's text time "
                              "limit, --text-timeout); it was stopped", param=param) from None
        except (EOFError, OSError) as e:
            raise BadInput(f"{doer} crashed on this request after {time.monotonic() - began:.1f} s "
                           f"({type(e).__name__})", param=param) from None

    async def _take(self) -> _Process:
        if self._closed:
            raise TextBusy("this agent is stopping")
        if self._idle is None:
            self._idle = asyncio.Queue()
        while True:
            if self._idle.empty() and len(self._all) < self.size:
                self._spawn()
            process = await self._idle.get()
            if process.popen.poll() is None:
                return process
            self._give_back(process, False)  # died while idle (killed from outside): replaced, not used

    def _spawn(self) -> None:
        process = _Process(self.memory_bytes)
        self._all.add(process)
        self._idle.put_nowait(process)  # its first job waits for its "ready"

    def _give_back(self, process: _Process, healthy: bool) -> None:
        if healthy and process in self._all:
            self._idle.put_nowait(process)
            return
        # Past its time limit, or dead: killed (off the loop) and replaced at once, so the pool stays full.
        self.killed += 1
        self._all.discard(process)
        try:
            asyncio.get_running_loop().run_in_executor(None, process.kill)
        except RuntimeError:  # the loop's executor is shut down (the agent is stopping)
            process.kill()
        if len(self._all) < self.size and not self._closed:
            self._spawn()


def _retrieved(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()

