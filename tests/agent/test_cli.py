"""`python -m agent` as a real process: argument errors, and a clean stop on SIGTERM."""

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


def agent(*args: str, env_token: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "MODELGRID_AGENT_TOKEN"}
    if env_token:
        env["MODELGRID_AGENT_TOKEN"] = env_token
    return subprocess.Popen(
        [sys.executable, "-m", "agent", *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=90)
    return proc.returncode, out + err


def test_it_needs_a_token():
    code, output = finish(agent("run", "--console", "http://127.0.0.1:1", "--gpus", "sim:1x1GiB"))
    assert code == 2 and "an agent token is required: pass --token or set MODELGRID_AGENT_TOKEN" in output


def test_it_refuses_a_bad_gpu_spec_and_a_bad_listen_address():
    code, output = finish(agent("run", "--console", "http://x", "--token", "t", "--gpus", "sim:2x24XB"))
    assert code == 2 and "unknown size unit 'XB'" in output
    code, output = finish(agent("run", "--console", "http://x", "--token", "t", "--listen", "localhost"))
    assert code == 2 and "'localhost' is not HOST:PORT" in output
    code, output = finish(agent("run", "--console", "http://x", "--token", "t", "--warm-workers", "-1"))
    assert code == 2 and "'-1' is not a whole number" in output
    code, output = finish(agent("run", "--console", "http://x", "--token", "t", "--sleep-budget", "lots"))
    assert code == 2 and "'lots' is not a size like 64GiB" in output
    # Requests no longer wake replicas (only the console's desired state does): the flag is gone.
    code, output = finish(agent("run", "--console", "http://x", "--token", "t", "--wake-timeout", "5"))
    assert code == 2 and "unrecognized arguments: --wake-timeout" in output


@pytest.mark.parametrize("name, said", [("gpu-\u0430", "CYRILLIC SMALL LETTER A"), ("gpu/1", "a path separator")])
def test_a_bad_name_is_refused_before_the_agent_connects(capsys, name, said):
    from agent.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["run", "--console", "http://x", "--token", "t", "--name", name])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument --name: host name {name!r} is not valid: it has" in err and said in err


def test_a_picker_token_file_must_be_readable_and_hold_a_long_enough_token(tmp_path):
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    code, output = finish(agent("run", "--console", "http://x", "--token", "t", "--gpus", "sim:1x1GiB",
                                "--picker-token-file", str(short)))
    assert code == 2 and f"--picker-token-file: {short} must hold a token of 16 characters or more" in output
    code, output = finish(agent("run", "--console", "http://x", "--token", "t", "--gpus", "sim:1x1GiB",
                                "--picker-token-file", str(tmp_path / "absent")))
    assert code == 2 and "--picker-token-file: token file" in output and "no such file" in output


def test_sizes_take_binary_and_decimal_units():
    from agent.cli import _size

    assert _size("64GiB") == 64 << 30 and _size("1.5GB") == 1_500_000_000 and _size("4096") == 4096


def test_without_gpus_it_says_to_simulate_them():
    code, output = finish(agent("run", "--console", "http://127.0.0.1:1", "--token", "t"))
    if code != 2:  # a machine with an NVIDIA GPU gets past this point
        return
    assert "no NVIDIA GPU can be used" in output and "--gpus sim:2x24GiB" in output


def test_it_announces_its_endpoint_and_exits_cleanly_on_sigterm(tmp_path):
    proc = agent(
        "run", "--console", "http://127.0.0.1:1", "--gpus", "sim:1x1GiB", "--name", "cli-test",
        "--state-dir", str(tmp_path / "state"), env_token="mg_agent_x"
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 90)
        assert ready, "no output within 90 s"
        line = proc.stdout.readline()
        assert line.startswith("ModelGrid agent cli-test serving inference on http://127.0.0.1:"), line
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        code, output = finish(proc)
        assert code == 0, output
        assert "cannot reach the console at ws://127.0.0.1:1/ws/agent/" in output
        # The default warm spare was started, and stopped with the agent.
        spares = [int(pid) for pid in re.findall(r"warm spare worker pid (\d+) started", output)]
        assert len(spares) == 1 and not psutil.pid_exists(spares[0]), output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_picker_access_reaches_the_inference_server_and_open_metrics_is_said_aloud(tmp_path):
    import urllib.error
    import urllib.request

    token = tmp_path / "picker-token"
    token.write_text("picker-token-for-cli-tests-0123\n")
    token.chmod(0o600)
    proc = agent(
        "run", "--console", "http://127.0.0.1:1", "--gpus", "sim:1x1GiB", "--name", "cli-picker", "--warm-workers",
        "0", "--state-dir", str(tmp_path / "state"), "--picker-token-file", str(token), "--picker-open-metrics",
        env_token="mg_agent_x",
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 90)
        assert ready, "no output within 90 s"
        base = proc.stdout.readline().strip().rsplit(" ", 1)[-1]

        def status(path, auth=None):
            headers = {"Authorization": f"Bearer {auth}"} if auth else {}
            try:
                with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=10) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        assert status("/msp/chat/metrics") == 503  # let in (no replica of chat here), not refused
        assert status("/v1/models") == 401
        assert status("/v1/models", "picker-token-for-cli-tests-0123") == 200
        assert status("/metrics", "picker-token-for-cli-tests-0123") == 401
        proc.send_signal(signal.SIGTERM)
        code, output = finish(proc)
        assert code == 0, output
        assert "--picker-open-metrics: GET /msp/... answers without credentials" in output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
