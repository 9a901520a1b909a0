"""JSON that Python's parser accepts but no artifact needs: huge integers, NaN, Infinity, deep nesting.

Before the fix these raised ValueError or RecursionError (a 500 in the console) or were accepted.
"""

import struct

import pytest

from agent.artifacts import ArtifactError, estimate, read_model_dir, read_safetensors_header
from agent.artifacts.adapters import read_adapter_dir
from tests.adapter_files import write_adapter
from tests.conftest import write_model_dir

UP = "model.layers.0.mlp.up_proj"
HUGE = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000


def _patch_config(path, name, replace):
    text = (path / name).read_text()
    (path / name).write_text(replace(text))


def _write_header(path, header_text: str, data: bytes = b"") -> None:
    body = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


def test_a_5000_digit_integer_in_config_json_names_the_file_and_field(tmp_path):
    path = write_model_dir(tmp_path / "m")
    _patch_config(path, "config.json", lambda t: t.replace('"hidden_size": 16', f'"hidden_size": {HUGE}'))
    with pytest.raises(ArtifactError, match=r"config\.json: field 'hidden_size' holds an integer of 5000 digits"):
        estimate(path)


def test_a_5000_digit_rank_in_adapter_config_names_the_file_and_field(tmp_path):
    path = write_adapter(tmp_path / "a", {UP: (8, 16, 32)})
    _patch_config(path, "adapter_config.json", lambda t: t.replace('"r": 8', f'"r": {HUGE}'))
    with pytest.raises(ArtifactError, match=r"adapter_config\.json: field 'r' holds an integer of 5000 digits"):
        read_adapter_dir(path)


def test_a_5000_digit_integer_in_a_safetensors_header_names_the_tensor_and_field(tmp_path):
    f = tmp_path / "w.safetensors"
    _write_header(f, f'{{"w": {{"dtype": "F32", "shape": [{HUGE}], "data_offsets": [0, 16]}}}}', b"\0" * 16)
    with pytest.raises(ArtifactError, match=r"w\.safetensors: header field 'w\.shape' holds an integer of 5000"):
        read_safetensors_header(f)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_deeply_nested_json_is_refused_without_recursion_error(tmp_path, name):
    path = write_model_dir(tmp_path / "m")
    (path / name).write_text(DEEP)
    with pytest.raises(ArtifactError, match=rf"{name}: nested too deeply"):
        read_model_dir(path)


def test_deeply_nested_adapter_config_is_refused(tmp_path):
    path = write_adapter(tmp_path / "a", {UP: (8, 16, 32)})
    (path / "adapter_config.json").write_text('{"peft_type": ' + DEEP + "}")
    with pytest.raises(ArtifactError, match=r"adapter_config\.json: nested too deeply"):
        read_adapter_dir(path)


def test_deeply_nested_safetensors_header_is_refused(tmp_path):
    f = tmp_path / "w.safetensors"
    _write_header(f, '{"__metadata__": ' + "[" * 200 + "]" * 200 + "}")
    with pytest.raises(ArtifactError, match=r"w\.safetensors: header is nested too deeply \(at most 64 levels\)"):
        read_safetensors_header(f)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_lora_alpha_must_be_a_finite_number(tmp_path, value):
    path = write_adapter(tmp_path / "a", {UP: (8, 16, 32)})
    _patch_config(path, "adapter_config.json", lambda t: t.replace('"lora_alpha": 16', f'"lora_alpha": {value}'))
    with pytest.raises(ArtifactError, match=r"adapter_config\.json: field 'lora_alpha' holds .*numbers must be finite"):
        read_adapter_dir(path)


def test_nan_in_config_json_is_refused(tmp_path):
    path = write_model_dir(tmp_path / "m")
    _patch_config(path, "config.json", lambda t: t.replace("{", '{"rms_norm_eps": NaN, ', 1))
    with pytest.raises(ArtifactError, match=r"config\.json: field 'rms_norm_eps' holds NaN"):
        read_model_dir(path)


def test_ordinary_json_still_parses(tmp_path):
    path = write_model_dir(tmp_path / "m")
    _patch_config(path, "config.json", lambda t: t.replace("{", '{"rms_norm_eps": 1e-06, "x": [-3, {"y": null}], ', 1))
    config = read_model_dir(path).config
    assert config["rms_norm_eps"] == 1e-06
    assert config["x"] == [-3, {"y": None}]
