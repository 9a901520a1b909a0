"""Triton's clients end to end: the real `tritonclient.http` client with its defaults (binary inputs and outputs)
against a real `manage.py up`, through the console's gateway to the agent and back, for an encoder (tiny-bert:
embeddings) and a causal LM (tiny-llama: logits); its numbers equal the JSON path's. And the calls perf_analyzer
makes before it measures: the repository index, each model's metadata and configuration, and inference at a
version, with inputs shaped from what those said."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.e2e.stack import wait_for

pytestmark = pytest.mark.e2e
HEADER = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def binary_models(stack, tmp_path_factory):
    """Deployments bin-llama (tiny-llama) and bin-bert (tiny-bert), ready; removed afterwards. Their own copies,
    outside the stack's model store: the store's tiny-llama is the browser tests' to register."""
    from agent.workers.demo_models import build_tiny_bert, build_tiny_llama

    root = tmp_path_factory.mktemp("binary-models")
    tiny_llama, tiny_bert = build_tiny_llama(root / "tiny-llama"), build_tiny_bert(root / "tiny-bert")
    api = stack.api()
    for name, path in (("bin-llama", tiny_llama), ("bin-bert", tiny_bert)):
        assert api.post("/models", json={"name": name, "path": str(path)}).status_code == 201
        assert api.post("/deployments", json={"name": name, "model": name}).status_code == 201
    for name in ("bin-llama", "bin-bert"):
        wait_for(lambda name=name: any(r["state"] == "ready" for r in api.get(f"/deployments/{name}").json()
                                       .get("replicas", [])), timeout=120, what=f"{name} to be ready")
    yield
    for name in ("bin-llama", "bin-bert"):
        api.delete(f"/deployments/{name}")


def infer(client, auth, model: str, output: str, binary: bool, **arrays: np.ndarray):
    """tritonclient's infer: with its defaults (binary tensors both ways, no outputs named), or all JSON."""
    import tritonclient.http as triton

    tensors = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), "INT64")
        if binary:
            tensor.set_data_from_numpy(array)  # binary_data=True: the default
        else:
            tensor.set_data_from_numpy(array, binary_data=False)
        tensors.append(tensor)
    outputs = None if binary else [triton.InferRequestedOutput(output, binary_data=False)]
    # A fresh dict each call: tritonclient writes Inference-Header-Content-Length into the headers it is given.
    return client.infer(model, tensors, outputs=outputs, headers=dict(auth))


def test_tritonclients_default_binary_tensors_give_the_json_paths_numbers(stack, binary_models):
    import tritonclient.http as triton

    url = stack.url.removeprefix("http://").rstrip("/")
    auth = {"Authorization": f"Bearer {stack.token}"}
    client = triton.InferenceServerClient(url=url, network_timeout=120)

    ids = np.array([[2, 15, 99, 7, 300, 3], [2, 41, 8, 3, 0, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=np.int64)
    binary = infer(client, auth, "bin-bert", "embeddings", True, input_ids=ids, attention_mask=mask)
    assert binary.get_output("embeddings")["parameters"] == {"binary_data_size": 2 * 64 * 4}
    as_json = infer(client, auth, "bin-bert", "embeddings", False, input_ids=ids, attention_mask=mask)
    assert "parameters" not in as_json.get_output("embeddings")
    assert binary.as_numpy("embeddings").shape == (2, 64)
    assert np.array_equal(binary.as_numpy("embeddings"), as_json.as_numpy("embeddings"))

    ids = np.array([[1, 5, 42, 7, 300, 2]], dtype=np.int64)
    binary = infer(client, auth, "bin-llama", "logits", True, input_ids=ids)
    assert binary.get_output("logits")["parameters"] == {"binary_data_size": 6 * 1024 * 4}
    assert np.array_equal(binary.as_numpy("logits"), infer(client, auth, "bin-llama", "logits", False,
                                                           input_ids=ids).as_numpy("logits"))

    # 2 x 16 tokens x 1,024 logits: past one encoding piece, so the agent streams it and the gateway passes it on.
    ids = np.arange(32, dtype=np.int64).reshape(2, 16) * 31 % 1024
    mask = np.ones_like(ids)
    mask[1, 12:] = 0
    binary = infer(client, auth, "bin-llama", "logits", True, input_ids=ids, attention_mask=mask)
    as_json = infer(client, auth, "bin-llama", "logits", False, input_ids=ids, attention_mask=mask)
    assert binary.as_numpy("logits").shape == (2, 16, 1024)
    assert np.array_equal(binary.as_numpy("logits"), as_json.as_numpy("logits"))


def test_a_malformed_binary_body_is_refused_through_the_gateway_naming_the_numbers(stack, binary_models):
    header = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64",
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    tensor_bytes = np.array([1, 2], dtype="<i8").tobytes()
    with stack.gateway() as gateway:
        wrong_size = gateway.post("/v2/models/bin-llama/infer", content=header + tensor_bytes,
                                  headers={HEADER: str(len(header))})
        past_body = gateway.post("/v2/models/bin-llama/infer", content=header + tensor_bytes,
                                 headers={HEADER: "100000"})
    assert wrong_size.status_code == 400, wrong_size.text
    assert "input 'input_ids' has binary_data_size 16, but shape [1, 3] of INT64 needs 24 bytes" in (
        wrong_size.json()["error"])
    assert past_body.status_code == 400, past_body.text
    assert f"says the JSON header is 100000 bytes, but the body is {len(header) + 16} bytes" in (
        past_body.json()["error"])


def test_a_perf_analyzer_style_client_reads_index_metadata_and_config_then_infers(stack, binary_models):
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    url = stack.url.removeprefix("http://").rstrip("/")
    auth = {"Authorization": f"Bearer {stack.token}"}
    client = triton.InferenceServerClient(url=url, network_timeout=120)
    index = {e["name"]: e for e in client.get_model_repository_index(headers=dict(auth))}
    assert index["bin-llama"] == {"name": "bin-llama", "version": "1", "state": "READY", "reason": ""}
    assert index["bin-bert"]["state"] == "READY"
    sequence, rows = 8, 3
    for name in ("bin-llama", "bin-bert"):
        metadata = client.get_model_metadata(name, headers=dict(auth))
        config = client.get_model_config(name, headers=dict(auth))
        assert config == client.get_model_config(name, model_version="1", headers=dict(auth))
        assert config["name"] == name and config["max_batch_size"] >= rows
        # As perf_analyzer reads them: with max_batch_size above 0, metadata shapes less their batch dimension are
        # the configuration's dims; a -1 is the sequence length it is told (--shape).
        dims = {t["name"]: t["dims"] for t in config["input"] + config["output"]}
        assert {t["name"]: t["shape"][1:] for t in metadata["inputs"] + metadata["outputs"]} == dims
        inputs = []
        for tensor in metadata["inputs"]:
            array = np.ones((rows, *[sequence if d == -1 else d for d in dims[tensor["name"]]]), dtype=np.int64)
            inputs.append(triton.InferInput(tensor["name"], list(array.shape), tensor["datatype"]))
            inputs[-1].set_data_from_numpy(array)  # binary, tritonclient's default
        result = client.infer(name, inputs, model_version="1", headers=dict(auth))
        output = metadata["outputs"][0]["name"]
        expected = (rows, *[sequence if d == -1 else d for d in dims[output]])
        assert result.as_numpy(output).shape == expected
    with pytest.raises(InferenceServerException, match="has no version '2': each model here has one version, '1'"):
        client.get_model_config("bin-llama", model_version="2", headers=dict(auth))
