"""The embedded all-in-one: console (ASGI) + scheduler loop + one local agent with simulated GPUs."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import uvicorn
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from agent.protocol.hostnames import host_name_argument as host_name
from console.connections import raise_descriptor_limit, server_options
from console.control.loop import scheduler_loop
from console.events.record import command_actor
from console.fleet.models import AgentCredential
from console.gctune import tune

# Shutdown (SIGTERM or Ctrl-C) ends the process within SHUTDOWN_DEADLINE seconds, whatever is stuck: in-flight
# requests get SERVER_DRAIN_TIMEOUT to finish, the agent AGENT_STOP_TIMEOUT to stop its workers (it gives each
# 5 s, in parallel, before killing it), a scheduler process (--scheduler-process) SCHEDULER_PROCESS_STOP_TIMEOUT,
# all three at once, and the interpreter's own exit EXIT_GRACE once all that is done.
SERVER_DRAIN_TIMEOUT = 4.0
AGENT_STOP_TIMEOUT = 7.0
SCHEDULER_STOP_TIMEOUT = 0.5  # after the server and the agent: to end its pass, then to take a cancel
SCHEDULER_PROCESS_STOP_TIMEOUT = 7.0  # --scheduler-process: from SIGTERM, to end its pass and step down
EXIT_GRACE = 1.0
SHUTDOWN_DEADLINE = 9.5
# The local agent's token, kept in the data dir (0600) across restarts: a `kill -9` of `up` leaves no one to
# stop the agent it started, and a rotated token would refuse that agent forever if it ever outlived `up`.
LOCAL_AGENT_TOKEN_FILE = "local-agent.token"
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
LOCAL_AGENT = "local agent"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # `up` owns SIGINT/SIGTERM so it can stop the agent and its workers after the server.
        yield


class _ExitDeadline:
    """Ends the process when stopping takes too long. Django runs sync views and ORM calls in worker threads
    that Python can neither interrupt nor leave behind (the interpreter joins them at exit), so one stuck in a
    database lock or in CPU work would keep `up` alive after SIGTERM; this does not wait for them."""

    def __init__(self, before_exit: Callable[[], None]) -> None:
        self._before_exit = before_exit
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, seconds: float, code: int, why: str) -> None:
        """Exit with `code` in `seconds` unless the process has ended by then (replaces an earlier arm)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(seconds, self._expire, (code, why))
            self._timer.daemon = True  # never what keeps the process alive
            self._timer.start()

    def _expire(self, code: int, why: str) -> None:
        self._before_exit()
        with contextlib.suppress(Exception):
            sys.stderr.write(why + "\n")
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def local_agent_token(name: str, data_dir: Path) -> str:
    """The local agent's token: the one kept in the data dir while it still authenticates as `name`, else a new
    one (issued, rotating any other, and kept there, readable by its owner only)."""
    path = Path(data_dir) / LOCAL_AGENT_TOKEN_FILE
    with contextlib.suppress(FileNotFoundError):
        kept = path.read_text().strip()
        row = AgentCredential.authenticate(kept) if kept else None
        if row is not None and row.host_name == name:
            return kept
    token = AgentCredential.issue(name, actor=command_actor("up"))[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".new")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()  # left by a crash: O_EXCL below must create the file with our mode
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(partial, path)  # a crash leaves the old token or the new one, never half of one
    return token


def _check_migrated() -> None:
    """Refuse to serve a database that `migrate` has not brought up to this version (up --no-migrate)."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if pending:
        raise CommandError(f"the database is not migrated ({len(pending)} migration(s) to apply, the first "
                           f"{pending[0][0].app_label}.{pending[0][0].name}): run `manage.py migrate` once, then "
                           "start the consoles (--no-migrate leaves it to you)")


def _keep_private() -> None:
    """This process's /proc/PID files (its environment above all, which holds the console's secrets) readable by
    root only: the engines the local agent runs are processes of this user (agent/privacy.py does the same for
    the agent). Children get theirs back at exec."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _die_with_parent(parent: int) -> Callable[[], None]:
    """For the local agent's preexec_fn: the kernel sends it SIGTERM when `up` dies, even by SIGKILL, so it stops
    its workers instead of living on as an orphan (PR_SET_PDEATHSIG, Linux; elsewhere a no-op). The signal fires
    when the thread that forked it ends: asyncio forks on the event loop's thread, the main thread, which lives
    as long as `up`. libc is loaded here, before the fork; the child runs only prctl and getppid before exec."""
    if sys.platform != "linux":
        return lambda: None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # `up` died before prctl: nothing would signal us
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


