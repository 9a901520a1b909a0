"""Production settings come from the environment: `manage.py check --deploy` is clean with exactly the variables
docs/operations.md documents, the embedded defaults stay plain http on 127.0.0.1, and the data dir and the SQLite
files are private to their owner (0700/0600) whatever the umask."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "operations.md"


def production_variables() -> dict[str, str]:
    """The variables of the ```dotenv block in docs/operations.md (the one an operator copies)."""
    blocks = re.findall(r"```dotenv\n(.*?)```", DOCS.read_text(), re.S)
    assert len(blocks) == 1, "docs/operations.md should have exactly one ```dotenv block of production variables"
    pairs = (line.split("=", 1) for line in blocks[0].splitlines() if line.strip() and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def run(args: list[str], env: dict[str, str], umask: int = 0o022) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "console.settings"} | env,
        preexec_fn=lambda: os.umask(umask),
    )


def settings_in(env: dict[str, str], *names: str) -> dict:
    code = ("import django, json; django.setup(); from django.conf import settings; "
            f"print(json.dumps({{n: getattr(settings, n) for n in {list(names)!r}}}, default=str))")
    result = run(["-c", code], env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_check_deploy_is_clean_with_the_documented_production_variables(tmp_path):
    env = production_variables() | {"MODELGRID_DATA_DIR": str(tmp_path)}
    result = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues" in output and "WARNING" not in output


def test_the_documented_variables_set_what_they_say(tmp_path):
    env = production_variables() | {"MODELGRID_DATA_DIR": str(tmp_path)}
    got = settings_in(env, "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
                      "SECURE_HSTS_SECONDS", "SECURE_PROXY_SSL_HEADER")
    assert got == {"SECURE_SSL_REDIRECT": True, "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True,
                   "SECURE_HSTS_SECONDS": int(env["SECURE_HSTS_SECONDS"]),
                   "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"]}


def test_the_embedded_defaults_stay_plain_http(tmp_path):
    got = settings_in({"MODELGRID_DATA_DIR": str(tmp_path)}, "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE",
                      "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS", "SECURE_PROXY_SSL_HEADER",
                      "SECURE_CONTENT_TYPE_NOSNIFF")
    assert got == {"SECURE_SSL_REDIRECT": False, "SESSION_COOKIE_SECURE": False, "CSRF_COOKIE_SECURE": False,
                   "SECURE_HSTS_SECONDS": 0, "SECURE_PROXY_SSL_HEADER": None, "SECURE_CONTENT_TYPE_NOSNIFF": True}


def test_the_login_throttle_is_set_from_the_environment(tmp_path):
    env = {"MODELGRID_DATA_DIR": str(tmp_path), "MODELGRID_LOGIN_FAILURE_LIMIT": "3",
           "MODELGRID_LOGIN_COOLOFF_MINUTES": "2.5"}
    got = settings_in(env, "AXES_FAILURE_LIMIT", "AXES_COOLOFF_TIME")
    assert got == {"AXES_FAILURE_LIMIT": 3, "AXES_COOLOFF_TIME": "0:02:30"}


@pytest.mark.parametrize(("name", "value", "message"), [
    ("SECURE_HSTS_SECONDS", "a year", "SECURE_HSTS_SECONDS='a year' is not an integer"),
    ("SESSION_COOKIE_SECURE", "maybe", "SESSION_COOKIE_SECURE='maybe' is not a boolean"),
    ("MODELGRID_PROXY_SSL_HEADER", "X Forwarded Proto",
     "MODELGRID_PROXY_SSL_HEADER='X Forwarded Proto' is not an HTTP header name"),
    ("MODELGRID_LOGIN_FAILURE_LIMIT", "0", "MODELGRID_LOGIN_FAILURE_LIMIT=0 must be at least 1"),
])
def test_a_bad_value_fails_loudly_and_names_the_variable(tmp_path, name, value, message):
    result = run(["manage.py", "check"], {"MODELGRID_DATA_DIR": str(tmp_path), name: value})
    assert result.returncode != 0
    assert message in result.stderr


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


