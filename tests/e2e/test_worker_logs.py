"""Worker logs end to end, against a real `manage.py up` (console, agent and torch workers as processes): a
replica whose worker fails to load shows the worker's own error, traceback and all, in its log tail through the
REST API, read from the agent over its link."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.e2e.stack import wait_for
from tests.refusals import refusal

pytestmark = [pytest.mark.e2e, pytest.mark.db_stack]


def mismatched(api, tiny_llama, path, name):
    """The tiny Llama, registered as `name`; then its config is edited to name an activation transformers does not
    have (as a model directory changed after registration is): the headers and the estimate were fine, and
    transformers refuses the model only in the worker, while building it."""
    shutil.copytree(tiny_llama, path)
    assert api.post("/models", json={"name": name, "path": str(path)}).status_code == 201
    config = json.loads((path / "config.json").read_text())
    config["hidden_act"] = "gelu_of_no_kind"
    (path / "config.json").write_text(json.dumps(config))
    return path


WORKERS_ERROR = "KeyError: 'gelu_of_no_kind'"


def test_a_replica_that_fails_to_load_has_the_workers_own_error_in_its_log_tail(stack, tiny_llama, tmp_path):
    api = stack.api()
    path = mismatched(api, tiny_llama, tmp_path / "wide-mlp", "wide-mlp")
    assert api.post("/deployments", json={"name": "broken", "model": "wide-mlp"}).status_code == 201
    try:
        failed = wait_for(lambda: next((r for r in api.get("/deployments/broken").json()["replicas"]
                                        if r["state"] == "failed" and r["observed_reason"]), None),
                          timeout=120, what="broken's replica to fail to load")
        assert failed["observed_reason"].startswith(WORKERS_ERROR)

        r = api.get(f"/deployments/broken/replicas/{failed['index']}/logs?tail=300")
        assert r.status_code == 200, r.text
        lines = r.json()["lines"]
        text = "\n".join(lines)
        assert 0 < len(lines) <= 300
        assert f"cannot load {path}" in text, text[-3000:]  # the worker's own log line
        assert "Traceback (most recent call last):" in text
        assert WORKERS_ERROR in text  # the worker's exception itself
        assert any("ACT2FN" in line or "activations.py" in line for line in lines), text[-3000:]  # and where

        short = api.get(f"/deployments/broken/replicas/{failed['index']}/logs?tail=2").json()["lines"]
        assert len(short) == 2

        missing = api.get("/deployments/broken/replicas/9/logs")
        assert missing.status_code == 404 and "has no replica 9" in refusal(missing)
    finally:
        assert api.delete("/deployments/broken").status_code == 204
