"""The agent's token from a file (--token-file, MODELGRID_AGENT_TOKEN_FILE): read once, stripped, and refused when
it cannot be the agent's secret."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import _token, build_parser
from agent.token_file import TokenFileError, read_token_file

ROOT = Path(__file__).resolve().parents[2]


def token_file(tmp_path: Path, text: str, mode: int = 0o600, name: str = "gpu-node-1") -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


def test_it_reads_the_token_stripped_of_its_newline(tmp_path):
    assert read_token_file(str(token_file(tmp_path, "  mg_agent_abc\n"))) == "mg_agent_abc"
    assert read_token_file(str(token_file(tmp_path, "mg_agent_abc", mode=0o440))) == "mg_agent_abc"


@pytest.mark.parametrize("text, mode, said", [
    ("mg_agent_abc\n", 0o644, "every user may read or write it (mode 0644)"),
    ("mg_agent_abc\n", 0o602, "every user may read or write it (mode 0602)"),
    (" \n\n", 0o600, "empty; write the token"),
    ("mg_agent_abc\nmg_agent_def\n", 0o600, "more than one word"),
    ("x" * 5000, 0o600, "longer than 4096 bytes"),
    ("t\u00f6ken", 0o600, "not ASCII text"),
])
def test_it_refuses_a_file_that_cannot_be_the_agents_secret(tmp_path, text, mode, said):
    path = token_file(tmp_path, text, mode)
    with pytest.raises(TokenFileError) as refused:
        read_token_file(str(path))
    assert str(refused.value).startswith(f"token file {path}: {said}")


def test_it_refuses_a_missing_file_and_a_fifo_without_hanging(tmp_path):
    with pytest.raises(TokenFileError, match="no such file"):
        read_token_file(str(tmp_path / "absent"))
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(TokenFileError, match="not a regular file"):
        read_token_file(str(tmp_path / "fifo"))


def test_a_mounted_secret_behind_symlinks_is_read(tmp_path):
    """Kubernetes mounts each key of a Secret as a symlink into a ..data directory."""
    data = tmp_path / "..2026_12_07" / "gpu-node-1"
    data.parent.mkdir()
    data.write_text("mg_agent_abc")
    data.chmod(0o440)
    (tmp_path / "..data").symlink_to(data.parent.name)
    (tmp_path / "gpu-node-1").symlink_to("..data/gpu-node-1")
    assert read_token_file(str(tmp_path / "gpu-node-1")) == "mg_agent_abc"


def parse(*args: str, env: dict[str, str] | None = None, monkeypatch=None):
    for name in ("MODELGRID_AGENT_TOKEN", "MODELGRID_AGENT_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    parser = build_parser()  # the variables are defaults: read when the parser is built
    return parser, parser.parse_args(["run", "--console", "http://x", *args])


def test_the_file_is_named_by_the_flag_or_the_variable(tmp_path, monkeypatch):
    path = str(token_file(tmp_path, "mg_agent_abc\n"))
    assert _token(*parse("--token-file", path, monkeypatch=monkeypatch)) == "mg_agent_abc"
    assert _token(*parse(env={"MODELGRID_AGENT_TOKEN_FILE": path}, monkeypatch=monkeypatch)) == "mg_agent_abc"
    assert _token(*parse(env={"MODELGRID_AGENT_TOKEN": "mg_agent_env"}, monkeypatch=monkeypatch)) == "mg_agent_env"


def test_two_sources_or_a_bad_file_stop_it_before_it_starts(tmp_path, monkeypatch, capsys):
    good, loose = str(token_file(tmp_path, "a")), str(token_file(tmp_path, "b", mode=0o644, name="loose"))
    for args, env, said in [
        (("--token-file", good), {"MODELGRID_AGENT_TOKEN": "t"}, "give the agent token one way"),
        ((), {}, "an agent token is required: pass --token or set MODELGRID_AGENT_TOKEN, or name a file"),
        (("--token-file", loose), {}, f"token file {loose}: every user may read"),
    ]:
        with pytest.raises(SystemExit) as exited:
            _token(*parse(*args, env=env, monkeypatch=monkeypatch))
        assert exited.value.code == 2 and said in capsys.readouterr().err


def test_an_agent_started_with_the_variable_serves_and_never_prints_the_token(tmp_path):
    path = token_file(tmp_path, "mg_agent_abc\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELGRID_AGENT_TOKEN")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "run", "--console", "http://127.0.0.1:1", "--gpus", "sim:1x1GiB",
         "--name", "token-file-test", "--warm-workers", "0", "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, env=env | {"MODELGRID_AGENT_TOKEN_FILE": str(path)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert select.select([proc.stdout], [], [], 90)[0], "no output within 90 s"
        assert proc.stdout.readline().startswith("ModelGrid agent token-file-test serving inference on ")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        assert "mg_agent_abc" not in out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