OPEN_DATABASE = """
import django, json, os, stat
django.setup()
from django.conf import settings
from django.db import connection
with connection.cursor() as c:
    c.execute("CREATE TABLE IF NOT EXISTS t (x)")
    c.execute("INSERT INTO t VALUES (1)")
    # While the connection is open, the WAL and shared-memory files exist beside the database.
    names = sorted(os.listdir(settings.DATA_DIR))
    print(json.dumps({n: stat.S_IMODE(os.stat(settings.DATA_DIR / n).st_mode) for n in names}))
"""


def test_a_new_data_dir_and_its_database_files_are_private_even_with_a_permissive_umask(tmp_path):
    data = tmp_path / "nested" / "data"
    result = run(["-c", OPEN_DATABASE], {"MODELGRID_DATA_DIR": str(data)}, umask=0)
    assert result.returncode == 0, result.stderr
    modes = json.loads(result.stdout)
    assert {"modelgrid.sqlite3", "modelgrid.sqlite3-wal", "modelgrid.sqlite3-shm", "secret_key"} <= set(modes)
    assert modes == {name: 0o600 for name in modes}
    assert mode(data) == 0o700


def test_an_existing_database_left_readable_by_others_is_made_private(tmp_path):
    for name in ("modelgrid.sqlite3", "modelgrid.sqlite3-wal"):
        (tmp_path / name).touch(mode=0o644)
        (tmp_path / name).chmod(0o644)
    result = run(["-c", OPEN_DATABASE], {"MODELGRID_DATA_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    modes = json.loads(result.stdout)
    assert all(modes[name] == 0o600 for name in modes if name.startswith("modelgrid.sqlite3"))


def test_the_database_and_redis_urls_and_the_admin_password_come_from_files(tmp_path):
    # A mounted secret (Kubernetes, compose) names a file, so the password is in neither the environment nor argv.
    (tmp_path / "db").write_text("postgres://modelgrid:s3cret@db.example:5432/grid\n")
    (tmp_path / "redis").write_text("redis://:s3cret@redis.example:6379/0\n")
    env = {"MODELGRID_DATA_DIR": str(tmp_path / "data"), "DATABASE_URL_FILE": str(tmp_path / "db"),
           "REDIS_URL_FILE": str(tmp_path / "redis")}
    got = settings_in(env, "DATABASES", "CHANNEL_LAYERS")
    database = got["DATABASES"]["default"]
    assert (database["HOST"], database["PASSWORD"], database["NAME"]) == ("db.example", "s3cret", "grid")
    assert "redis.example" in json.dumps(got["CHANNEL_LAYERS"])


@pytest.mark.parametrize("env, says", [
    ({"DATABASE_URL_FILE": "/nonexistent/db"}, "DATABASE_URL_FILE='/nonexistent/db' cannot be read"),
    ({"REDIS_URL": "redis://a", "REDIS_URL_FILE": "/etc/hostname"}, "set REDIS_URL or REDIS_URL_FILE, not both"),
])
def test_a_secret_file_that_cannot_be_used_stops_the_console_with_its_name(tmp_path, env, says):
    result = run(["-c", "import django; django.setup()"], {"MODELGRID_DATA_DIR": str(tmp_path / "data")} | env)
    assert result.returncode != 0 and says in result.stderr


@pytest.mark.django_db
def test_the_first_admins_password_comes_from_a_file(tmp_path, monkeypatch):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    (tmp_path / "password").write_text("correct horse battery\n")
    monkeypatch.setenv("MODELGRID_ADMIN_PASSWORD_FILE", str(tmp_path / "password"))
    call_command("ensureadmin")
    assert get_user_model().objects.get(username="admin").check_password("correct horse battery")
