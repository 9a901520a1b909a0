import json
import struct

import pytest

from agent.artifacts import ArtifactError, estimate_model, inspect_model_dir, read_safetensors_header
from tests.conftest import write_model_dir


def test_it_reads_exact_weight_bytes_from_headers(model_dir):
    artifact = inspect_model_dir(model_dir)
    assert artifact.architecture == "LlamaForCausalLM"
    assert artifact.task == "causal-lm"
    assert artifact.stored_dtype == "float32"
    assert artifact.parameters == 32 * 16 + 32 * 16
    assert artifact.weights_bytes == artifact.parameters * 4


def test_the_estimate_is_the_sum_of_its_terms(model_dir):
    est = estimate_model(inspect_model_dir(model_dir))
    assert est.weights_bytes == 4096
    terms = est.weights_bytes + est.kv_cache_bytes + est.activation_bytes + est.overhead_bytes
    assert est.total_bytes == terms > est.weights_bytes


def test_it_recognises_bert_family_encoders(tmp_path):
    artifact = inspect_model_dir(write_model_dir(tmp_path / "b", arch="BertModel", model_type="bert"))
    assert artifact.task == "encoder"


def test_it_refuses_a_missing_directory(tmp_path):
    with pytest.raises(ArtifactError, match="no such directory"):
        inspect_model_dir(tmp_path / "nope")


def test_it_refuses_a_directory_without_config(tmp_path):
    with pytest.raises(ArtifactError, match="no config.json"):
        inspect_model_dir(tmp_path)


def test_it_names_the_file_of_a_malformed_config(model_dir):
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"config\.json: not valid JSON"):
        inspect_model_dir(model_dir)


def test_it_refuses_weights_that_are_not_safetensors(model_dir):
    (model_dir / "model.safetensors").rename(model_dir / "pytorch_model.bin")
    with pytest.raises(ArtifactError, match="no \\*.safetensors"):
        inspect_model_dir(model_dir)


def test_it_refuses_a_truncated_file(model_dir):
    f = model_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ArtifactError, match="past the end of the file"):
        read_safetensors_header(f)


def test_it_refuses_a_header_whose_offsets_lie(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1600]}}).encode()
    f = tmp_path / "lying.safetensors"
    f.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with pytest.raises(ArtifactError, match="'w' data_offsets \\[0, 1600\\]"):
        read_safetensors_header(f)


def test_it_refuses_a_missing_shard(model_dir):
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(ArtifactError, match="shard model-00001-of-00002.safetensors is listed but missing"):
        inspect_model_dir(model_dir)


def test_it_refuses_an_architecture_it_cannot_serve(tmp_path):
    path = write_model_dir(tmp_path / "v", arch="ViTForImageClassification", model_type="vit")
    with pytest.raises(ArtifactError, match="not servable yet"):
        inspect_model_dir(path)
