"""The fleet benchmark's view of the console's host rows: every change of a host's generation, acked generation
or connected flag, timed as it is committed (bench/fleet.py)."""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# One pass commits every host's new generation in one transaction: its notifications arrive within milliseconds of
# each other (1-4 ms for 1,000 hosts here), and passes are hundreds of ms apart.
WAVE_GAP = 0.05
LISTEN_TIMEOUT = 30.0  # for the listener process to start and LISTEN
LISTENING = "listening"


@dataclass
class HostEvent:
    at: float  # time.monotonic() of this process
    host: str
    generation: int
    acked: int
    connected: bool


class HostWatch:
    """Every change of a host row's generation, acked generation or connected flag, timed on this machine's
    monotonic clock. PostgreSQL: a trigger's pg_notify, delivered at commit to a listener process. SQLite: polling
    the file every 0.2 s."""

    TRIGGER = """
    CREATE OR REPLACE FUNCTION fleet_bench_notify() RETURNS trigger AS $$
    BEGIN
      IF NEW.generation IS DISTINCT FROM OLD.generation OR NEW.acked_generation IS DISTINCT FROM OLD.acked_generation
         OR NEW.connected IS DISTINCT FROM OLD.connected THEN
        PERFORM pg_notify('fleet_bench', concat_ws(' ', NEW.name, NEW.generation, NEW.acked_generation, NEW.connected));
      END IF;
      RETURN NEW;
    END $$ LANGUAGE plpgsql;
    DROP TRIGGER IF EXISTS fleet_bench_notify ON fleet_host;
    CREATE TRIGGER fleet_bench_notify AFTER UPDATE ON fleet_host FOR EACH ROW EXECUTE FUNCTION fleet_bench_notify();
    """

    def __init__(self, env: dict) -> None:
        self.events: list[HostEvent] = []
        self.database_url = env.get("DATABASE_URL", "")
        self.sqlite = Path(env["MODELGRID_DATA_DIR"]) / "modelgrid.sqlite3"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="host-watch")
        self._listener = None  # PostgreSQL: the process that times the notifications
        self._pipe = None  # and the end this process reads them from

    @property
    def precise(self) -> bool:
        return self.database_url.startswith("postgres")

    def start(self) -> None:
        """Once this returns, every change committed is seen."""
        if self.precise:
            import psycopg

            with psycopg.connect(self.database_url, autocommit=True) as conn:
                conn.execute(self.TRIGGER)
            # A process of its own times them: the simulated agents share this one's interpreter, and a thread here
            # waited for a wave's applies before it could read the notifications their acks' commits sent.
            context = multiprocessing.get_context("spawn")  # no fork of this process's event loop and threads
            self._pipe, theirs = context.Pipe(duplex=False)
            self._listener = context.Process(target=_listen, args=(self.database_url, theirs), daemon=True,
                                             name="host-watch")
            self._listener.start()
            theirs.close()
            if not self._pipe.poll(LISTEN_TIMEOUT) or self._pipe.recv() != LISTENING:
                self._listener.kill()
                raise RuntimeError(f"the host watch's listener did not LISTEN within {LISTEN_TIMEOUT:g} s")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.terminate()  # its end of the pipe closes: _run's recv() ends
            self._listener.join(5)
        self._thread.join(5)

    def _run(self) -> None:
        if self.precise:
            with contextlib.suppress(EOFError, OSError):
                while True:
                    for at, payload in self._pipe.recv():
                        name, gen, acked, connected = payload.split(" ")
                        self.events.append(HostEvent(at, name, int(gen), int(acked), connected == "t"))
        else:
            import sqlite3

            last: dict[str, tuple] = {}
            conn = sqlite3.connect(f"file:{self.sqlite}?mode=ro", uri=True, timeout=5)
            while not self._stop.wait(0.2):
                with contextlib.suppress(sqlite3.OperationalError):
                    for row in conn.execute("SELECT name, generation, acked_generation, connected FROM fleet_host"):
                        if last.get(row[0]) != row[1:]:
                            last[row[0]] = row[1:]
                            self.events.append(HostEvent(time.monotonic(), row[0], row[1], row[2], bool(row[3])))

    def push_to_ack(self, since: float) -> tuple[list[float], int]:
        """Seconds from each generation's commit to the commit of an ack covering it, for generations
        committed after `since`; and how many were never acknowledged."""
        acked, never = self._acked(since)
        return [latency for _, latency in acked], never

    def waves(self, since: float, least: int) -> list[tuple[float, list[float]]]:
        """push -> ack by wave: the generations one pass gave at least `least` hosts, whose commits became visible
        together (each within WAVE_GAP of the one before), as (when the first became visible, their push -> ack
        seconds), in order. A p99 over a whole rollout does not say which wave missed: the first, or a later one that
        met the readings of the waves before it."""
        out: list[tuple[float, list[float]]] = []
        wave: list[tuple[float, float]] = []
        for committed, latency in sorted(self._acked(since)[0]) + [(float("inf"), 0.0)]:
            if wave and committed - wave[-1][0] > WAVE_GAP:
                if len(wave) >= least:
                    out.append((wave[0][0], [w for _, w in wave]))
                wave = []
            wave.append((committed, latency))
        return out

    def _acked(self, since: float) -> tuple[list[tuple[float, float]], int]:
        """(when it became visible, seconds until an ack covering it did) for each generation committed after
        `since` and acknowledged; and how many were never acknowledged."""
        pending: dict[str, dict[int, float]] = collections.defaultdict(dict)
        seen: dict[str, int] = {}
        acked = []
        for e in list(self.events):
            if e.generation > seen.get(e.host, -1):
                seen[e.host] = e.generation
                if e.at >= since:
                    pending[e.host][e.generation] = e.at
            for g in [g for g in pending[e.host] if g <= e.acked]:
                committed = pending[e.host].pop(g)
                acked.append((committed, e.at - committed))
        return acked, sum(len(p) for p in pending.values())

    def legs(self, since: float, agents) -> tuple[list[float], list[float]]:
        """push -> ack split in two: seconds from a generation's commit to its agent receiving it, and from the
        agent queueing its ack to the commit of that ack (`agents`: the simulated agents, by host name)."""
        committed: dict[tuple[str, int], float] = {}
        acked: dict[str, list[tuple[float, int]]] = collections.defaultdict(list)
        seen: dict[str, tuple[int, int]] = {}
        for e in list(self.events):
            before = seen.get(e.host, (-1, -1))
            if e.generation > before[0]:
                committed.setdefault((e.host, e.generation), e.at)
            if e.acked > before[1]:
                acked[e.host].append((e.at, e.acked))
            seen[e.host] = (max(before[0], e.generation), max(before[1], e.acked))
        to_agent, to_commit = [], []
        for name, agent in agents.items():
            for generation, received, queued in agent.metrics.acks:
                at = committed.get((name, generation))
                if at is None or at < since:
                    continue
                to_agent.append(received - at)
                done = next((t for t, g in acked[name] if g >= generation and t >= queued), None)
                if done is not None:
                    to_commit.append(done - queued)
        return to_agent, to_commit


def _listen(database_url: str, pipe) -> None:
    """The listener process: each notification timed as it arrives (time.monotonic(), one clock for every process
    on Linux), sent on in batches until the process is terminated."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("LISTEN fleet_bench")
        pipe.send(LISTENING)
        while True:
            batch = [(time.monotonic(), note.payload) for note in conn.notifies(timeout=0.05, stop_after=200)]
            if batch:
                pipe.send(batch)
