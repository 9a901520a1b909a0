"""Poll a URL (an agent's /v2/health/live) on one keep-alive connection until stdin closes or says stop, then
print one JSON list of [monotonic send time, latency in seconds, status] (0 for a failed request).

Run by bench/generation.py in its own process, so that the client reading a large response elsewhere does
not delay the probes it times.

    .venv/bin/python bench/health_probe.py http://127.0.0.1:PORT/v2/health/live --interval 0.01
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import command_line  # noqa: E402


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("url")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between one answer and the next probe")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds one probe may take")
    args = parser.parse_args()
    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()  # a line, or EOF when the parent goes away
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    samples: list[tuple[float, float, int]] = []
    with httpx.Client(timeout=args.timeout) as http:
        print("ready", flush=True)
        while not stop.is_set():
            began = time.monotonic()
            try:
                status = http.get(args.url).status_code
            except httpx.HTTPError:
                status = 0
            samples.append((began, time.monotonic() - began, status))
            stop.wait(args.interval)
    print(json.dumps(samples), flush=True)


if __name__ == "__main__":
    main()
