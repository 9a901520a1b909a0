"""Command line: `python -m agent run ...`, `python -m agent demo-models DIR` and `python -m agent estimate PATH`.

Nothing heavy is imported at module level: `--help` must stay instant and torch-free.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

import agent
from agent import engines
from agent.protocol.hostnames import host_name_argument as host_name
from agent.replicas import DEFAULT_DRAIN_TIMEOUT
from agent.serving.textpool import DEFAULT_TEXT_TIMEOUT, DEFAULT_TEXT_WORKERS
from agent.workers.generation_spec import DEFAULT_GENERATION_TIMEOUT
from agent.workers.rendezvous import DEFAULT_ORPHAN_TIMEOUT

if TYPE_CHECKING:
    from agent.daemon import Agent

TOKEN_ENV = "MODELGRID_AGENT_TOKEN"
TOKEN_FILE_ENV = "MODELGRID_AGENT_TOKEN_FILE"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agent", description="ModelGrid host agent")
    parser.add_argument("--version", action="version", version=f"modelgrid-agent {agent.__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="connect to the console, run workers and serve inference")
    run.add_argument("--console", required=True, help="console base URL, e.g. http://127.0.0.1:8000")
    run.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"agent token (default: ${TOKEN_ENV})")
    run.add_argument("--token-file", default=os.environ.get(TOKEN_FILE_ENV), metavar="PATH",
                     help="a file that holds the agent token, read once at start; it must not be readable by every "
                     f"user (default: ${TOKEN_FILE_ENV}). Give the token one way only")
    run.add_argument("--name", default=socket.gethostname(), type=host_name,
                     help="host name to register (default: this host's); ASCII letters, digits, '-' and '_' in "
                     "dot-separated labels")
    run.add_argument("--gpus", default="nvml", help="'nvml' (default) or simulated GPUs like sim:2x24GiB")
    run.add_argument(
        "--listen",
        default="127.0.0.1:0",
        type=_address,
        help="HOST:PORT for the inference server (default 127.0.0.1:0, a free port)",
    )
    run.add_argument("--advertise", default="", help="inference base URL to announce (default: from --listen)")
    run.add_argument("--report-interval", default=2.0, type=_positive, help="seconds between host reports")
    run.add_argument(
        "--warm-workers",
        default=1,
        type=_count,
        help="worker processes kept spawned with torch imported, so a new replica starts faster (default 1, 0: off)",
    )
    run.add_argument(
        "--sleep-budget",
        default=None,
        type=_size,
        help="host memory for sleeping replicas' weights, like 64GiB or bytes; beyond it the least recently "
        "used are stopped (default: half of this host's RAM)",
    )
    run.add_argument("--heartbeat-timeout", default=10.0, type=_positive,
                     help="seconds a loaded worker may miss heartbeats before it is killed and replaced (default 10)")
    run.add_argument("--mps", action="store_true",
                     help="start the CUDA MPS control daemon (nvidia-cuda-mps-control) and stop it on exit (unless the "
                     "workers are left running for the next agent), so replicas sharing a GPU run at once with their "
                     "mps_percentage of its SMs")
    run.add_argument("--cap-cpu-workers", action=argparse.BooleanOptionalAction, default=True,
                     help="hold each CPU worker (simulated GPUs) to its reservation with an address-space cap, so a "
                     "request too big for its replica fails alone with 507 instead of exhausting the host "
                     "(default on; --no-cap-cpu-workers turns it off)")
    run.add_argument("--cpu-threads", default=None, type=_at_least_one, metavar="N",
                     help="torch threads per CPU worker (simulated GPUs) (default: this host's cores divided among "
                     "its simulated GPUs, or among its replicas when there are more, at least 1)")

    run.add_argument("--generation-timeout", default=DEFAULT_GENERATION_TIMEOUT, type=_timeout, metavar="SECONDS",
                     help="how long a generation may run when the request names no timeout of its own (default "
                     f"{DEFAULT_GENERATION_TIMEOUT:g})")

    run.add_argument("--text-timeout", default=DEFAULT_TEXT_TIMEOUT, type=_positive, metavar="SECONDS",
                     help="how long tokenizing one request's prompt or rendering its chat template may take before "
                     "the request fails with a 400 and the process doing it is replaced "
                     f"(default {DEFAULT_TEXT_TIMEOUT:g})")
    run.add_argument("--text-workers", default=DEFAULT_TEXT_WORKERS, type=_at_least_one, metavar="N",
                     help="processes that tokenize prompts and render chat templates, off the agent's event loop "
                     f"(default {DEFAULT_TEXT_WORKERS})")
    run.add_argument("--drain-timeout", default=DEFAULT_DRAIN_TIMEOUT, type=_positive, metavar="SECONDS",
                     help="a replica that leaves this host (scaled down, moved, put to sleep) takes no new requests "
                     "and gets this long to finish those it has before it goes (default "
                     f"{DEFAULT_DRAIN_TIMEOUT:g})")
    for engine in engines.ENGINES.values():  # an engine that runs a program of its own is told where it is
        if engine.program is not None:
            run.add_argument(engine.program.flag, dest=f"program_{engine.name}", metavar="PATH",
                             default=os.environ.get(engine.program.env) or engine.program.default,
                             help=engine.program.help)
    run.add_argument("--state-dir", default=None, metavar="DIR",
                     help="where replica workers wait for the next agent when this one stops or crashes: their "
                     "sockets and this agent's key (default: $MODELGRID_DATA_DIR/agents/NAME when that is set, else "
                     "$XDG_STATE_HOME or ~/.local/state, then modelgrid/agents/NAME)")
    run.add_argument("--stop-workers-on-exit", action="store_true",
                     help="stop every worker when the agent stops (SIGTERM or Ctrl-C). By default the replica workers "
                     "keep their models loaded when the agent stops (or crashes), and the next agent started on the "
                     "same --state-dir adopts them without a reload, so an upgrade or a restart drops no model; "
                     "workers that no agent adopts exit after --orphan-timeout. Warm spares always stop")
    run.add_argument("--orphan-timeout", default=DEFAULT_ORPHAN_TIMEOUT, type=_positive, metavar="SECONDS",
                     help="how long a worker left without an agent keeps its model and waits for the next one before "
                     f"it exits (default {DEFAULT_ORPHAN_TIMEOUT:g})")
    # An endpoint picker of the operator's own (docs/inference.md, "Fronting replicas with an endpoint picker").
    run.add_argument("--picker-token-file", default=None, metavar="PATH",
                     help="a file holding a token the agent also accepts (as a bearer token) on /v1/models, "
                     "/v1/completions, /v1/chat/completions and the picker's /msp/... metrics pages, for the "
                     "gateway of an endpoint picker you run in front of the agents (default: none)")
    run.add_argument("--picker-open-metrics", action="store_true",
                     help="serve the picker's /msp/... metrics pages with no credentials at all, since a stock "
                     "endpoint picker scrapes without any: only where the network lets nothing but the picker "
                     "reach the agent's port (default: they need the gateway's secret or the picker token)")

    demo = commands.add_parser("demo-models", help="write the demo model directories (tiny-llama, tiny-bert, minilm)")
    demo.add_argument("directory")

    est = commands.add_parser(
        "estimate",
        help="memory one replica needs: weights, KV cache, activations, overhead (reads headers only)",
    )
    est.add_argument("path", help="a model directory, a config-only directory, config.json or a .safetensors file")
    est.add_argument("--dtype", default=None, help="serving dtype: float32, float16, bfloat16, ... (default: stored)")
    est.add_argument("--batch", default=1, type=_at_least_one, help="concurrent sequences (default 1)")
    est.add_argument("--seq", default=None, type=_at_least_one,
                     help="tokens per sequence, the image side for vision models (default min(max positions, 2048))")
    est.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="device kind for the overhead term")
    est.add_argument("--json", action="store_true", help="print the JSON breakdown instead of a table")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "demo-models":
        from agent.workers.demo_models import write_demo_models

        write_demo_models(args.directory)
        return 0
    if args.command == "estimate":
        return _estimate(args)
    return _run(parser, args)


def _estimate(args: argparse.Namespace) -> int:
    """Print the estimate; bad input is exit status 2 with the error (file and field) on stderr."""
    import json

    from agent import engines
    from agent.artifacts import ArtifactError
    from agent.artifacts.report import format_estimate

    try:  # by the engine that reads the path's format
        est = engines.estimate_model(args.path, dtype=args.dtype, batch=args.batch, seq=args.seq, device=args.device)
    except ArtifactError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(est.as_dict(), indent=2))
        return 0
    print(format_estimate(est))
    return 0


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from agent.daemon import Agent, AgentConfig, websocket_url
    from agent.gpus import GpuBackendUnavailable, make_backend
    from agent.privacy import keep_private

    token = _token(parser, args)
    keep_private()  # its token stays out of its engines' reach (/proc/PID/environ)
    try:
        websocket_url(args.console)
        backend = make_backend(args.gpus, host=args.name)
    except (ValueError, GpuBackendUnavailable) as e:
        parser.error(str(e))
    host, port = args.listen
    config = AgentConfig(
        console=args.console,
        token=token,
        name=args.name,
        listen_host=host,
        listen_port=port,
        report_interval=args.report_interval,
        advertise=args.advertise,
        warm_workers=args.warm_workers,
        sleep_budget=args.sleep_budget,
        heartbeat_timeout=args.heartbeat_timeout,
        mps=args.mps,
        cap_cpu_workers=args.cap_cpu_workers,
        cpu_threads=args.cpu_threads,
        generation_timeout=args.generation_timeout,
        text_timeout=args.text_timeout,
        text_workers=args.text_workers,
        state_dir=args.state_dir or default_state_dir(args.name),
        stop_workers_on_exit=args.stop_workers_on_exit,
        orphan_timeout=args.orphan_timeout,
        drain_timeout=args.drain_timeout,
        engine_programs={name: path for name in engines.ENGINES if (path := getattr(args, f"program_{name}", None))},
        picker_token=_picker_token(parser, args.picker_token_file),
        picker_open_metrics=args.picker_open_metrics,
    )
    if config.picker_open_metrics:
        logging.getLogger(__name__).warning(
            "--picker-open-metrics: GET /msp/... answers without credentials on %s:%d (queue lengths, KV usage and "
            "adapter names of the replicas here)", host, port)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(Agent(config, backend)))


def _token(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The agent token from its one source: --token-file (or its variable), else --token (or its variable)."""
    from agent.token_file import TokenFileError, read_token_file

    if args.token_file:
        if args.token:
            parser.error(f"give the agent token one way: --token-file (or ${TOKEN_FILE_ENV}) or --token (or "
                         f"${TOKEN_ENV}), not both")
        try:
            return read_token_file(args.token_file)
        except TokenFileError as e:
            parser.error(str(e))
    if not args.token:
        parser.error(f"an agent token is required: pass --token or set {TOKEN_ENV}, or name a file that holds it: "
                     f"--token-file or {TOKEN_FILE_ENV}")
    return args.token


