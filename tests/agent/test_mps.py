"""The MPS control daemon's start and stop, against a fake nvidia-cuda-mps-control on PATH."""

import os
import stat

import pytest

from agent.mps import MpsControl, MpsUnavailable

FAKE = """#!/bin/sh
echo "args: $*" >> "{log}"
if [ "$1" != "-d" ]; then cat >> "{log}"; fi
{extra}
"""


def fake_binary(tmp_path, extra=""):
    log = tmp_path / "calls.log"
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    binary.write_text(FAKE.format(log=log, extra=extra))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{binary.parent}:/usr/bin:/bin"}, log


async def test_it_starts_the_daemon_and_asks_it_to_quit_on_stop(tmp_path):
    env, log = fake_binary(tmp_path)
    mps = MpsControl(env=env)
    await mps.start()
    assert mps.started and log.read_text() == "args: -d\n"
    await mps.stop()
    assert log.read_text() == "args: -d\nargs: \nquit\n" and not mps.started
    await mps.stop()  # once is enough
    assert log.read_text().count("quit") == 1


async def test_a_daemon_already_running_is_used_and_left_running(tmp_path):
    env, log = fake_binary(tmp_path, extra='echo "An instance of this daemon is already running"; exit 1')
    mps = MpsControl(env=env)
    await mps.start()
    await mps.stop()
    assert not mps.started and "quit" not in log.read_text()


async def test_a_failing_daemon_is_an_error_with_its_output(tmp_path):
    env, _ = fake_binary(tmp_path, extra='echo "cannot open pipe directory"; exit 3')
    with pytest.raises(MpsUnavailable, match=r"-d failed \(exit status 3\): cannot open pipe directory"):
        await MpsControl(env=env).start()


async def test_a_missing_binary_is_a_clear_error(tmp_path):
    mps = MpsControl(env={"PATH": str(tmp_path)})
    with pytest.raises(MpsUnavailable, match="nvidia-cuda-mps-control is not on PATH.*without --mps"):
        await mps.start()
