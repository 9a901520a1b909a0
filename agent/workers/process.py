"""The worker process: load one replica, report, then answer inference requests over a Pipe.

Started with the spawn method (CUDA cannot live through fork). torch is imported only after the
environment below is set, inside `main`, so the daemon can import this module without torch.

Messages, worker -> agent: ("loading", info), ("ready", {"measured_bytes": n, ...}),
("failed", {"reason": text}), ("result", request_id, outputs), ("error", request_id, text, bad_input).
Agent -> worker: ("load", spec) (to a warm spare only), ("infer", request_id, inputs), ("stop",).
Tensors are numpy arrays.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from agent.workers.spec import WorkerSpec

_REASON_LIMIT = 1000
log = logging.getLogger("agent.worker")


def main(spec: WorkerSpec | None, conn: Connection) -> None:
    """Worker entry point: exits 1 after reporting a failed load, 0 when the agent goes away.

    Without a spec it is a warm spare: it imports the runtime first, then waits for ("load", spec).
    """
    _die_with_parent()
    # Ctrl-C reaches the whole process group; the agent stops its workers itself, in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    if spec is None:
        _log_as(f"spare {os.getpid()}")
        spec = _wait_as_spare(conn)
        if spec is None:
            return
    _log_as(str(spec.replica_id))
    if not _send(conn, ("loading", {"model_path": spec.model_path, "device": spec.device, "pid": os.getpid()})):
        return
    try:
        from agent.workers import runtime

        model = runtime.load(spec)
        measured = model.measure_bytes()
    except Exception as e:  # any failure to load is reported, never raised into the void
        if isinstance(e, ValueError):  # ArtifactError and our own checks: the message says it all
            log.error("cannot load %s: %s", spec.model_path, e)
        else:
            log.exception("cannot load %s", spec.model_path)
        _send(conn, ("failed", {"reason": describe_error(e)}))
        conn.close()
        sys.exit(1)
    log.info("ready: %s (%s) on %s, %d bytes", spec.deployment or spec.model_path, spec.task, spec.device, measured)
    if _send(conn, ("ready", {"measured_bytes": measured, **model.describe()})):
        _serve(model, conn, runtime.InputError)


def _wait_as_spare(conn: Connection) -> WorkerSpec | None:
    # Importing torch does not initialise CUDA, so the spare can still serve any device.
    with contextlib.suppress(Exception):  # a broken install is reported by the import in main, per replica
        from agent.workers import runtime  # noqa: F401
    try:
        message = conn.recv()
    except (EOFError, OSError):
        return None  # the agent stopped before it needed this spare
    if message[0] != "load":
        return None
    return message[1]


def _log_as(name: str) -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s worker {name}: %(message)s",
        force=True,  # a spare names itself by pid until it learns its replica
    )


def _serve(model: Any, conn: Connection, input_error: type[Exception]) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the agent is gone: so is this worker
        if message[0] == "stop":
            return
        if message[0] != "infer":
            log.warning("ignoring unknown message %r", message[0])
            continue
        _, request_id, inputs = message
        try:
            reply: tuple = ("result", request_id, model.infer(inputs))
        except input_error as e:
            reply = ("error", request_id, str(e), True)
        except Exception as e:
            log.exception("inference failed")
            reply = ("error", request_id, describe_error(e), False)
        if not _send(conn, reply):
            return


def describe_error(error: BaseException) -> str:
    """One line a person can act on: the exception type and its message, bounded in length."""
    text = f"{type(error).__name__}: {error}".strip()
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 1] + "…"


def _send(conn: Connection, message: tuple) -> bool:
    try:
        conn.send(message)
        return True
    except (BrokenPipeError, EOFError, OSError):
        return False


def _die_with_parent() -> None:
    # While loading, the worker does not read its pipe, so it would not notice the agent dying
    # (even by SIGKILL). PR_SET_PDEATHSIG has the kernel kill it then. It fires when the thread
    # that spawned the worker exits, which is the agent's event-loop thread. Linux only.
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
