"""The worker process: load one replica, report, then answer the agent's commands over its connection.

Started as a fresh interpreter by the agent (agent.workers.processes; CUDA cannot live through fork), in a session
of its own. torch is imported only after the environment below is set, inside `main`, so the daemon can import
this module without torch.

Every worker first waits for Load: a warm spare imports the runtime meanwhile, a cold one waits first (its
environment, thread counts and MPS share, must be in place before torch is imported). Until it has a replica
it dies with its agent (PR_SET_PDEATHSIG). A Load that carries `attach` makes it a replica worker that outlives
its agent: it listens on its socket in the agent's state directory and, once its agent is gone, keeps its model
and waits there for the next agent up to its orphan timeout (agent.workers.channel), then exits. A Load that
carries `log_path` sends all it writes from then on, fds 1 and 2, to its replica's log (agent.workers.logs).

What crosses the connection is agent.workers.messages. Worker -> agent: Loading, Progress, then Ready or Failed;
a Reply or a Refusal to each Command, whose `kind` is "input" (the caller's fault), "oom" (out of memory; the
worker carries on), "timeout" (a generation's deadline passed), "unavailable" (the replica went to sleep under
it) or "error"; and after every generation step Tokens, a generation's tokens ending in its Reply or Refusal.
Agent -> worker: Load, Stop, Generate, Cancel, and Commands for kinds in LoadedModel.commands: "infer"
(payload: numpy inputs), "sleep", "wake", ... Several may be in flight. Pings and Describe are answered by the
connection's reader thread (agent.workers.channel).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import logging
import os
import signal
import sys
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from agent.workers import limits, logs
from agent.workers.channel import DETACHED, WorkerChannel
from agent.workers.errors import describe_error
from agent.workers.generation_spec import PromptError
from agent.workers.messages import (
    Attach,
    Cancel,
    Command,
    Failed,
    Generate,
    Load,
    Loading,
    Progress,
    Ready,
    Refusal,
    Reply,
    Stop,
    Tokens,
)
from agent.workers.spec import WorkerSpec

log = logging.getLogger("agent.worker")


def run_from_argv(argv: list[str] | None = None) -> None:
    """`python -m agent.workers <descriptor> <agent pid> spare|cold`, as agent.workers.processes starts it."""
    from agent.workers.processes import worker_connection

    args = sys.argv[1:] if argv is None else argv
    descriptor, agent_pid, role = int(args[0]), int(args[1]), args[2]
    main(worker_connection(descriptor), agent_pid, spare=role == "spare")


def main(conn: Connection, agent_pid: int | None = None, spare: bool = False) -> None:
    """Worker entry point: exits 1 after reporting a failed load, 0 when no agent is left to serve.

    A spare imports the runtime first, then waits for Load(spec); a cold worker gets its Load at once.
    """
    if not _die_with_parent(agent_pid):
        return
    # Its own session keeps the terminal's Ctrl-C away from it; the agent stops its workers itself, in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    # Warnings too: a replica's output is its own log (agent.workers.logs), and transformers words some load
    # failures only in a warning ("For details look at the above report!": which keys mismatched, and how).
    os.environ["TRANSFORMERS_VERBOSITY"] = "warning"
    channel = WorkerChannel(conn)
    channel.start()
    try:
        _load_and_serve(channel, spare)
    finally:
        channel.close()


def _load_and_serve(channel: WorkerChannel, spare: bool) -> None:
    _log_as(f"spare {os.getpid()}" if spare else f"pid {os.getpid()}")
    load = _wait_for_load(channel, spare)
    if load is None:
        return
    spec = load.spec
    if load.log_path is not None:
        _write_to(load.log_path)
    _log_as(str(spec.replica_id))
    log.info("worker pid %d for replica %d (%s) on %s", os.getpid(), spec.replica_id,
             spec.deployment or spec.model_path, spec.device)
    if load.attach is not None:
        _outlive_agent(channel, spec, load.attach)
    limits.before_cuda(spec)  # nothing has touched CUDA yet, in a spare either
    try:
        from agent import engines

        engine = engines.get(spec.engine)
        runtime = engine.loader()
        artifact = engine.inspect(spec.model_path)  # every header, read once for the whole load
        if not channel.send(Loading(spec.model_path, spec.device, os.getpid(), artifact.weights_bytes)):
            return
        model = runtime.load(spec, progress=lambda done, of: channel.send(Progress(done, of)), artifact=artifact)
        measurement = model.measure()
    except Exception as e:  # any failure to load is reported, never raised into the void
        oom = limits.is_out_of_memory(e)
        if isinstance(e, ValueError) and not oom:  # ArtifactError and our own checks: the message says it all
            log.error("cannot load %s: %s", spec.model_path, e)
        else:
            log.exception("cannot load %s", spec.model_path)
        reason = describe_error(e)
        if oom:
            reason = f"out of memory while loading on {spec.device}: {reason}"
        channel.send(Failed(reason, oom))
        channel.close()
        sys.exit(1)
    log.info(
        "ready: %s (%s) on %s, %d bytes measured",
        spec.deployment or spec.model_path, spec.task, spec.device, measurement["total_bytes"],
    )
    watch = getattr(model, "watch", None)
    if watch is not None:  # an engine in processes of its own: its exit is this replica's failure
        watch(lambda reason: _engine_failed(channel, reason))
    if channel.send(Ready(measurement, model.describe())):
        serve(model, channel, runtime.InputError)


def _engine_failed(channel: WorkerChannel, reason: str) -> None:
    """The engine's own processes ended under a loaded replica: report why, and end the worker with it."""
    log.error("%s", reason)
    channel.send(Failed(reason, False))
    channel.close()
    os._exit(1)


