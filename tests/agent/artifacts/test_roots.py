"""Model roots: paths resolve (symlinks included) inside MODELGRID_MODEL_ROOTS or are refused.

Outside the roots every path gets one message, whether or not it exists, so the console cannot
be used to probe the host (before: /root/.ssh and /root/nonexistent answered differently).
"""

import os
import re

import pytest

from agent.artifacts import (
    OUTSIDE_ROOTS,
    ArtifactError,
    OutsideModelRoots,
    estimate,
    inspect_model_dir,
    read_model_dir,
    resolve_in_roots,
)
from agent.artifacts.adapters import read_adapter_dir
from tests.adapter_files import write_adapter
from tests.conftest import write_model_dir

UP = "model.layers.0.mlp.up_proj"


@pytest.fixture
def roots(tmp_path):
    first, second = tmp_path / "store", tmp_path / "extra"
    first.mkdir()
    second.mkdir()
    return [first, second]


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "secret"
    path.mkdir()
    (path / "key").write_text("not for you")
    return path


def test_a_path_inside_a_root_resolves_to_its_real_path(roots):
    model = write_model_dir(roots[1] / "m")
    assert resolve_in_roots(str(model), roots, kind="dir") == model.resolve()
    assert resolve_in_roots(str(model / "config.json"), roots, kind="file") == (model / "config.json").resolve()


def test_a_relative_path_is_taken_from_the_first_root(roots):
    write_model_dir(roots[0] / "org" / "m")
    assert resolve_in_roots("org/m", roots, kind="dir") == (roots[0] / "org" / "m").resolve()


@pytest.mark.parametrize("path", ["/root/.ssh", "/root/nonexistent", "/etc/passwd", "/", "/nonexistent/x" * 40])
def test_every_path_outside_the_roots_gets_the_same_message(roots, path):
    with pytest.raises(OutsideModelRoots) as e:
        resolve_in_roots(path, roots)
    assert str(e.value) == OUTSIDE_ROOTS


def test_existing_and_missing_outside_paths_are_indistinguishable(roots, outside):
    errors = []
    for path in (outside, outside / "key", outside / "missing", outside / "missing" / "deeper"):
        with pytest.raises(OutsideModelRoots) as e:
            resolve_in_roots(str(path), roots, kind="dir")
        errors.append((type(e.value), str(e.value)))
    assert len(set(errors)) == 1


def test_a_symlink_inside_the_roots_is_followed_and_judged_by_its_target(roots, outside):
    (roots[0] / "escape").symlink_to(outside)
    (roots[0] / "dangling").symlink_to(outside / "missing")
    write_model_dir(roots[1] / "m")
    (roots[0] / "alias").symlink_to(roots[1] / "m")
    for name in ("escape", "dangling"):
        with pytest.raises(OutsideModelRoots, match=f"^{re.escape(OUTSIDE_ROOTS)}$"):
            resolve_in_roots(name, roots)
    assert resolve_in_roots("alias", roots, kind="dir") == (roots[1] / "m").resolve()


def test_a_root_given_through_a_symlink_still_contains_its_paths(tmp_path, roots):
    (tmp_path / "link").symlink_to(roots[0])
    write_model_dir(roots[0] / "m")
    assert resolve_in_roots(str(roots[0] / "m"), [tmp_path / "link"], kind="dir") == (roots[0] / "m").resolve()


@pytest.mark.parametrize("path", ["~", "~/models/m", "~root/.ssh"])
def test_a_tilde_is_never_expanded(roots, path):
    with pytest.raises(ArtifactError, match="'~' is not expanded"):
        resolve_in_roots(path, roots)


@pytest.mark.parametrize("path", ["../secret", "m/../../secret", "m/.."])
def test_dot_dot_is_refused_even_when_it_would_stay_inside(roots, path):
    write_model_dir(roots[0] / "m")
    with pytest.raises(ArtifactError, match=r"'\.\.' is not accepted in a path"):
        resolve_in_roots(path, roots)