def _loop_factory():
    """uvloop where it is installed (every relayed token crosses the agent's loop), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def default_state_dir(name: str, env: dict[str, str] | None = None) -> str:
    """The agent's state directory when --state-dir is not given: beside the console's data when one runs here
    (the embedded `up`), else the user's state directory. One per agent name, so two agents on one host differ."""
    env = os.environ if env is None else env
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "agent"
    if env.get("MODELGRID_DATA_DIR"):
        return os.path.join(env["MODELGRID_DATA_DIR"], "agents", safe)
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "modelgrid", "agents", safe)


async def _serve(daemon: Agent) -> int:
    from agent.mps import MpsUnavailable
    from agent.workers.rendezvous import StateDirError

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, daemon.request_stop)
    try:
        await daemon.run()
    except MpsUnavailable as e:
        logging.getLogger("agent").error("cannot start MPS: %s", e)
        return 1
    except StateDirError as e:
        logging.getLogger("agent").error("cannot use the state directory: %s", e)
        return 1
    except OSError as e:  # the listen address is taken or not ours
        logging.getLogger("agent").error("cannot serve inference: %s", e)
        return 1
    return 0


def _picker_token(parser: argparse.ArgumentParser, path: str | None) -> str:
    """The token in --picker-token-file ("" without one), read as the agent's own token file is."""
    from agent.token_file import TokenFileError, read_token_file

    if path is None:
        return ""
    try:
        token = read_token_file(path)
    except TokenFileError as e:
        parser.error(f"--picker-token-file: {e}")
    if len(token) < 16:
        parser.error(f"--picker-token-file: {path} must hold a token of 16 characters or more")
    return token


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (for example 127.0.0.1:8100, port 0 for any)")
    return host.strip("[]") or "127.0.0.1", int(port)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 and at most 3600")
    return value


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _size(text: str) -> int:
    from agent.gpus.simulated import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0 or more)")
    return int(text)
