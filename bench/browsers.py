"""Browser sockets beside the gateway and an agent link: N dashboard websockets of one non-admin member, open and
pushed to, while short completions go through the gateway and an agent link makes round trips (`manage.py up`,
tiny-llama on one simulated GPU). Prints one table. No assertions on timings.

    .venv/bin/python bench/browsers.py                          # 0, 500 and 1,500 sockets, 30 of each measurement
    .venv/bin/python bench/browsers.py --sockets 0,200 --requests 10
    .venv/bin/python bench/browsers.py --pages                  # each socket views another page (no two alike)

The sockets are opened and read by a child process (it spends its own CPU, not the measuring client's). The caps
on browser sockets are raised to the socket count (MODELGRID_BROWSER_SOCKETS_PER_USER, MODELGRID_BROWSER_SOCKETS):
what is measured is what open sockets cost the gateway and the agent links, not the caps. A last row opens the
largest count again at the default caps (--default-caps). The agent link's round trip is a fake agent's hello
answered with its desired state (a database write and a read, and a send on the link); each hello also changes
the fleet, so every open dashboard is re-rendered and pushed (at most once per second). Completions and round
trips go one every half second, none begun past --row-seconds into a row; `completions` and `agent links` count
those answered."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import websockets  # noqa: E402

from bench.fleet_profile import print_profile, profile_between, profile_env, read_profile  # noqa: E402
from bench.harness import (  # noqa: E402
    command_line,
    percentile,
    print_header,
    print_table,
    ready_replica,
    running_stack,
    say,
)
from tests.e2e.stack import wait_for  # noqa: E402

# Between two completions, and two round trips: a row spans more than the gateway's token cache (10 s), so its
# lookups (and the fleet snapshot's reads) fall inside it, as they do under steady traffic.
PAUSE_S = 0.5
WAIT_S = 120.0  # a completion or an agent round trip not answered by then counts as failed
OPEN_AT_ONCE = 50  # handshakes the child has in flight at a time
SOCKET_CAP_ENV = ("MODELGRID_BROWSER_SOCKETS_PER_USER", "MODELGRID_BROWSER_SOCKETS")


# -- the child: N browser sockets ------------------------------------------------------------------------------


async def _browsers(url: str, cookie: str, count: int, pages: bool) -> None:
    """Open `count` dashboard sockets, print one line when all have tried, then read them until stdin closes
    and print what they received."""
    origin = url.replace("ws://", "http://").split("/ws/")[0]
    received, closes, opened, tried = [0], {}, [], [0]
    gate = asyncio.Semaphore(OPEN_AT_ONCE)

    def closed(why: str) -> None:
        closes[why] = closes.get(why, 0) + 1

    async def one(i: int) -> None:
        target = url + (f"?page={i + 1}" if pages else "")
        async with gate:
            try:
                ws = await websockets.connect(target, origin=origin, additional_headers={"Cookie": cookie},
                                              max_size=None, open_timeout=120, ping_interval=None)
            except Exception as e:
                closed(f"handshake: {type(e).__name__}")
                return
            finally:
                tried[0] += 1
        opened.append(ws)
        try:
            async for _ in ws:
                received[0] += 1
        except websockets.ConnectionClosed:
            pass
        closed(f"{ws.close_code} {ws.close_reason}"[:80])

    readers = [asyncio.create_task(one(i)) for i in range(count)]
    while tried[0] < count:
        await asyncio.sleep(0.2)
    # The closes that follow an accept (a cap), until none came for 2 s (30 s at most).
    last, quiet_since, began = -1, time.monotonic(), time.monotonic()
    while time.monotonic() - quiet_since < 2 and time.monotonic() - began < 30:
        if sum(closes.values()) != last:
            last, quiet_since = sum(closes.values()), time.monotonic()
        await asyncio.sleep(0.2)
    refused = sum(closes.values())
    print(json.dumps({"open": count - refused, "closes": closes}), flush=True)
    since, began = received[0], time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent is done measuring
    rate = (received[0] - since) / (time.monotonic() - began)
    for ws in opened:
        await ws.close()
    for r in readers:
        r.cancel()
    print(json.dumps({"pushes_per_s": rate}), flush=True)


# -- the parent: measure ----------------------------------------------------------------------------------------


def _member_session(stack) -> str:
    """A session cookie of a new non-admin member (in the default team, as every new user is)."""
    code = ("from django.contrib.auth import get_user_model; from django.test import Client; "
            "u = get_user_model().objects.create_user('browsing', password='a-long-password'); "
            "c = Client(); c.force_login(u); print(c.cookies['sessionid'].value)")
    return "sessionid=" + stack.manage("shell", "-c", code).splitlines()[-1].strip()


async def _completions(client: httpx.AsyncClient, count: int, until: float) -> tuple[list[float], int]:
    """`count` completions one after another, none begun after `until` (time.monotonic()): their times, and how
    many failed or outlasted WAIT_S."""
    took, failed = [], 0
    for _ in range(count):
        if time.monotonic() > until:
            break
        began = time.monotonic()
        try:
            r = await client.post("/v1/completions", json={"model": "small", "prompt": "the cat", "max_tokens": 3,
                                                           "temperature": 0}, timeout=WAIT_S)
            r.raise_for_status()
            took.append(time.monotonic() - began)
        except Exception as e:
            say(f"a completion failed after {time.monotonic() - began:.0f} s ({type(e).__name__})")
            failed += 1
        await asyncio.sleep(PAUSE_S)
    return took, failed


async def _agent_round_trips(ws_url: str, token: str, count: int, until: float) -> tuple[list[float], int]:
    """`count` hellos of a fake agent, each answered with its desired state, none begun after `until`: their times,
    and how many were not answered within WAIT_S (the link is then opened anew)."""
    hello = {"type": "hello", "protocol": _protocol(), "host": "bench-agent", "agent_version": "bench",
             "endpoint": "http://127.0.0.1:9", "gpus": []}
    took, failed, ws = [], 0, None
    try:
        for _ in range(count):
            if time.monotonic() > until:
                break
            began = time.monotonic()
            try:
                if ws is None:
                    ws = await websockets.connect(ws_url + "ws/agent/", max_size=None, open_timeout=WAIT_S,
                                                  ping_interval=None,
                                                  additional_headers={"Authorization": f"Bearer {token}"})
                await ws.send(json.dumps(hello))
                while True:
                    message = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S - (time.monotonic() - began)))
                    if message["type"] == "desired_state":
                        break
                took.append(time.monotonic() - began)
                await ws.send(json.dumps({"type": "ack", "generation": message["generation"]}))
            except Exception as e:
                say(f"an agent round trip failed after {time.monotonic() - began:.0f} s ({type(e).__name__})")
                failed += 1
                if ws is not None:
                    await ws.close()
                ws = None
            await asyncio.sleep(PAUSE_S)
    finally:
        if ws is not None:
            await ws.close()
    return took, failed


def _protocol() -> int:
    from agent.protocol import PROTOCOL_VERSION

    return PROTOCOL_VERSION


async def _measure(stack, agent_token: str, count: int, seconds: float = float("inf")
                   ) -> tuple[tuple[list[float], int], tuple[list[float], int]]:
    ws_url, until = stack.url.replace("http://", "ws://"), time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=stack.url.rstrip("/"), timeout=WAIT_S,
                                 headers={"Authorization": f"Bearer {stack.token}"}) as client:
        return tuple(await asyncio.gather(_completions(client, count, until),
                                          _agent_round_trips(ws_url, agent_token, count, until)))


def _row(stack, agent_token: str, cookie: str, sockets: int, args, caps: str) -> dict:
    child = None
    opened: dict = {"open": 0, "closes": {}}
    if sockets:
        say(f"opening {sockets} browser sockets ({caps})")
        began = time.monotonic()
        child = subprocess.Popen([sys.executable, __file__, "--child", stack.url.replace("http://", "ws://")
                                  + "ws/dashboard/", cookie, str(sockets)] + (["--pages"] if args.pages else []),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        opened = json.loads(child.stdout.readline() or "{}")
        say(f"{opened.get('open')} open in {time.monotonic() - began:.0f} s; closed: {opened.get('closes')}")
    profiled = read_profile(args.profile_file)
    try:
        (completions, failed), (trips, lost) = asyncio.run(_measure(stack, agent_token, args.requests,
                                                                    args.row_seconds))
    finally:
        args.profiles[f"{sockets} sockets, caps {caps}"] = profile_between(profiled, read_profile(args.profile_file))
        rate = float("nan")
        if child is not None:
            child.stdin.close()
            with_rate = child.stdout.readline()
            rate = json.loads(with_rate)["pushes_per_s"] if with_rate else float("nan")
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
    refused = sum(opened.get("closes", {}).values())
    return {"sockets asked": sockets, "caps": caps, "open": opened.get("open", 0), "refused": refused,
            "pushes/s": rate,
            "completions": len(completions), "completion p50 ms": 1000 * percentile(completions, 0.5),
            "completion p99 ms": 1000 * percentile(completions, 0.99), "completions failed": failed,
            "agent links": len(trips), "agent link p50 ms": 1000 * percentile(trips, 0.5),
            "agent link p99 ms": 1000 * percentile(trips, 0.99),
            "agent links unanswered": lost}


def _prepare(stack, model: Path) -> tuple[str, str]:
    """tiny-llama's deployment `small` ready on `stack`; a member's session cookie and an agent token."""
    api = stack.api()
    api.post("/models", json={"name": "tiny", "path": str(model)}).raise_for_status()
    api.post("/deployments", json={"name": "small", "model": "tiny"}).raise_for_status()
    wait_for(lambda: ready_replica(api, "small"), 180, interval=0.5, what="small to be ready")
    cookie = _member_session(stack)
    agent_token = stack.manage("createagenttoken", "bench-agent")
    asyncio.run(_measure(stack, agent_token, 3))  # warm
    return cookie, agent_token


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--sockets", default="0,500,1500", help="comma-separated socket counts, one row each")
    parser.add_argument("--requests", type=int, default=30, help="completions and agent round trips per row")
    parser.add_argument("--row-seconds", type=float, default=240,
                        help="no measurement begins this long after a row's first (each may take WAIT_S more)")
    parser.add_argument("--pages", action="store_true", help="each socket views another page of the dashboard")
    parser.add_argument("--default-caps", action=argparse.BooleanOptionalAction, default=True,
                        help="a last row: the largest count again at the default caps")
    parser.add_argument("--profile", action="store_true", help="sample the console's stacks and print the profile")
    parser.add_argument("--child", nargs=3, metavar=("URL", "COOKIE", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, cookie, count = args.child
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        asyncio.run(_browsers(url, cookie, int(count), args.pages))
        return
    print_header()
    from agent.workers.demo_models import build_tiny_llama

    counts = [int(c) for c in args.sockets.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="mg-browsers-"))
    args.profile_file = tmp / "profile.json" if args.profile else None
    args.profiles = {}
    model = build_tiny_llama(tmp / "models" / "tiny-llama")
    caps = str(max(counts + [1]))
    runs = [("data", {name: caps for name in SOCKET_CAP_ENV}, counts, f"raised to {caps}")]
    if args.default_caps and max(counts) > 0:
        runs.append(("data-default", {name: os.environ.get(name, "") for name in SOCKET_CAP_ENV}, [max(counts)],
                     "default"))
    rows = []
    for name, env, sockets, label in runs:
        stack_env = env | (profile_env(tmp, args.profile_file) if args.profile_file else {})
        with running_stack(tmp / name, gpus="sim:1x24GiB", **stack_env) as stack:
            cookie, agent_token = _prepare(stack, model)
            for n in sockets:
                rows.append(_row(stack, agent_token, cookie, n, args, label))
                say(" ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()))
    print_table(f"Browser sockets of one member beside the gateway and an agent link ({args.requests} each"
                + (", each socket another page" if args.pages else "") + ")", rows,
                notes=("completion: a 3-token completion through the gateway; agent link: a hello answered with "
                       "its desired state; failed/unanswered: not answered within "
                       f"{WAIT_S:.0f} s; pushes/s: dashboard pushes all the sockets received",))
    for title, samples in args.profiles.items():
        print_profile(samples, f"Console profile, {title}", top=12)


if __name__ == "__main__":
    main()
