"""Files that are not what their names say: FIFOs, devices, directories, huge or unreachable paths.

Each case runs the reader in a child process with a deadline (see isolated.py): before the fix a
FIFO named model.safetensors blocked the request until something wrote to it.
"""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from agent.artifacts import ArtifactError, estimate, inspect_model_dir, read_model_dir, read_safetensors_header
from agent.artifacts.adapters import read_adapter_dir
from agent.artifacts.limits import MAX_JSON_BYTES
from tests.adapter_files import write_adapter
from tests.agent.artifacts.isolated import outcome
from tests.conftest import write_model_dir

UP = "model.layers.0.mlp.up_proj"


def _replace_with_fifo(path):
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_it_refuses_a_fifo_in_a_model_directory_instead_of_blocking(tmp_path, name):
    path = write_model_dir(tmp_path / "m")
    _replace_with_fifo(path / name)
    result = outcome("agent.artifacts.inspect_model_dir", path)
    assert result.startswith("ArtifactError:"), result
    assert f"{path / name}: is a FIFO, device or socket, not a regular file" in result


def test_it_refuses_a_fifo_as_a_safetensors_index(tmp_path):
    path = write_model_dir(tmp_path / "m")
    os.mkfifo(path / "model.safetensors.index.json")
    result = outcome("agent.artifacts.read_model_dir", path)
    assert "model.safetensors.index.json: is a FIFO, device or socket" in result, result


@pytest.mark.parametrize("name", ["adapter_config.json", "adapter_model.safetensors"])
def test_it_refuses_a_fifo_in_an_adapter_directory_instead_of_blocking(tmp_path, name):
    path = write_adapter(tmp_path / "a", {UP: (8, 16, 32)})
    _replace_with_fifo(path / name)
    result = outcome("agent.artifacts.read_adapter_dir", path)
    assert f"ArtifactError: {path / name}: is a FIFO, device or socket" in result, result


def test_the_estimator_refuses_a_fifo_given_as_a_bare_safetensors_file(tmp_path):
    os.mkfifo(tmp_path / "w.safetensors")
    result = outcome("agent.artifacts.read_safetensors_header", tmp_path / "w.safetensors")
    assert "w.safetensors: is a FIFO, device or socket" in result, result


def test_it_refuses_a_device_linked_as_model_weights(tmp_path):
    path = write_model_dir(tmp_path / "m")
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(ArtifactError, match=r"model\.safetensors: is a FIFO, device or socket, not a regular file"):
        inspect_model_dir(path)


def test_it_refuses_a_directory_named_like_a_file(tmp_path):
    path = write_model_dir(tmp_path / "m")
    (path / "config.json").unlink()
    (path / "config.json").mkdir()
    with pytest.raises(ArtifactError, match=r"config\.json: is a directory, not a regular file"):
        read_model_dir(path)


def test_it_refuses_a_config_larger_than_the_json_limit(tmp_path):
    path = write_model_dir(tmp_path / "m")
    with (path / "config.json").open("r+b") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(ArtifactError, match=rf"config\.json: is {MAX_JSON_BYTES + 1:,} bytes; at most"):
        read_model_dir(path)


@pytest.mark.parametrize("reader", [inspect_model_dir, read_adapter_dir, estimate, read_safetensors_header])
def test_a_path_too_long_for_the_file_system_is_an_artifact_error(tmp_path, reader):
    with pytest.raises(ArtifactError, match="File name too long"):
        reader(tmp_path / ("x" * 300))


@pytest.mark.parametrize("reader", [inspect_model_dir, read_adapter_dir, estimate])
def test_a_path_with_a_nul_character_is_an_artifact_error(tmp_path, reader):
    with pytest.raises(ArtifactError, match="NUL character"):
        reader(f"{tmp_path}/a\0b")


@pytest.mark.parametrize("shard", ["../other/model.safetensors", "/etc/passwd", "sub/model.safetensors", "x.bin"])
def test_an_index_may_only_name_shard_files_in_the_model_directory(tmp_path, shard):
    path = write_model_dir(tmp_path / "m")
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(ArtifactError, match=r"index\.json: field 'weight_map' names shard .*\*\.safetensors file"):
        read_model_dir(path)


def test_an_index_that_is_not_a_weight_map_is_refused(tmp_path):
    path = write_model_dir(tmp_path / "m")
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": ["list"]}}))
    with pytest.raises(ArtifactError, match=r"index\.json: not a valid safetensors index"):
        read_model_dir(path)


def test_sharded_weights_are_still_read(tmp_path):
    path = write_model_dir(tmp_path / "m")
    (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
    save_file({"extra": np.zeros(4, np.float32)}, str(path / "model-00002-of-00002.safetensors"))
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                  "extra": "model-00002-of-00002.safetensors"}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    artifact = read_model_dir(path)
    assert [f.name for f in artifact.files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert any(t.name == "extra" for t in artifact.tensors)
