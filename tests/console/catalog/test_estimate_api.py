"""POST /api/v1/estimate and manage.py estimate: the breakdown, calibration, and bad input as a 422."""

import json
import struct

import pytest
from django.core.management import CommandError, call_command

from console.catalog.models import Calibration, MemorySample
from console.catalog.services import register_model
from tests.conftest import write_model_dir
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
TERMS = ("weights_bytes", "kv_cache_bytes", "activation_bytes", "adapter_pool_bytes", "overhead_bytes")


def test_it_returns_the_breakdown_of_a_path(api, model_dir):
    r = api.post("/api/v1/estimate", {"path": str(model_dir), "dtype": "fp16", "batch": 2, "seq": 32})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["total_bytes"] == sum(body[t] for t in TERMS)
    assert (body["dtype"], body["batch"], body["seq"], body["device"]) == ("float16", 2, 32, "cuda")
    assert body["architecture"] == "LlamaForCausalLM" and body["parameters"] > 0
    assert body["calibrated_bytes"] == body["total_bytes"] and body["calibrated_from"] == 0
    assert any("grouped-query" in n or "fused" in n for n in body["notes"])


def test_it_estimates_a_registered_model_by_name_with_its_calibration(api, model_dir):
    register_model("tiny", str(model_dir))
    Calibration.objects.create(family="llama", device="cpu", factor=1.5, samples=3)
    body = api.post("/api/v1/estimate", {"model": "tiny", "device": "cpu"}).json()
    assert body["calibrated_from"] == 3
    assert body["calibrated_bytes"] == pytest.approx(1.5 * body["total_bytes"], abs=1)


def test_it_adds_the_adapter_pool_as_its_own_term(api, model_dir):
    plain = api.post("/api/v1/estimate", {"path": str(model_dir)}).json()
    pooled = api.post("/api/v1/estimate", {"path": str(model_dir), "adapter_pool_bytes": 1 << 20}).json()
    assert pooled["total_bytes"] - plain["total_bytes"] == pooled["adapter_pool_bytes"] == 1 << 20


def lying_header(tmp_path):
    path = write_model_dir(tmp_path / "liar")
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1600]}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    return {"path": str(path)}, "model.safetensors: tensor 'w' data_offsets [0, 1600]"


def malformed_config(tmp_path):
    path = write_model_dir(tmp_path / "bad")
    (path / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": "two"}')
    return {"path": str(path)}, "config.json: field 'num_hidden_layers' must be an integer"


def missing_shard(tmp_path):
    path = write_model_dir(tmp_path / "sharded")
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-2-of-2.safetensors"}}))
    return {"path": str(path)}, "shard model-2-of-2.safetensors is listed but missing"


@pytest.mark.parametrize("case", [
    lying_header, malformed_config, missing_shard,
    lambda tmp: ({"path": str(write_model_dir(tmp / "m")), "dtype": "float8"}, "dtype 'float8' is not one"),
    lambda tmp: ({"path": str(write_model_dir(tmp / "m")), "batch": 0}, "input should be greater than or equal to 1"),
    lambda tmp: ({"path": str(tmp / "nowhere")}, "no such file or directory in the model roots"),
    lambda tmp: ({}, "give exactly one of 'path'"),
])
def test_bad_input_is_a_422_that_names_the_file_and_field_and_stores_nothing(api, tmp_path, case):
    body, message = case(tmp_path)
    r = api.post("/api/v1/estimate", body)
    assert r.status_code == 422, r.content
    assert message in refusal(r)
    assert not MemorySample.objects.exists() and not Calibration.objects.exists()


def test_an_unknown_model_name_is_a_404(api):
    r = api.post("/api/v1/estimate", {"model": "nope"})
    assert r.status_code == 404 and "no model named 'nope'" in refusal(r)


def test_it_needs_a_token(client, model_dir):
    r = client.post("/api/v1/estimate", data=json.dumps({"path": str(model_dir)}), content_type="application/json")
    assert r.status_code == 401


def test_the_command_prints_the_table_with_the_calibration(model_dir, capsys):
    Calibration.objects.create(family="llama", device="cuda", factor=1.25, samples=4)
    call_command("estimate", str(model_dir), "--seq", "16")
    out = capsys.readouterr().out
    assert "LlamaForCausalLM (llama)" in out and "total" in out
    assert "(x1.250 from 4 measured llama loads on cuda)" in out


def test_the_command_prints_json(model_dir, capsys):
    call_command("estimate", str(model_dir), "--json", "--device", "cpu")
    body = json.loads(capsys.readouterr().out)
    assert body["device"] == "cpu" and body["overhead_bytes"] == 0
    assert body["total_bytes"] == sum(body[t] for t in TERMS)


def test_the_command_exits_2_naming_the_problem(tmp_path):
    case, message = malformed_config(tmp_path)
    with pytest.raises(CommandError, match="field 'num_hidden_layers'") as e:
        call_command("estimate", case["path"])
    assert e.value.returncode == 2


@pytest.mark.parametrize("field, value", [("batch", "3"), ("batch", True), ("seq", "128"), ("seq", 128.0),
                                          ("adapter_pool_bytes", "1024"), ("dtype", 16), ("path", 1)])
def test_a_value_of_the_wrong_json_type_is_refused_not_coerced(api, model_dir, field, value):
    r = api.post("/api/v1/estimate", {"path": str(model_dir), field: value})
    assert r.status_code == 422, r.content
    assert [e["loc"] for e in r.json()["detail"]] == [["body", field]]
