"""The walking skeleton end to end, against a real `manage.py up`: register, deploy, infer,
refuse what cannot fit, delete, and stop everything with Ctrl-C; and SIGTERM stops it all within 10 s even
while a request is stuck in a worker thread."""

import contextlib
import json
import re
import signal
import sqlite3
import struct
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import psutil

from tests.e2e.stack import alive, start, wait_for


def reference_logits(path, input_ids):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # The agent gives each CPU worker one thread on this 2-core machine (its share with two simulated GPUs);
    # the reference sums in the same order only with the same count.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            return model(torch.tensor(input_ids)).logits.numpy()
    finally:
        torch.set_num_threads(threads)


def huge_model(path, gib: int):
    """A well-formed model directory whose safetensors file declares `gib` GiB of weights.
    The file is sparse, so it takes no disk space."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    n = gib * (1 << 30) // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, n * 4]}}).encode()
    with (path / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + n * 4)
    return path


def ready(api, name):
    def check():
        d = api.get(f"/deployments/{name}").json()
        return d if d["state"] == "ready" else None

    return check


def test_register_deploy_infer_delete_and_stop(tiny_llama, tmp_path):
    began = time.monotonic()
    stack, drop_db = start(tmp_path / "data", MODELGRID_MODEL_ROOTS=f"{tiny_llama.parent}:{tmp_path}")
    try:
        api = stack.api()
        r = api.post("/models", json={"name": "tiny", "path": str(tiny_llama)})
        assert r.status_code == 201, r.text

        created = time.monotonic()
        for name in ("chat", "other"):
            r = api.post("/deployments", json={"name": name, "model": "tiny", "replicas": 1})
            assert r.status_code == 201, r.text
        dep = wait_for(ready(api, "chat"), timeout=120, what="deployment chat to be ready")
        print(f"\ndeployment created -> ready: {time.monotonic() - created:.2f} s")
        wait_for(ready(api, "other"), timeout=120, what="deployment other to be ready")

        replica = dep["replicas"][0]
        assert replica["host"] == "local" and replica["endpoint"].startswith("http://127.0.0.1:")
        assert 0 < replica["measured_bytes"] <= replica["reserved_bytes"]
        gpu = next(g for g in api.get("/hosts").json()[0]["gpus"] if g["index"] == replica["gpus"][0])
        assert gpu["simulated"]
        assert gpu["used_bytes"] == sum(r["measured_bytes"] for r in gpu["replicas"])

        # Real inference through the console's gateway: the logits equal, bit for bit, what the model
        # computes here. The agent's own port takes only the gateway.
        input_ids = [[1, 5, 42, 7, 300, 2], [3, 3, 9, 100, 8, 1]]
        body = {"inputs": [{"name": "input_ids", "shape": [2, 6], "datatype": "INT64",
                            "data": [t for row in input_ids for t in row]}]}
        assert httpx.post(f"{replica['endpoint']}/v2/models/chat/infer", json=body, timeout=60).status_code == 401
        r = stack.gateway().post("/v2/models/chat/infer", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["x-modelgrid-replica"] == "chat#0"
        out = next(o for o in r.json()["outputs"] if o["name"] == "logits")
        assert out["datatype"] == "FP32"
        logits = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        expected = reference_logits(tiny_llama, input_ids)
        assert logits.shape == expected.shape
        assert np.array_equal(logits, expected), f"max abs diff {np.abs(logits - expected).max()}"

        # A model too big for every GPU: refused with a reason, nothing else disturbed.
        assert api.post("/models", json={"name": "huge", "path": str(huge_model(tmp_path / "huge", 30))}).is_success
        assert api.post("/deployments", json={"name": "huge", "model": "huge"}).status_code == 201
        d = wait_for(lambda: (d := api.get("/deployments/huge").json())["state"] == "unschedulable" and d,
                     timeout=30, what="huge to be unschedulable")
        # About 30 GiB of weights (the tiny model's measured loads calibrate llama estimates a little).
        pattern = r"needs (\d\d\.\d\d) GiB; the largest free space is 2\d\.\d\d GiB on local/[01]"
        need = re.fullmatch(pattern, d["reason"])
        assert need and 24 < float(need.group(1)) < 36, d["reason"]

        # Deleting a deployment stops its worker and empties its part of the GPU bar.
        chat, other = stack.worker_pids("chat"), stack.worker_pids("other")
        assert len(chat) == 1 and len(other) == 1 and chat != other
        assert chat | other <= {p.pid for p in stack.descendants()}
        assert api.delete("/deployments/chat").status_code == 204
        wait_for(lambda: not any(alive(pid) for pid in chat), timeout=30, what="chat's worker to exit")
        assert stack.worker_pids("other") == other
        wait_for(lambda: all(r["deployment"] != "chat" for g in api.get("/hosts").json()[0]["gpus"]
                             for r in g["replicas"]), timeout=15, what="chat to leave the GPU bar")
        # The bar's rows go with the delete; the GPU reading follows in the agent's report once the worker has
        # exited, so it is waited for (a busy machine can read /hosts between the two).
        def reading_follows() -> bool:
            gpus = api.get("/hosts").json()[0]["gpus"]
            return sum(g["used_bytes"] for g in gpus) == sum(r["measured_bytes"] for g in gpus for r in g["replicas"])

        wait_for(reading_follows, timeout=15, what="the GPU reading to drop chat's bytes")
        r = stack.gateway().get("/v2/models/chat/ready")
        assert r.status_code == 404

        # Ctrl-C stops the console, the agent, the remaining worker and the agent's warm spare(s).
        family = stack.descendants()
        assert stack.worker_pids("other")
        assert stack.stop() == 0
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
        assert stack.leftovers == []
        print(f"e2e duration: {time.monotonic() - began:.2f} s")
    finally:
        if stack.proc.poll() is None:
            stack.stop()
        drop_db()


@contextlib.contextmanager
def database_locked(stack):
    """Hold, from another connection, the lock a write request needs (SQLite: the database's write lock;
    PostgreSQL: the API token table, which authentication reads), as a long migration or a stuck transaction
    would: the request's worker thread then waits inside the database driver, where Python cannot interrupt it
    (SQLite gives up after its 20 s busy timeout, PostgreSQL never). A plain GET is not enough on SQLite:
    readers go on under a writer, and the token's `last_used` is written at most once a minute."""
    url = stack.env.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        import psycopg

        conn = psycopg.connect(url)
        conn.execute("LOCK TABLE accounts_apitoken IN ACCESS EXCLUSIVE MODE")
    else:
        conn = sqlite3.connect(stack.data_dir / "modelgrid.sqlite3", isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def test_sigterm_stops_up_the_agent_and_its_workers_within_10_s_while_a_request_is_stuck(tiny_llama, tmp_path):
    stack, drop_db = start(tmp_path / "data", MODELGRID_MODEL_ROOTS=str(tiny_llama.parent))
    try:
        api = stack.api()
        assert api.post("/models", json={"name": "tiny", "path": str(tiny_llama)}).status_code == 201
        assert api.post("/deployments", json={"name": "chat", "model": "tiny", "replicas": 1}).status_code == 201
        wait_for(ready(api, "chat"), timeout=120, what="deployment chat to be ready")
        worker = stack.worker_pids("chat")
        family = stack.descendants()
        assert len(worker) == 1 and worker <= {p.pid for p in family}

        with database_locked(stack), ThreadPoolExecutor(1) as pool:
            new_model = {"name": "stuck", "path": str(tiny_llama)}
            stuck = pool.submit(lambda: stack.api().post("/models", json=new_model, timeout=60))
            # A request answers in milliseconds; one still unanswered after 2 s waits on the lock.
            with contextlib.suppress(TimeoutError):
                stuck.result(timeout=2)
            assert not stuck.done(), "the request was answered: nothing was stuck"

            stack.proc.send_signal(signal.SIGTERM)
            try:
                code = stack.proc.wait(10)
            except subprocess.TimeoutExpired:
                why = "manage.py up still runs 10 s after SIGTERM:\n" + "".join(stack.lines[-20:])
                raise AssertionError(why) from None
            assert code == 0, "".join(stack.lines[-20:])
            # The stuck request got no answer; its connection closed with the process.
            with contextlib.suppress(httpx.HTTPError):
                assert stuck.result(timeout=30).status_code >= 500

        _, alive = psutil.wait_procs(family, timeout=5)
        assert alive == [], f"still running after up exited: {[p.pid for p in alive]}"
    finally:
        if stack.proc.poll() is None:
            stack.stop()
        drop_db()