@pytest.mark.parametrize(("path", "why"), [("", "path is empty"), ("  ", "path is empty"),
                                           ("m\0x", "NUL character"), ("m/" * 3000, "at most 4,096 are accepted"),
                                           (b"/etc", "path must be text"), (7, "path must be text")])
def test_an_empty_overlong_or_non_text_path_is_refused(roots, path, why):
    with pytest.raises(ArtifactError, match=why):
        resolve_in_roots(path, roots)


def test_inside_the_roots_messages_are_specific(roots):
    write_model_dir(roots[0] / "m")
    with pytest.raises(ArtifactError, match="no such directory in the model roots"):
        resolve_in_roots("nope", roots, kind="dir")
    with pytest.raises(ArtifactError, match="is a regular file, not a directory"):
        resolve_in_roots("m/config.json", roots, kind="dir")
    with pytest.raises(ArtifactError, match="is a directory, not a regular file"):
        resolve_in_roots("m", roots, kind="file")
    with pytest.raises(ArtifactError, match="File name too long"):
        resolve_in_roots("x" * 300, roots)


def test_fifos_inside_the_roots_are_refused(roots):
    os.mkfifo(roots[0] / "pipe")
    with pytest.raises(ArtifactError, match="is a FIFO, device or socket, not a regular file or directory"):
        resolve_in_roots("pipe", roots)


def test_no_roots_at_all_is_a_configuration_error(roots):
    with pytest.raises(ArtifactError, match="no model roots are configured"):
        resolve_in_roots("m", [])


# --- readers given roots ------------------------------------------------------------------------


def test_readers_accept_a_model_and_adapter_inside_the_roots(roots):
    model = write_model_dir(roots[0] / "m")
    adapter = write_adapter(roots[1] / "a", {UP: (8, 16, 32)})
    assert inspect_model_dir(model, roots=roots).path == model.resolve()
    assert read_model_dir("m", roots=roots).path == model.resolve()
    assert read_adapter_dir(adapter, roots=roots).path == adapter.resolve()
    assert estimate(model, roots=roots).weights_bytes > 0
    assert estimate(model / "model.safetensors", roots=roots).notes[0] == "bare safetensors file: no config.json"


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_model_file_linked_outside_the_roots_is_refused_whether_or_not_its_target_exists(roots, outside, name):
    messages = set()
    for target in (outside / "key", outside / "missing"):
        model = write_model_dir(roots[0] / f"m-{target.name}")
        (model / name).unlink()
        (model / name).symlink_to(target)
        with pytest.raises(OutsideModelRoots) as e:
            inspect_model_dir(model, roots=roots)
        messages.add(str(e.value).replace(str(model), "<model>"))
    assert messages == {f"<model>/{name}: {OUTSIDE_ROOTS}"}


def test_a_shard_linked_outside_the_roots_is_refused(roots, outside):
    model = write_model_dir(roots[0] / "m")
    (model / "model.safetensors").rename(outside / "model.safetensors")
    (model / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(OutsideModelRoots, match=r"m/model\.safetensors: path is outside the model roots"):
        estimate(model, roots=roots)
    assert inspect_model_dir(model).weights_bytes > 0  # without roots, links are followed as before


def test_adapter_weights_linked_outside_the_roots_are_refused(roots, outside):
    adapter = write_adapter(roots[0] / "a", {UP: (8, 16, 32)})
    (adapter / "adapter_model.safetensors").rename(outside / "w.safetensors")
    (adapter / "adapter_model.safetensors").symlink_to(outside / "w.safetensors")
    with pytest.raises(OutsideModelRoots, match=r"adapter_model\.safetensors: path is outside the model roots"):
        read_adapter_dir(adapter, roots=roots)


def test_readers_refuse_a_directory_outside_the_roots_with_the_one_message(roots, outside):
    for reader in (inspect_model_dir, read_adapter_dir, estimate):
        with pytest.raises(OutsideModelRoots, match=f"^{re.escape(OUTSIDE_ROOTS)}$"):
            reader(outside, roots=roots)