def _wait_for_load(channel: WorkerChannel, spare: bool) -> Load | None:
    if spare:
        # Importing torch does not initialise CUDA, so the spare can still serve any device and MPS share.
        with contextlib.suppress(Exception):  # a broken install is reported by the import in main, per replica
            from agent.workers import runtime  # noqa: F401
    message = channel.recv()
    if not isinstance(message, Load):
        return None  # the agent stopped before it needed this worker
    return message


def _outlive_agent(channel: WorkerChannel, spec: WorkerSpec, attach: Attach) -> None:
    """Listen for the next agent, and only then stop dying with this one. A worker that cannot listen serves
    on, but dies with its agent, as before."""
    try:
        channel.attach(spec, attach)
    except OSError as e:
        log.warning("cannot listen on %s (%s): this worker ends with its agent", attach.socket_path, e)
        return
    _set_parent_death_signal(0)


def _write_to(log_path: str) -> None:
    """Send everything this worker writes (Python and C alike) to its replica's log, from here on."""
    try:
        logs.redirect_output(log_path)
    except OSError as e:
        log.warning("cannot write to %s (%s): this worker's output goes to its agent's", log_path, e)
        return
    faulthandler.enable()  # a crash in C code (SIGSEGV, SIGABRT) leaves the Python stack in the log


def _log_as(name: str) -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s worker {name}: %(message)s",
        force=True,  # a spare names itself by pid until it learns its replica
    )


def serve(model: Any, channel: WorkerChannel, input_error: type[Exception]) -> None:
    """Answer the agent until it says stop or goes away.

    Generations run in the model's continuous batcher, one step per turn of this loop; every other command
    (a forward batch, sleep, wake, adapters) runs between two steps, one per turn, so a v2 or embedding
    request waits at most one decoding step, and a decoding stream at most one command.
    """
    commands: deque[Command] = deque()
    batcher = getattr(model, "batcher", None)
    while True:
        generating = batcher is not None and batcher.busy
        for message in channel.take(wait=not commands and not generating):
            if message is None or isinstance(message, Stop):
                return  # no agent is left, or it asked: so is this worker
            if message is DETACHED:
                # Its agent went away: what it asked for has nobody to go to. The model stays, for the next agent.
                commands.clear()
                if batcher is not None and batcher.busy:
                    batcher.abort("the agent went away", "unavailable")
                continue
            if isinstance(message, Generate):
                _submit(model, batcher, channel, message.request_id, message.request, input_error)
            elif isinstance(message, Cancel):
                if batcher is not None and batcher.cancel(message.request_id) and not batcher.busy:
                    channel.send(Tokens([], batcher.stats()))  # no step follows to say the batch emptied
            elif isinstance(message, Command):
                commands.append(message)
            else:
                log.warning("ignoring unexpected message %s", type(message).__name__)
        if commands:
            command_message = commands.popleft()
            kind, request_id, payload = command_message.kind, command_message.request_id, command_message.payload
            if kind == "sleep" and batcher is not None and batcher.busy:
                failed = batcher.abort(f"replica {getattr(model.spec, 'replica_id', '?')} went to sleep", "unavailable")
                if not all(channel.send(Refusal(f.request_id, f.text, f.kind)) for f in failed):
                    return
            command = model.commands.get(kind)
            if command is None:
                reply: Reply | Refusal = Refusal(request_id, f"this worker has no command {kind!r}", "error")
            else:
                reply = _run(model, kind, request_id, command, payload, input_error)
            if not _reply(model, channel, kind, reply):
                return
            channel.settled(kind, reply)
            after_reply = getattr(model, "after_reply", None)
            if after_reply is not None:
                after_reply(kind)
        if batcher is not None and batcher.busy and not _step(model, batcher, channel):
            return


