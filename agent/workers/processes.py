"""Worker processes as the agent holds them (no torch): one it spawned, or one a previous agent spawned and this
one adopted.

Workers are started with subprocess (a fresh interpreter, as the spawn start method makes: CUDA cannot live
through fork) in a session of their own, so a signal to the agent's process group (Ctrl-C, a service manager
stopping the agent) does not reach them; a replica worker outlives its agent (agent.workers.rendezvous) and
a spare dies with it (PR_SET_PDEATHSIG, set in the worker). The agent talks to a worker it spawned over one end
of a socket pair the worker inherits; to an adopted worker, over the worker's own socket.

Both kinds expose what multiprocessing's Process did: pid, sentinel (a descriptor readable once the process is
gone: a pidfd where Linux has them), exitcode, terminate, kill, join, is_alive, close.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from agent.workers.environment import child_environment

# The worker's entry point, run as `python <WORKER_COMMAND> <descriptor> <agent pid> spare|cold` (tests run a
# torch-free one).
WORKER_COMMAND: tuple[str, ...] = ("-m", "agent.workers")
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])  # where `agent` is importable from


def spawn_worker(spare: bool = False) -> tuple[SpawnedProcess, Connection]:
    """Start a worker that waits for its Load message (a spare imports torch meanwhile); returns the process and
    the agent's end of its connection. OSError when no process can be made."""
    agent_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # Without pidfds, the exit shows as EOF on a pipe whose write end only the worker holds (multiprocessing's way).
    watch = None if _HAVE_PIDFD else os.pipe()
    passed = (worker_end.fileno(),) if watch is None else (worker_end.fileno(), watch[1])
    env = child_environment()  # no secret of the agent's (or of the console it may run inside)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, os.environ.get("PYTHONPATH")]))
    try:
        popen = subprocess.Popen(
            [sys.executable, *WORKER_COMMAND, str(worker_end.fileno()), str(os.getpid()), "spare" if spare else "cold"],
            pass_fds=passed,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: the agent's signals are not its own
        )
    except BaseException:
        agent_end.close()
        if watch is not None:
            os.close(watch[0])
        raise
    finally:
        worker_end.close()  # only the worker holds its end now, so its death reads as EOF here
        if watch is not None:
            os.close(watch[1])
    return SpawnedProcess(popen, None if watch is None else watch[0]), Connection(agent_end.detach())


def worker_connection(descriptor: int) -> Connection:
    """The worker's end of what spawn_worker made (in the worker)."""
    os.set_inheritable(descriptor, False)  # not passed on to anything the worker itself starts
    return Connection(descriptor)


class SpawnedProcess:
    """A worker this agent started: its child, reaped by join()."""

    def __init__(self, popen: subprocess.Popen, watch_pipe: int | None = None) -> None:
        self._popen = popen
        self.pid: int = popen.pid
        self.sentinel: int | None = watch_pipe if watch_pipe is not None else _pidfd(popen.pid)

    @property
    def exitcode(self) -> int | None:
        """The exit status once reaped; -N for a signal N (multiprocessing's convention)."""
        return self._popen.returncode

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def terminate(self) -> None:
        self._popen.send_signal(signal.SIGTERM)  # nothing once reaped: the pid may be another's by then

    def kill(self) -> None:
        self._popen.send_signal(signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def close(self) -> None:
        if self.sentinel is not None:
            with contextlib.suppress(OSError):
                os.close(self.sentinel)
        self.sentinel = None


class AdoptedProcess:
    """A worker a previous agent started: not this agent's child (unless that agent was this same process), so
    its exit status is not ours to read; signalled through its pidfd, which cannot name a recycled pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        pidfd = _pidfd(pid)
        if pidfd is None:
            raise OSError(f"cannot watch process {pid}: it is gone, or this system has no pidfds")
        self.sentinel: int | None = pidfd
        self._pidfd = pidfd
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        return not select.select([self._pidfd], [], [], 0)[0]

    def terminate(self) -> None:
        signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)

    def kill(self) -> None:
        signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        select.select([self._pidfd], [], [], timeout)
        # Reaped here only when it is this process's child after all (an agent restarted in the same process).
        with contextlib.suppress(ChildProcessError, OSError):
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.exitcode = os.waitstatus_to_exitcode(status)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._pidfd)
        self.sentinel = None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _probe_pidfd() -> bool:
    fd = _pidfd(os.getpid())
    if fd is None:
        return False
    os.close(fd)
    return True


_HAVE_PIDFD = _probe_pidfd()
