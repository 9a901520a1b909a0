"""Shared fixtures. Tests that touch the database are also run on PostgreSQL + Redis (db_stack), as are the
end-to-end tests that mark themselves so (several consoles, chaos); the others run once, on the one-box stack."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file


def pytest_collection_modifyitems(items):
    # Database and consumer tests run a second time on PostgreSQL + Redis.
    for item in items:
        if item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.db_stack)
    # Files that wait out engine starts go first: a file per worker (--dist loadfile) hands files out in this order,
    # so the longest start while the others share the rest, instead of ending the run alone.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def write_model_dir(path: Path, *, hidden: int = 16, vocab: int = 32, layers: int = 1, arch="LlamaForCausalLM",
                    model_type="llama", inter: int | None = None) -> Path:
    """A small but well-formed model directory written with numpy (no torch needed); `inter` (intermediate size,
    default 2 x hidden) gives a bigger model of the same shape."""
    path.mkdir(parents=True, exist_ok=True)
    inter = inter or 2 * hidden
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": model_type,
                                                  "hidden_size": hidden, "vocab_size": vocab,
                                                  "num_hidden_layers": layers, "num_attention_heads": 4,
                                                  "intermediate_size": inter}))
    tensors = {"model.embed_tokens.weight": np.zeros((vocab, hidden), np.float32)}
    for i in range(layers):
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = np.zeros((inter, hidden), np.float32)
    save_file(tensors, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="session", autouse=True)
def own_channel_prefix():
    """Under pytest-xdist each worker's Redis channel layer (the second pass) has a prefix of its own, as do the
    consoles its tests start: two workers' groups of one name would otherwise hear each other's messages."""
    import os

    from channels.layers import channel_layers
    from django.conf import settings

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    config = settings.CHANNEL_LAYERS["default"].get("CONFIG", {})
    if worker and "prefix" in config:
        config["prefix"] = os.environ["MODELGRID_CHANNEL_PREFIX"] = f"{config['prefix']}-{worker}"
        channel_layers.backends.clear()  # a layer made before this still has the shared prefix


@pytest.fixture(scope="session", autouse=True)
def model_roots(tmp_path_factory):
    """The console reads artifacts only under its model roots; the tests' artifacts live in pytest's temporary
    directory, for the console in this process and for the ones the end-to-end tests start."""
    import os

    from django.conf import settings

    root = tmp_path_factory.getbasetemp().resolve()
    os.environ["MODELGRID_MODEL_ROOTS"] = str(root)
    settings.MODEL_ROOTS = [root]
    return root


@pytest.fixture
def model_dir(tmp_path) -> Path:
    return write_model_dir(tmp_path / "tiny")


@pytest.fixture
def api_token(db):
    from django.contrib.auth import get_user_model

    from console.accounts.models import ApiToken

    user = get_user_model().objects.create_user("ops", password="unused-password-123")
    return ApiToken.issue(user)[1]


@pytest.fixture
def api(client, api_token):
    """The Django test client with a valid bearer token and JSON helpers."""
    return _api(client, api_token)


@pytest.fixture
def admin_api(client, db):
    """`api` with an admin's (a staff user's) token: for what changes the whole fleet (hosts, strategy, alert rules)."""
    from django.contrib.auth import get_user_model

    from console.accounts.models import ApiToken

    user = get_user_model().objects.create_user("root-ops", password="unused-password-123", is_staff=True)
    return _api(client, ApiToken.issue(user)[1])


def _api(client, token: str):
    class Api:
        auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

        def get(self, url):
            return client.get(url, **self.auth)

        def post(self, url, body):
            return client.post(url, data=json.dumps(body), content_type="application/json", **self.auth)

        def patch(self, url, body):
            return client.patch(url, data=json.dumps(body), content_type="application/json", **self.auth)

        def delete(self, url):
            return client.delete(url, **self.auth)

    return Api()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, and then the connection pool (PostgreSQL) closed before the test database is dropped:
    its idle connections would otherwise keep that database 'accessed by other users'."""
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for conn in connections.all():
            if getattr(conn, "pool", None) is not None:
                conn.close()
                conn.close_pool()