def _loop_factory():
    """uvloop where it is installed (a faster event loop for the gateway and the agent link), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _listen(host: str, port: int) -> socket.socket:
    """Bind the console's socket ourselves, so a busy port is one clear error, not a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only for sockets it knows are TCP, and with Nagle on
    # every small response waits ~40 ms for the client's delayed ACK between its headers and body.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Command(BaseCommand):
    help = "Run the console, the scheduler loop and a local agent with simulated GPUs."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--gpus", default="sim:2x24GiB", help="the local agent's GPUs: sim:NxSIZE or nvml")
        parser.add_argument("--data-dir", help="SQLite database and model store (default ./var or MODELGRID_DATA_DIR)")
        parser.add_argument("--no-agent", action="store_true", help="do not start a local agent")
        parser.add_argument("--no-migrate", action="store_true",
                            help="do not migrate the database at start, and refuse to start if it is not migrated: "
                            "where several consoles share one database, `manage.py migrate` runs once before them "
                            "(a Helm hook Job, a compose one-shot service)")
        parser.add_argument("--agent-name", default="local", type=host_name, help="host name of the local agent")
        parser.add_argument("--scheduler-process", action="store_true",
                            help="run the scheduler (its election, passes and chores) in a child process "
                            "(`manage.py scheduler`) instead of in this one, which then serves pages, the API, the "
                            "gateway and agent links alone: for big fleets on machines with cores to spare "
                            "(docs/operations.md); needs REDIS_URL")
        parser.add_argument("--sleep-budget", help="host memory the local agent keeps sleeping replicas in, "
                            "e.g. 8GiB (default: half the host's RAM; 0: idle replicas stop instead)")
        parser.add_argument("--cpu-threads", type=int, help="threads per CPU worker of the local agent (default: "
                            "the host's cores divided among its simulated GPUs)")

    def handle(self, **opts):
        if opts["scheduler_process"] and settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("InMemoryChannelLayer"):
            raise CommandError("--scheduler-process needs the Redis channel layer (set REDIS_URL): the scheduler's "
                               "pushes and the wake-ups it answers cross processes through it")
        try:
            sock = _listen(opts["host"], opts["port"])
        except OSError as e:
            raise CommandError(
                f"cannot listen on {opts['host']}:{opts['port']}: {e.strerror}. "
                "Is another ModelGrid running? Choose another --port."
            ) from None
        _keep_private()
        if opts["no_migrate"]:
            _check_migrated()
        else:
            call_command("migrate", interactive=False, verbosity=0)
        call_command("ensureadmin")
        settings.MODEL_STORE.mkdir(parents=True, exist_ok=True)
        token = None if opts["no_agent"] else local_agent_token(opts["agent_name"], settings.DATA_DIR)
        connections.close_all()  # from here on the DB is used from the async loop's worker thread
        self._pids: dict[str, int] = {}  # each child process running now, by what it is (_child)
        self._deadline = _ExitDeadline(before_exit=self._kill_agent)
        try:
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                runner.run(self._serve(opts, sock, token))
        except BaseException:
            self._deadline.arm(EXIT_GRACE, 1, "ModelGrid stopped on an error; not waiting for stuck worker threads")
            raise

    def _kill_agent(self) -> None:
        # The agent and its workers: killed, an agent cannot stop them, and a replica worker that outlives its agent
        # waits for another to adopt it (--orphan-timeout). Nothing of the embedded fleet outlives `up`.
        agent = self._pids.get(LOCAL_AGENT)
        if agent is None:
            return
        children: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(agent).children(recursive=True)  # listed while they are its own
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()

    async def _serve(self, opts, sock: socket.socket, agent_token: str | None) -> None:
        from console.asgi import application

        tune()  # the console is imported: freeze it, and collect less often (console/gctune.py)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal() -> None:
            if not stop.is_set():
                self._deadline.arm(SHUTDOWN_DEADLINE, 1, f"ModelGrid did not stop within {SHUTDOWN_DEADLINE:g} s "
                                   "of the signal; exiting now (the local agent, if any, is killed)")
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)

        port = sock.getsockname()[1]
        # After SERVER_DRAIN_TIMEOUT uvicorn cancels the requests still running (a sync view's thread runs on).
        raise_descriptor_limit()
        config = uvicorn.Config(application, lifespan="off", log_level="warning", ws="websockets-sansio",
                                timeout_graceful_shutdown=SERVER_DRAIN_TIMEOUT, **server_options())
        server = _Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if serving.done():
                await serving
                raise CommandError("the console stopped while starting")
            await asyncio.sleep(0.02)
        host = f"[{opts['host'].strip('[]')}]" if ":" in opts["host"] else opts["host"]
        url = f"http://{host}:{port}/"
        self.stdout.write(f"ModelGrid console: {url}")
        self.stdout.flush()

        bounded = [serving]
        schedulers = set()  # the loop here, unless it runs in a child process (bounded, as the agent)
        if opts["scheduler_process"]:
            bounded.append(asyncio.create_task(self._scheduler_process(stop)))
        else:
            schedulers.add(asyncio.create_task(scheduler_loop(stop, settings.MODELGRID_SCHEDULER_INTERVAL)))
        if agent_token:
            bounded.append(asyncio.create_task(self._local_agent(url, agent_token, opts, stop)))
        await stop.wait()
        self.stdout.write("stopping ModelGrid…")
        self.stdout.flush()
        server.should_exit = True
        # Both bound themselves: the server by SERVER_DRAIN_TIMEOUT, the agent by AGENT_STOP_TIMEOUT.
        await asyncio.wait(bounded)
        # The scheduler ends after its current pass; a pass stuck in the database is cancelled (its thread is
        # left behind, as a stuck request's is).
        stuck = (await asyncio.wait(schedulers, timeout=SCHEDULER_STOP_TIMEOUT))[1] if schedulers else set()
        for task in stuck:
            task.cancel()
        if stuck:
            await asyncio.wait(stuck, timeout=SCHEDULER_STOP_TIMEOUT)
        for task in [*bounded, *schedulers]:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.stderr.write(f"while stopping: {task.exception()!r}")
        # Everything ModelGrid owns has stopped. What remains are worker threads the interpreter would join
        # at exit: a stuck one (a request waiting on a lock, a sync view in CPU work) must not hold the exit.
        self._deadline.arm(EXIT_GRACE, 0, "ModelGrid stopped; not waiting for work stuck in worker threads")

    async def _local_agent(self, url: str, token: str, opts, stop: asyncio.Event) -> None:
        """Run the local agent as a child process; restart it if it dies; stop it on shutdown."""
        # Its token is the one `up` keeps; a token file meant for another agent must not make it refuse two sources.
        env = {k: v for k, v in os.environ.items() if k != "MODELGRID_AGENT_TOKEN_FILE"}
        env["MODELGRID_AGENT_TOKEN"] = token
        cmd = [sys.executable, "-m", "agent", "run", "--console", url.rstrip("/"), "--name", opts["agent_name"],
               "--gpus", opts["gpus"], "--listen", f"{opts['host']}:0",
               # Nothing of the embedded fleet outlives `up`: no worker waits for an agent to adopt it.
               "--stop-workers-on-exit"]
        if opts.get("sleep_budget"):
            cmd += ["--sleep-budget", opts["sleep_budget"]]
        if opts.get("cpu_threads"):
            cmd += ["--cpu-threads", str(opts["cpu_threads"])]
        await self._child(LOCAL_AGENT, cmd, env, stop, AGENT_STOP_TIMEOUT)

    async def _scheduler_process(self, stop: asyncio.Event) -> None:
        """`manage.py scheduler` as a child process: it takes part in the election for this `up`. Its passes and
        chores then share no interpreter (no GIL) with the links' intake; its pushes reach the links here through
        one channel-layer message per pass (console/control/hub.py)."""
        cmd = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "scheduler"]
        await self._child("scheduler process", cmd, dict(os.environ), stop, SCHEDULER_PROCESS_STOP_TIMEOUT)

    async def _child(self, what: str, cmd: list[str], env: dict, stop: asyncio.Event, stop_timeout: float) -> None:
        """Run `cmd` until `stop`, restarted 2 s after it dies; on `stop`, SIGTERM, then SIGKILL after
        `stop_timeout`. It dies with `up` even by SIGKILL (_die_with_parent)."""
        while not stop.is_set():
            # preexec_fn runs Python between fork and exec, which is unsafe only if it touches locks another
            # thread held at the fork; prctl through a preloaded ctypes function touches none.
            proc = await asyncio.create_subprocess_exec(*cmd, env=env, preexec_fn=_die_with_parent(os.getpid()))
            self._pids[what] = proc.pid
            waiter = asyncio.create_task(proc.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done() and not stop.is_set():  # (a Ctrl-C reaches the child too: that is no crash)
                del self._pids[what]  # reaped: the pid may be anyone's now
                stopper.cancel()
                self.stderr.write(f"{what} exited with code {proc.returncode}; restarting in 2 s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2)
                continue
            # Shutdown: SIGTERM lets it stop cleanly (the agent its workers); kill only if it hangs.
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(waiter, stop_timeout)
            except TimeoutError:
                self.stderr.write(f"the {what} did not stop within {stop_timeout:g} s; killing it")
                proc.kill()
                await waiter
            del self._pids[what]
