"""Bystander latency: a short completion to one deployment while another answers huge v2 requests, through the
console's gateway (`manage.py up`, tiny-llama on two simulated GPUs). Prints one table. No assertions on timings.

    .venv/bin/python bench/bystander.py                 # [32, 256] logits (~84 MB of JSON each), 20 short requests
    .venv/bin/python bench/bystander.py --rows 8 --short 40

Each row: the short requests' latency alone, then with a thread sending the huge requests back to back. Both
deployments' replicas run on the one local agent, so its event loop and interpreter serve both."""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.harness import command_line, median, percentile, print_header, print_table, ready_replica, running_stack, say  # noqa: E402
from tests.e2e.stack import wait_for  # noqa: E402


def short(client: httpx.Client, count: int) -> list[float]:
    times = []
    for _ in range(count):
        began = time.monotonic()
        r = client.post("/v1/completions", json={"model": "small", "prompt": "the cat", "max_tokens": 3,
                                                 "temperature": 0})
        r.raise_for_status()
        times.append(time.monotonic() - began)
        time.sleep(0.05)
    return times


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--rows", type=int, default=32, help="rows of the huge request (x 256 tokens)")
    parser.add_argument("--short", type=int, default=20, help="short requests per measurement")
    args = parser.parse_args()
    print_header()
    from agent.workers.demo_models import build_tiny_llama

    tmp = Path(tempfile.mkdtemp(prefix="mg-bystander-"))
    model = build_tiny_llama(tmp / "models" / "tiny-llama")
    with running_stack(tmp / "data", gpus="sim:2x24GiB") as stack:
        api = stack.api()
        api.post("/models", json={"name": "tiny", "path": str(model)}).raise_for_status()
        for name in ("small", "huge"):
            api.post("/deployments", json={"name": name, "model": "tiny"}).raise_for_status()
            wait_for(lambda n=name: ready_replica(api, n), 180, interval=0.5, what=f"{name} to be ready")
        client = stack.gateway()
        ids = [[(7 * r + c) % 1000 + 1 for c in range(256)] for r in range(args.rows)]
        body = {"inputs": [{"name": "input_ids", "shape": [args.rows, 256], "datatype": "INT64",
                            "data": [i for row in ids for i in row]}]}
        short(client, 3)  # warm
        alone = short(client, args.short)
        stop, sizes = threading.Event(), []

        def huge() -> None:
            with stack.gateway() as c:
                while not stop.is_set():
                    r = c.post("/v2/models/huge/infer", json=body)
                    sizes.append(len(r.content))

        thread = threading.Thread(target=huge, daemon=True)
        thread.start()
        while not sizes:
            time.sleep(0.05)
        beside = short(client, args.short)
        stop.set()
        thread.join(300)
    mb = sum(sizes) / len(sizes) / 1e6
    rows = [{"while": what, "median ms": f"{1000 * median(t):.0f}", "p99 ms": f"{1000 * percentile(t, 0.99):.0f}",
             "max ms": f"{1000 * max(t):.0f}"}
            for what, t in (("alone", alone), (f"beside [{args.rows}, 256] v2 answers ({mb:.0f} MB each)", beside))]
    say(f"{len(sizes)} huge answers sent meanwhile")
    print_table(f"Bystander: 3-token completions through the gateway ({args.short} each)", rows)


if __name__ == "__main__":
    main()
