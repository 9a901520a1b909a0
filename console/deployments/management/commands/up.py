"""The embedded all-in-one: console (ASGI) + scheduler loop + one local agent with simulated GPUs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys

import uvicorn
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from console.deployments.loop import scheduler_loop
from console.fleet.models import AgentCredential

AGENT_STOP_TIMEOUT = 20.0


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # `up` owns SIGINT/SIGTERM so it can stop the agent and its workers after the server.
        yield


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
        parser.add_argument("--agent-name", default="local", help="host name of the local agent")
        parser.add_argument("--sleep-budget", help="host memory the local agent keeps sleeping replicas in, "
                            "e.g. 8GiB (default: half the host's RAM; 0: idle replicas stop instead)")

    def handle(self, **opts):
        try:
            sock = _listen(opts["host"], opts["port"])
        except OSError as e:
            raise CommandError(
                f"cannot listen on {opts['host']}:{opts['port']}: {e.strerror}. "
                "Is another ModelGrid running? Choose another --port."
            ) from None
        call_command("migrate", interactive=False, verbosity=0)
        call_command("ensureadmin")
        settings.MODEL_STORE.mkdir(parents=True, exist_ok=True)
        token = None if opts["no_agent"] else AgentCredential.issue(opts["agent_name"])[1]
        connections.close_all()  # from here on the DB is used from the async loop's worker thread
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(self._serve(opts, sock, token))

    async def _serve(self, opts, sock: socket.socket, agent_token: str | None) -> None:
        from console.asgi import application

        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        port = sock.getsockname()[1]
        config = uvicorn.Config(application, lifespan="off", log_level="warning", ws="websockets-sansio")
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

        tasks = [asyncio.create_task(scheduler_loop(stop, settings.MODELGRID_SCHEDULER_INTERVAL))]
        if agent_token:
            tasks.append(asyncio.create_task(self._local_agent(url, agent_token, opts, stop)))
        await stop.wait()
        self.stdout.write("stopping ModelGrid…")
        server.should_exit = True
        await asyncio.gather(serving, *tasks, return_exceptions=True)

    async def _local_agent(self, url: str, token: str, opts, stop: asyncio.Event) -> None:
        """Run the local agent as a child process; restart it if it dies; stop it on shutdown."""
        env = os.environ | {"MODELGRID_AGENT_TOKEN": token}
        cmd = [sys.executable, "-m", "agent", "run", "--console", url.rstrip("/"), "--name", opts["agent_name"],
               "--gpus", opts["gpus"], "--listen", f"{opts['host']}:0"]
        if opts.get("sleep_budget"):
            cmd += ["--sleep-budget", opts["sleep_budget"]]
        while not stop.is_set():
            proc = await asyncio.create_subprocess_exec(*cmd, env=env)
            waiter = asyncio.create_task(proc.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                stopper.cancel()
                self.stderr.write(f"local agent exited with code {proc.returncode}; restarting in 2 s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2)
                continue
            # Shutdown: SIGTERM lets the agent stop its workers; kill only if it hangs.
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(waiter, AGENT_STOP_TIMEOUT)
            except TimeoutError:
                proc.kill()
                await waiter
