import pytest

from tests.e2e.stack import start


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """The demo tiny Llama, written by the same code `make run` uses, in a model store."""
    from agent.workers.demo_models import build_tiny_llama

    store = tmp_path_factory.mktemp("data") / "models"
    path = store / "tiny-llama"
    build_tiny_llama(path)
    return path


@pytest.fixture(scope="session")
def stack(tiny_llama):
    """One running `manage.py up` shared by the end-to-end and browser tests."""
    running, drop_db = start(tiny_llama.parent.parent)
    yield running
    running.stop()
    drop_db()
