"""Every file in a model or adapter directory, not only the ones registration parses, stays inside the roots.

Before the fix only config.json, the index and the safetensors files were resolved against the model
roots: a `tokenizer.json` (or tokenizer_config.json, chat_template.jinja, ...) symlinked outside them
was registered, and the worker and the agent later read it from wherever it pointed.
"""

import os
import re

import pytest

from agent.artifacts import OUTSIDE_ROOTS, ArtifactError, OutsideModelRoots, inspect_model_dir, read_model_dir
from agent.artifacts.adapters import read_adapter_dir
from agent.artifacts.limits import MAX_DIR_DEPTH
from tests.adapter_files import write_adapter
from tests.conftest import write_model_dir

UP = "model.layers.0.mlp.up_proj"
WORKER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                "generation_config.json", "vocab.txt", "tokenizer.model"]


@pytest.fixture
def roots(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    return [store]


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "secret"
    path.mkdir()
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    return path


@pytest.mark.parametrize("name", WORKER_FILES)
def test_a_file_the_worker_reads_linked_outside_the_roots_is_refused_naming_it(roots, outside, name):
    messages = set()
    for target in (outside / "tokenizer.json", outside / "missing"):
        model = write_model_dir(roots[0] / f"m-{target.name}")
        (model / name).symlink_to(target)
        with pytest.raises(OutsideModelRoots) as e:
            inspect_model_dir(model, roots=roots)
        messages.add(str(e.value).replace(str(model), "<model>"))
    assert messages == {f"<model>/{name}: {OUTSIDE_ROOTS}"}  # the same whether or not the target exists


def test_a_file_in_a_subdirectory_linked_outside_is_refused(roots, outside):
    model = write_model_dir(roots[0] / "m")
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "tool_use.jinja").symlink_to(outside / "tokenizer.json")
    message = re.escape(f"m/additional_chat_templates/tool_use.jinja: {OUTSIDE_ROOTS}")
    with pytest.raises(OutsideModelRoots, match=message):
        read_model_dir(model, roots=roots)


def test_a_subdirectory_linked_outside_is_refused(roots, outside):
    model = write_model_dir(roots[0] / "m")
    (model / "additional_chat_templates").symlink_to(outside)
    with pytest.raises(OutsideModelRoots, match=re.escape(f"m/additional_chat_templates: {OUTSIDE_ROOTS}")):
        inspect_model_dir(model, roots=roots)


def test_links_that_stay_inside_the_roots_are_followed_as_in_a_hub_cache(roots):
    # huggingface_hub's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
    repo = roots[0] / "models--org--m"
    model = write_model_dir(repo / "snapshots" / "abc")
    (repo / "blobs").mkdir()
    for name in ("config.json", "model.safetensors"):
        (model / name).rename(repo / "blobs" / name)
        (model / name).symlink_to(os.path.join("..", "..", "blobs", name))
    (repo / "blobs" / "tok").write_text("{}")
    (model / "tokenizer.json").symlink_to("../../blobs/tok")
    (model / "loop").symlink_to(model)  # a cycle inside the roots is walked once
    assert inspect_model_dir(model, roots=roots).weights_bytes > 0


def test_a_dangling_link_inside_the_roots_is_not_an_escape(roots):
    model = write_model_dir(roots[0] / "m")
    (model / "tokenizer.json").symlink_to(roots[0] / "nowhere.json")
    assert inspect_model_dir(model, roots=roots).weights_bytes > 0


def test_a_fifo_named_like_a_tokenizer_file_is_refused(roots):
    model = write_model_dir(roots[0] / "m")
    os.mkfifo(model / "tokenizer_config.json")
    with pytest.raises(ArtifactError, match=r"m/tokenizer_config\.json: is a FIFO, device or socket, not a regular "
                                            r"file"):
        inspect_model_dir(model, roots=roots)


def test_a_directory_with_more_entries_than_any_model_is_refused(roots, monkeypatch):
    monkeypatch.setattr("agent.artifacts.tree.MAX_DIR_ENTRIES", 50)  # the mechanism, without 10,000 files
    model = write_model_dir(roots[0] / "m")
    many = model / "many"
    many.mkdir()
    for i in range(30):
        (many / str(i)).touch()
        (many / f".{i}").touch()  # hidden entries are listed, so they count too
    with pytest.raises(ArtifactError, match=r"m: holds more than 50 files and directories"):
        inspect_model_dir(model, roots=roots)


def test_directories_nested_deeper_than_any_model_are_refused(roots):
    model = write_model_dir(roots[0] / "m")
    deep = model.joinpath(*["d"] * (MAX_DIR_DEPTH + 1))
    deep.mkdir(parents=True)
    with pytest.raises(ArtifactError, match=rf"nests directories more than {MAX_DIR_DEPTH} levels below"):
        inspect_model_dir(model, roots=roots)


def test_hidden_entries_are_not_walked(roots, outside):
    model = write_model_dir(roots[0] / "m")
    (model / ".cache").symlink_to(outside)  # no reader looks for a dotted name
    (model / ".git").mkdir()
    (model / ".git" / "link").symlink_to(outside / "tokenizer.json")
    assert inspect_model_dir(model, roots=roots).weights_bytes > 0


def test_an_adapter_file_linked_outside_the_roots_is_refused(roots, outside):
    adapter = write_adapter(roots[0] / "a", {UP: (8, 16, 32)})
    (adapter / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    with pytest.raises(OutsideModelRoots, match=re.escape(f"a/tokenizer.json: {OUTSIDE_ROOTS}")):
        read_adapter_dir(adapter, roots=roots)


def test_without_roots_links_are_followed_as_before(tmp_path, outside):
    model = write_model_dir(tmp_path / "m")
    (model / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    assert inspect_model_dir(model).weights_bytes > 0
