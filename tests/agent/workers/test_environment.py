"""Every process the agent starts (a replica's worker, an engine's server, a text process) gets a minimal
environment: what Python, torch and vLLM need from the agent's, and no secret of the agent's or of the console it
may run inside. Each is started here with secrets in the parent's environment and dumps what it got."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agent.engines.vllm.server import VllmServer
from agent.serving import textpool
from agent.workers import processes
from agent.workers.environment import child_environment
from agent.workers.spec import WorkerSpec

SECRETS = {
    "MODELGRID_AGENT_TOKEN": "agent-token-secret",
    "MODELGRID_ADMIN_PASSWORD": "admin-password-secret",
    "DATABASE_URL": "postgres://app:db-secret@db/modelgrid",
    "REDIS_URL": "redis://:redis-secret@cache:6379/0",
    "DJANGO_SECRET_KEY": "django-secret",
    "HF_TOKEN": "hf-secret",
    "VLLM_API_KEY": "parents-engine-key",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "HTTPS_PROXY": "http://user:proxy-secret@proxy:3128",
}
NEEDED = {"OMP_NUM_THREADS": "2", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
          "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HF_HOME": "/tmp/hf", "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}


@pytest.fixture
def parent_env(monkeypatch):
    for name, value in (SECRETS | NEEDED).items():
        monkeypatch.setenv(name, value)


def dumper(path: Path) -> str:
    """Python code that writes its environment to `path` as JSON."""
    return f"import json, os; open({str(path)!r}, 'w').write(json.dumps(dict(os.environ)))"


def assert_minimal(env: dict[str, str]) -> None:
    leaked = {name for name, value in env.items() if any(s in value for s in SECRETS.values())}
    assert not leaked and not set(SECRETS) & set(env), leaked | (set(SECRETS) & set(env))
    assert "PATH" in env and all(env[name] == value for name, value in NEEDED.items())


def test_the_allowlist_keeps_what_processes_need_and_drops_secrets():
    env = child_environment(SECRETS | NEEDED | {"PATH": "/usr/bin", "HOME": "/home/agent", "DJANGO_SETTINGS_MODULE":
                                                "console.settings", "MODELGRID_DATA_DIR": "/var/lib/modelgrid"})
    assert env == NEEDED | {"PATH": "/usr/bin", "HOME": "/home/agent"}


def test_a_replicas_worker_gets_no_secret(parent_env, tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "WORKER_COMMAND", ("-c", dumper(tmp_path / "env.json")))
    process, conn = processes.spawn_worker()
    try:
        process.join(30)
        assert process.exitcode == 0
    finally:
        conn.close()
        process.close()
    env = json.loads((tmp_path / "env.json").read_text())
    assert_minimal(env)
    assert env["PYTHONPATH"].split(":")[0] == str(Path(processes.__file__).resolve().parents[2])


def test_an_engine_server_gets_its_own_key_and_no_other_secret(parent_env, tmp_path):
    fake = tmp_path / "engine-python"
    fake.write_text(f"#!{sys.executable}\n{dumper(tmp_path / 'env.json')}\n")
    fake.chmod(0o755)
    spec = WorkerSpec(1, str(tmp_path), "causal-lm", engine="vllm", engine_python=str(fake),
                      engine_env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))
    server = VllmServer(spec)
    server.start()
    assert server.process is not None and server.process.wait(30) == 0
    env = json.loads((tmp_path / "env.json").read_text())
    assert env.pop("VLLM_API_KEY") == server.key  # its own, not the parent's
    assert_minimal(env)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and "PYTHONPATH" not in env


def test_a_text_process_gets_no_secret(parent_env, tmp_path, monkeypatch):
    seen = {}

    def popen(argv, env, **_kwargs):
        seen.update(env)
        raise OSError("not started: the environment is what this test reads")

    monkeypatch.setattr(textpool.subprocess, "Popen", popen)
    with pytest.raises(OSError):
        textpool._Process(1 << 30)
    assert_minimal(seen)
