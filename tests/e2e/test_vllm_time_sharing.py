"""Two vLLM deployments share one simulated GPU in time, through a real `manage.py up` of their own: each request
switches the GPU to its model, with no failed request. Apart from test_vllm.py so the two stacks' vLLM starts run
on different test workers."""

from __future__ import annotations

from tests.e2e.stack import start
from tests.e2e.vllm import GATEWAY_ENV, VLLM_PYTHON, client, needs_vllm

pytestmark = needs_vllm


def test_two_vllm_deployments_share_one_gpu_in_time_with_no_failed_request(llama64, tmp_path):
    # Room for one vLLM replica (about 3 GiB reserved), not two: each request switches the GPU to its model.
    stack, drop_db = start(tmp_path / "data", gpus="sim:1x4GiB", MODELGRID_VLLM_PYTHON=VLLM_PYTHON,
                           MODELGRID_MIN_RESIDENCY_SECONDS="1", **GATEWAY_ENV)
    try:
        api = stack.api()
        assert api.post("/models", json={"name": "llama64", "path": str(llama64)}).status_code == 201
        for name in ("left", "right"):
            r = api.post("/deployments", json={"name": name, "model": "llama64", "engine": "vllm",
                                               "min_replicas": 0, "max_replicas": 1})
            assert r.status_code == 201, r.text
        openai = client(stack)
        answers = [openai.completions.with_raw_response.create(model=name, prompt="hi", max_tokens=3)
                   for name in ("left", "right", "left")]
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert [a.headers["x-modelgrid-replica"] for a in answers] == ["left#0", "right#0", "left#0"]
        # On CPU vLLM cannot sleep: the replica that made room was stopped, and said why.
        assert any("vLLM cannot sleep on CPU" in line for line in stack.lines)
    finally:
        stack.stop()
        drop_db()