def _reply(model: Any, channel: WorkerChannel, kind: str, reply: Reply | Refusal) -> bool:
    """Send a reply; one too big to pickle within the worker's memory cap becomes an "oom" refusal (nothing
    of it reached the pipe: pickling comes first), and the worker serves on. False when the agent is gone."""
    request_id = reply.request_id
    try:
        return channel.send(reply)
    except MemoryError as e:
        text = f"out of memory while sending the {kind} answer on {model.device}: {describe_error(e)}"
    del reply  # the answer itself, freed before recovering
    log.warning("%s", text)
    model.recover_from_oom()
    return channel.send(Refusal(request_id, text, "oom"))


def _submit(model: Any, batcher: Any, channel: WorkerChannel, request_id: int, request: Any,
            input_error: type[Exception]) -> None:
    if batcher is None:
        channel.send(Refusal(request_id, "this model is an encoder: it embeds, it does not generate", "input"))
    elif getattr(model, "asleep", False):
        channel.send(Refusal(request_id, "the model is asleep: wake it before inference", "unavailable"))
    else:
        try:
            batcher.submit(request_id, request)
        except (PromptError, input_error) as e:
            channel.send(Refusal(request_id, str(e), "input"))


def _step(model: Any, batcher: Any, channel: WorkerChannel) -> bool:
    """One batcher step, each of its phases' tokens streamed in one message as soon as the phase is done (a
    newcomer's first token does not wait for the running batch's forward); False when the agent is gone.
    A step that raises outside any one sequence's forward fails every generation under way, not the worker."""
    try:
        for out in batcher.phases():
            if not _send_step(model, batcher, channel, out):
                return False
    except Exception as e:  # noqa: BLE001 (its sequences are told; the model serves the next ones)
        log.exception("a generation step failed")
        failed = batcher.abort(f"the generation step failed: {describe_error(e)}", "error")
        return all(channel.send(Refusal(f.request_id, f.text, f.kind)) for f in failed)
    return True


def _send_step(model: Any, batcher: Any, channel: WorkerChannel, out: Any) -> bool:
    """One phase's tokens, finished and failed sequences to the agent; False when it is gone."""
    sent = channel.send(Tokens(out.tokens, batcher.stats()))
    for request_id, result in out.finished:
        sent = sent and channel.send(Reply(request_id, result))
    for failure in out.failed:
        sent = sent and channel.send(Refusal(failure.request_id, failure.text, failure.kind))
    if any(f.kind == "oom" for f in out.failed):
        log.warning("out of memory while generating: %s", out.failed[0].text)
        model.recover_from_oom()
    return sent


def _run(
    model: Any, kind: str, request_id: int, command: Any, payload: Any, input_error: type[Exception]
) -> Reply | Refusal:
    try:
        return Reply(request_id, command(payload))
    except input_error as e:
        return Refusal(request_id, str(e), "input")
    except Exception as e:
        if not limits.is_out_of_memory(e):
            log.exception("%s failed", kind)
            return Refusal(request_id, describe_error(e), "error")
        text = f"out of memory during {kind} on {model.device}: {describe_error(e)}"
    # Out of memory: one request too big for this replica's share. Outside the except block the
    # failed call's frames (and the tensors they hold) are gone, so recovering frees them too.
    log.warning("%s", text)
    model.recover_from_oom()
    return Refusal(request_id, text, "oom")


def _die_with_parent(agent_pid: int | None) -> bool:
    """Until it has a replica to keep, a worker dies with its agent. False when the agent is already gone."""
    # While importing or waiting, the worker may not notice the agent dying (even by SIGKILL).
    # PR_SET_PDEATHSIG has the kernel kill it then. It fires when the thread that spawned the worker
    # exits, which is the agent's event-loop thread. Linux only.
    _set_parent_death_signal(int(signal.SIGKILL))
    return agent_pid is None or os.getppid() == agent_pid  # it may have died before the line above


def _set_parent_death_signal(signum: int) -> None:
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signum)  # 1 = PR_SET_PDEATHSIG; 0 clears it
    except (OSError, AttributeError):
        return
