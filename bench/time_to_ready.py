"""Time from a deployment's creation (POST /api/v1/deployments) to its replica reporting `ready`,
through a real `manage.py up` with a simulated GPU: scheduler pass, websocket push, worker spawn,
torch import, safetensors load, warm-up forward, status report.

    .venv/bin/python bench/time_to_ready.py [--runs 5] [--pause 8]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.workers.demo_models import build_tiny_llama  # noqa: E402
from bench.harness import command_line, print_header, print_table, running_stack  # noqa: E402
from tests.e2e.stack import alive, wait_for  # noqa: E402


def placed_host(api, name: str) -> str | None:
    replicas = api.get(f"/deployments/{name}").json()["replicas"]
    return replicas[0]["host"] if replicas else None


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds to wait before each creation, so the agent's warm spare worker is ready again "
        "(0: back to back, where a creation may find the spare still importing torch)",
    )
    args = parser.parse_args()
    print_header()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "models" / "tiny-llama")
        t0 = time.monotonic()
        rows = []
        with running_stack(Path(tmp) / "data", "sim:2x24GiB", MODELGRID_SCHEDULER_INTERVAL="0.5") as stack:
            startup = time.monotonic() - t0
            api = stack.api()
            assert api.post("/models", json={"name": "tiny", "path": str(model)}).status_code == 201
            for run in range(args.runs):
                name = f"bench-{run}"
                time.sleep(args.pause)
                began = time.monotonic()
                assert api.post("/deployments", json={"name": name, "model": "tiny"}).status_code == 201
                placed = wait_for(lambda n=name: placed_host(api, n), 30, 0.02)
                placed_s = time.monotonic() - began
                assert placed
                wait_for(lambda n=name: api.get(f"/deployments/{n}").json()["state"] == "ready", 120, 0.02)
                rows.append((run, placed_s, time.monotonic() - began))
                pids = stack.worker_pids(name)
                assert api.delete(f"/deployments/{name}").status_code == 204
                wait_for(lambda p=pids: not any(alive(pid) for pid in p), 30, 0.05)
    print(f"manage.py up to accepting requests: {startup:.2f} s")
    print_table(None, [(run, f"{placed:.3f}", f"{ready:.3f}") for run, placed, ready in rows],
                columns=("run", "placed (s)", "ready (s)"))
    readies = [r[2] for r in rows]
    print(f"median ready {statistics.median(readies):.3f} s, min {min(readies):.3f} s, max {max(readies):.3f} s "
          f"over {len(rows)} runs (model {model.name}, CPU worker on a simulated GPU)")


if __name__ == "__main__":
    main()
