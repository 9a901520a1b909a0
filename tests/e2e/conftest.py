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


@pytest.fixture(scope="session")
def llama64(tmp_path_factory):
    """A tiny Llama with 64-wide attention heads (vLLM's CPU attention takes no narrower), and two adapters."""
    from agent.workers.demo_models import build_tiny_llama_64
    from tests.adapter_files import write_adapter

    root = tmp_path_factory.mktemp("vllm-models")
    model = build_tiny_llama_64(root / "llama64")
    for i in (1, 2):
        write_adapter(root / f"lora{i}", {f"model.layers.{n}.mlp.up_proj": (8, 128, 256) for n in range(2)}, seed=i)
    return model
