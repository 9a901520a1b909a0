"""compose.yaml: valid against the Compose Specification (the schema check-jsonschema vendors, offline), and built
as docs/install.md says: two consoles on one database and one Redis, one-shot migrations and agent token, health
checks that gate the start order, and secrets from files, never in the file itself."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
SECRETS_SCRIPT = ROOT / "deploy" / "docker" / "compose-secrets.sh"
CONSOLES = ("console-1", "console-2")
ONE_SHOTS = ("migrate", "agent-token", "demo-models")


def check_jsonschema(path: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # YAML merge keys (<<) resolved, as compose resolves them


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def test_it_is_a_valid_compose_file():
    result = check_jsonschema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="Debian's docker-compose (1.29) is not installed")
def test_compose_1_29_reads_it_too(tmp_path):
    result = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0 and not result.stderr, result.stderr


def test_an_invalid_compose_file_fails_the_check(tmp_path):
    bad = tmp_path / "compose.yaml"
    text = COMPOSE.read_text().replace("condition: service_completed_successfully", "condition: when_ready", 1)
    bad.write_text(text)
    result = check_jsonschema(bad)
    assert result.returncode != 0
    assert "when_ready" in result.stdout


def test_two_consoles_share_one_database_and_one_redis(services):
    consoles = [services[name] for name in CONSOLES]
    assert consoles[0]["image"].startswith("modelgrid/console:")
    for key in ("DATABASE_URL_FILE", "REDIS_URL_FILE", "SECRET_KEY_FILE"):
        assert {c["environment"][key] for c in consoles} == {f"/run/secrets/{key[:-5].lower()}"}
    assert all({"database_url", "redis_url", "secret_key"} <= set(c["secrets"]) for c in consoles)
    assert "command" not in consoles[0]  # the image's: up --no-agent --no-migrate


def test_consoles_publish_on_loopback_only(services):
    ports = [port for name in CONSOLES for port in services[name]["ports"]]
    assert ports == ["127.0.0.1:8001:8000", "127.0.0.1:8002:8000"]
    published = [name for name, s in services.items() if "ports" in s and name not in CONSOLES]
    assert published == []  # the database, Redis and the agent's data plane stay on the compose network


@pytest.mark.parametrize("name", ["postgres", "redis", *CONSOLES, "agent"])
def test_long_running_services_have_healthchecks(services, name):
    test = services[name]["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1


def test_the_start_order_waits_for_health_and_one_shots(services):
    for name in CONSOLES:
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["agent-token"]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    agent = services["agent"]["depends_on"]
    assert agent["agent-token"] == {"condition": "service_completed_successfully"}
    assert agent["demo-models"] == {"condition": "service_completed_successfully"}


def test_migrations_run_once_outside_the_consoles(services):
    assert "migrate --noinput" in " ".join(services["migrate"]["command"])
    for name in ONE_SHOTS:
        assert services[name]["restart"] == "no"


def test_the_agent_has_simulated_gpus_and_its_token_from_a_file(services):
    agent = services["agent"]
    command = agent["command"]
    assert command[command.index("--gpus") + 1] == "sim:2x24GiB"
    assert command[command.index("--console") + 1] == "http://console:8000"
    assert agent["environment"] == {"MODELGRID_AGENT_TOKEN_FILE": "/run/modelgrid/agent-token"}
    assert "agent-token:/run/modelgrid:ro" in agent["volumes"]
    assert agent["build"]["target"] == "cpu"
    assert "createagenttoken sim-1" in " ".join(services["agent-token"]["command"])


def test_no_secret_is_written_in_the_file(compose, services):
    secretive = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY$|DATABASE_URL$|REDIS_URL$")
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            if secretive.search(key):
                assert key.endswith("_FILE") and str(value).startswith("/run/"), f"{name}: {key}"
            assert not re.search(r"://[^/@\s]*:[^/@\s]+@", str(value)), f"{name}: {key} holds a credential"
        assert not [a for a in service.get("command") or [] if "requirepass" in str(a) or "--token" == a], name
    for secret in compose["secrets"].values():
        assert secret["file"].startswith("deploy/docker/secrets/")
    gitignore = (ROOT / "deploy" / "docker" / "secrets" / ".gitignore").read_text().split()
    assert "*" in gitignore


def test_every_secret_a_service_names_is_declared(compose, services):
    declared = set(compose["secrets"])
    for service in services.values():
        assert set(service.get("secrets", [])) <= declared
        for key, value in (service.get("environment") or {}).items():
            if key.endswith("_FILE") and str(value).startswith("/run/secrets/"):
                assert Path(value).name in service["secrets"], key


@pytest.mark.skipif(shutil.which("od") is None, reason="needs od (coreutils)")
def test_the_secrets_script_writes_each_secret_once(tmp_path):
    script = tmp_path / "compose-secrets.sh"
    shutil.copy(SECRETS_SCRIPT, script)
    subprocess.run(["sh", str(script)], check=True, capture_output=True, timeout=30)
    secrets = tmp_path / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    values = {p.name: p.read_text().strip() for p in secrets.iterdir()}
    assert set(values) == {"secret_key", "admin_password", "db_password", "database_url", "redis_conf", "redis_url"}
    assert values["database_url"] == f"postgres://modelgrid:{values['db_password']}@postgres:5432/modelgrid"
    redis_password = values["redis_conf"].removeprefix("requirepass ")
    assert values["redis_url"] == f"redis://:{redis_password}@redis:6379/0"
    assert len(values["secret_key"]) == 64 and len(set(values.values())) == len(values)
    subprocess.run(["sh", str(script)], check=True, capture_output=True, timeout=30)
    assert {p.name: p.read_text().strip() for p in secrets.iterdir()} == values  # kept, not rotated
    if os.getuid() != 0:  # root reads anything; others must not write what the containers read
        assert not os.access(secrets / "database_url", os.W_OK)
