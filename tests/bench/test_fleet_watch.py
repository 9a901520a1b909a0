"""The fleet benchmark's push -> ack timings from host rows' changes (bench/fleet_watch.py): each generation is
timed from its commit to the ack that covers it, and a pass's generations are told apart from the next pass's."""

import subprocess
import sys
import time

import pytest
from django.db import connection

from bench.fleet_watch import WAVE_GAP, HostEvent, HostWatch
from console.fleet.models import Host


def watch_of(events: list[tuple[float, str, int, int]], tmp_path) -> HostWatch:
    watch = HostWatch({"MODELGRID_DATA_DIR": str(tmp_path)})
    watch.events = [HostEvent(at, host, generation, acked, True) for at, host, generation, acked in events]
    return watch


def test_each_generation_is_timed_to_the_ack_that_covers_it_and_each_pass_is_a_wave_of_its_own(tmp_path):
    gap = WAVE_GAP / 5
    watch = watch_of([
        # a pass gives hosts a, b and c generation 1; a's and b's acks come 0.2 and 0.3 s later, c's never
        (10.0, "a", 1, 0), (10.0 + gap, "b", 1, 0), (10.0 + 2 * gap, "c", 1, 0),
        (10.2, "a", 1, 1), (10.3 + gap, "b", 1, 1),
        # a lone change for a, acked at once: a wave of one host
        (11.0, "a", 2, 1), (11.05, "a", 2, 2),
        # the next pass gives a and b new generations (b two, as two passes within WAVE_GAP would); b's one ack of
        # its newer generation covers both
        (12.0, "a", 3, 2), (12.0 + gap, "b", 2, 1), (12.0 + 2 * gap, "b", 3, 1),
        (12.5, "a", 3, 3), (12.9 + 2 * gap, "b", 3, 3),
        # before `since`: left out
        (5.0, "d", 7, 0), (5.1, "d", 7, 7),
    ], tmp_path)

    latencies, never = watch.push_to_ack(since=9.0)
    assert sorted(round(x, 3) for x in latencies) == [0.05, 0.2, 0.3, 0.5, 0.9, 0.91]
    assert never == 1  # c's generation 1

    waves = watch.waves(since=9.0, least=2)
    assert [round(at, 3) for at, _ in waves] == [10.0, 12.0]  # the lone change is not a wave
    assert [sorted(round(x, 3) for x in w) for _, w in waves] == [[0.2, 0.3], [0.5, 0.9, 0.91]]
    assert [len(w) for _, w in watch.waves(since=9.0, least=1)] == [2, 1, 3]


def _interpreter_held_for(seconds: float):
    """A C call that keeps this process's interpreter lock for about `seconds` (no other thread here runs
    meanwhile); calibrated first."""
    n = 2_000_000
    began = time.monotonic()
    sum(range(n))
    n = int(n * seconds / max(time.monotonic() - began, 1e-3))
    return lambda: sum(range(n))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: on SQLite the watch polls the "
                    "file, and the test database is not it (runs in the PostgreSQL + Redis pass)")
@pytest.mark.django_db(transaction=True)
def test_a_commit_is_timed_when_it_happens_even_while_this_process_is_busy(tmp_path):
    # The simulated agents share the benchmark's interpreter: a listener thread there timed an ack's commit only once
    # a wave's applies let it run. The listener is a process of its own.
    settings = connection.settings_dict
    url = f"postgresql://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
    Host.objects.create(name="watched")
    watch = HostWatch({"DATABASE_URL": url, "MODELGRID_DATA_DIR": str(tmp_path)})
    watch.start()
    try:
        hold = _interpreter_held_for(3.0)
        # Another process commits the changes while this one holds its interpreter.
        writer = subprocess.Popen([sys.executable, "-c", (
            "import sys, time, psycopg\n"
            "time.sleep(0.5)\n"
            "with psycopg.connect(sys.argv[1], autocommit=True) as conn:\n"
            "    conn.execute(\"UPDATE fleet_host SET generation = 1 WHERE name = 'watched'\")\n"
            "    conn.execute(\"UPDATE fleet_host SET acked_generation = 1 WHERE name = 'watched'\")\n"), url])
        hold()
        busy_until = time.monotonic()
        assert writer.wait(30) == 0
        deadline = time.monotonic() + 10
        while len(watch.events) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(e.host, e.generation, e.acked) for e in watch.events] == [("watched", 1, 0), ("watched", 1, 1)]
        assert all(e.at < busy_until for e in watch.events)  # timed while this process held its interpreter
    finally:
        watch.stop()
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS fleet_bench_notify ON fleet_host")
