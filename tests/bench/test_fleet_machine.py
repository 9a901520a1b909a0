"""What bench/fleet.py says about the machine and the console beside its timings: the calibration that makes tables
of different days comparable (bench/harness.python_speed), and the sampling profiler its --profile starts inside
the console process (bench/fleet_profile.py)."""

import os
import subprocess
import sys
import textwrap

from bench import harness
from bench.fleet_profile import profile_env, read_profile


def test_the_calibration_is_the_median_of_its_repeats_in_milliseconds(monkeypatch):
    # Each repeat reads the clock twice; these three take 10, 30 and 20 ms: a one-off stall (30) or a lucky
    # moment (10) does not become the day's figure.
    clock = iter([0.0, 0.010, 1.0, 1.030, 2.0, 2.020])
    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(clock))
    assert round(harness.python_speed(repeats=3), 6) == 20.0


def test_the_calibration_times_real_work():
    assert harness.python_speed(repeats=3) > 0.1  # 50 JSON round trips of 100 rows are not free anywhere


def test_steal_is_read_from_the_os_where_it_says():
    steal = harness.cpu_steal()
    if sys.platform == "linux":  # /proc/stat's eighth column
        assert isinstance(steal, float) and steal >= 0
    else:
        assert steal is None or steal >= 0


def test_profile_env_starts_the_sampler_in_a_console_process_and_it_records_the_busy_stacks(tmp_path):
    out = tmp_path / "profile.json"
    env = {**os.environ, **profile_env(tmp_path, out)}
    busy = textwrap.dedent("""
        import time

        def spinning_in_the_console():
            end = time.monotonic() + 2.6  # past the sampler's first write (every PROFILE_WRITE_S)
            while time.monotonic() < end:
                pass

        spinning_in_the_console()
    """)
    # sitecustomize starts the sampler only where 'up' is an argument (manage.py up), not in manage.py shell.
    for argv in (["-", "up"], ["-", "shell"]):
        out.unlink(missing_ok=True)
        subprocess.run([sys.executable, *argv], input=busy, text=True, env=env, check=True, timeout=60)
        profile = read_profile(out)
        if argv[-1] == "up":
            assert profile is not None and profile["ticks"] > 0
            assert any("spinning_in_the_console" in stack for stack in profile["stacks"]), profile["stacks"]
        else:
            assert profile is None
