"""What Prometheus scraping an agent through the console costs: the same agent's /metrics fetched direct (with its
host's gateway secret) and relayed by the console's /metrics/agents/HOST (with an API token), interleaved, one
keep-alive client each; then the console's CPU per relayed scrape, at one scrape at a time and at N at once.
Starts its own `manage.py up` (free loopback port, temporary data dir, simulated GPUs) and stops it, always.

    .venv/bin/python bench/agent_metrics.py --scrapes 500
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.harness import (  # noqa: E402
    command_line,
    gateway_secret,
    percentile,
    print_header,
    print_table,
    running_stack,
    say,
    wait_until,
)


def _ms(values: list[float]) -> str:
    return f"{1000 * percentile(values, 0.5):.1f} / {1000 * percentile(values, 0.99):.1f} ms"


def timed(client: httpx.Client, url: str) -> float:
    began = time.perf_counter()
    r = client.get(url)
    if r.status_code != 200:
        raise RuntimeError(f"GET {url}: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - began


async def burst(base: str, token: str, path: str, scrapes: int, clients: int) -> float:
    """Seconds for `scrapes` relayed scrapes, `clients` at a time."""
    left = iter(range(scrapes))
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        async def one_client() -> None:
            for _ in left:
                (await client.get(path)).raise_for_status()

        began = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        return time.perf_counter() - began


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--scrapes", type=int, default=500, help="scrapes per way, and per burst")
    parser.add_argument("--clients", type=int, default=16, help="relayed scrapes at once in the burst")
    args = parser.parse_args()
    print_header()
    with tempfile.TemporaryDirectory(prefix="modelgrid-agent-metrics-") as tmp, \
            running_stack(Path(tmp) / "data", "sim:8x80GiB") as stack:
        base = stack.url.rstrip("/")
        auth = {"Authorization": f"Bearer {stack.token}"}
        [target] = wait_until(lambda: httpx.get(f"{base}/metrics/agents", headers=auth).json(), 60,
                              "the local agent to be listed", stack=stack)
        path = target["labels"]["__metrics_path__"]
        host = target["labels"]["host"]
        endpoint = next(h["endpoint"] for h in httpx.get(f"{base}/api/v1/hosts", headers=auth).json()
                        if h["name"] == host)
        secret = gateway_secret(stack, host)
        console = psutil.Process(stack.proc.pid)  # the console alone: the agent is a child process of its own
        direct, relayed = [], []
        with httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=30) as agent, \
                httpx.Client(headers=auth, timeout=30) as through:
            size = len(agent.get(f"{endpoint}/metrics").content)
            for _ in range(args.scrapes):
                direct.append(timed(agent, f"{endpoint}/metrics"))
                relayed.append(timed(through, f"{base}{path}"))
            cpu = console.cpu_times()
            one_at_a_time = sum(timed(through, f"{base}{path}") for _ in range(args.scrapes))
            after = console.cpu_times()
        serial_cpu = (after.user + after.system - cpu.user - cpu.system) / args.scrapes
        seconds = asyncio.run(burst(base, stack.token, path, args.scrapes, args.clients))
        done = console.cpu_times()
        burst_cpu = (done.user + done.system - after.user - after.system) / args.scrapes
        say(f"{args.scrapes} scrapes each way of a {size:,}-byte page")
        print_table("An agent's /metrics, direct and through the console", [
            {"way": "direct to the agent (gateway secret)", "p50 / p99": _ms(direct), "scrapes/s": "",
             "console CPU a scrape": ""},
            {"way": "relayed by the console (API token)", "p50 / p99": _ms(relayed), "scrapes/s": "",
             "console CPU a scrape": ""},
            {"way": "relayed, one at a time", "p50 / p99": "", "scrapes/s": f"{args.scrapes / one_at_a_time:.0f}",
             "console CPU a scrape": f"{1000 * serial_cpu:.2f} ms"},
            {"way": f"relayed, {args.clients} at once", "p50 / p99": "", "scrapes/s": f"{args.scrapes / seconds:.0f}",
             "console CPU a scrape": f"{1000 * burst_cpu:.2f} ms"},
        ], notes=(f"page: {size:,} bytes (8 simulated GPUs, no replica); {args.scrapes} scrapes per row, interleaved "
                  "in the first two",))


if __name__ == "__main__":
    main()
