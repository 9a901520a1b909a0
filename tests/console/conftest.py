"""Fixtures shared by the console's database tests: a connected host with simulated GPUs, a model, and a
signed-in browser client."""

import pytest
from django.contrib.auth import get_user_model

from console.catalog.services import register_model
from console.fleet.models import Gpu, Host

GiB = 1024**3


@pytest.fixture
def host(db):
    h = Host.objects.create(name="h1", endpoint="http://127.0.0.1:9", connected=True)
    Gpu.objects.create(host=h, index=0, uuid="SIM-0", name="sim", total_bytes=24 * GiB, simulated=True)
    Gpu.objects.create(host=h, index=1, uuid="SIM-1", name="sim", total_bytes=8 * GiB, simulated=True)
    return h


@pytest.fixture
def model(db, model_dir):
    return register_model("tiny", str(model_dir))


@pytest.fixture
def user_client(client):
    get_user_model().objects.create_user("ann", password="a-long-password")
    client.login(username="ann", password="a-long-password")
    return client
