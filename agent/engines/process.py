"""What every engine that runs as a server process of its worker needs: a loopback port, dying with the worker,
stopping first when the worker is told to stop, and its end in words."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
from typing import Any, Protocol


class Stoppable(Protocol):
    def stop(self) -> None: ...


def stop_on_sigterm(server: Stoppable) -> None:
    """The agent stops a worker with SIGTERM: its engine's server goes first."""
    def stop(_signum: int, _frame: Any) -> None:
        server.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


# Resolved here, not in the child: between fork and exec only async-signal-safe work is safe (the worker has threads).
_PRCTL = _libc_prctl()


def die_with_parent() -> None:
    """In the engine's process before it runs: the kernel kills it when its worker dies, even by SIGKILL."""
    if _PRCTL is not None:
        _PRCTL(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def free_port() -> int:
    """A loopback port free now (the engine binds it a moment later; a clash fails its start, which is retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"
