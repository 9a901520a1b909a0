"""Replica logs on disk: the tail reader's bounds, copy-and-truncate rotation under a writer that keeps appending,
and the cleanup of logs of replicas long gone (agent.workers.logs; no processes)."""

import os
import time

import pytest

from agent.protocol.messages import MAX_LOG_LINE, MAX_LOG_LINES
from agent.workers import logs
from agent.workers.logs import MAX_LINE, MAX_LINES, ReplicaLogs, printable, read_tail


@pytest.fixture
def replica_logs(tmp_path):
    return ReplicaLogs(tmp_path / "logs", max_bytes=4096)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


def test_the_tail_is_the_last_lines_oldest_first(replica_logs):
    write(replica_logs.path(7), "".join(f"line {i}\n" for i in range(50)))
    assert replica_logs.tail(7, 3) == ["line 47", "line 48", "line 49"]
    assert replica_logs.tail(7, 100) == [f"line {i}" for i in range(50)]


def test_a_short_current_log_is_preceded_by_the_end_of_the_rotated_one(replica_logs):
    write(replica_logs.rotated(7), "".join(f"old {i}\n" for i in range(10)) + "split ")
    write(replica_logs.path(7), "line\nnew 1\nnew 2\n")
    assert replica_logs.tail(7, 5) == ["old 8", "old 9", "split line", "new 1", "new 2"]
    assert replica_logs.tail(7, 2) == ["new 1", "new 2"]


def test_a_replica_without_a_log_has_no_tail(replica_logs, tmp_path):
    assert replica_logs.tail(7, 10) is None
    write(replica_logs.rotated(7), "only the rotated one\n")
    assert replica_logs.tail(7, 10) == ["only the rotated one"]
    assert ReplicaLogs().tail(7, 10) is None  # a temporary directory not made yet


def test_a_tail_reads_only_the_end_of_the_files_and_drops_the_line_it_read_half_of(tmp_path):
    path = tmp_path / "big.log"
    write(path, "".join(f"{i:09d}\n" for i in range(100_000)))  # 1 MB
    lines = read_tail([path], MAX_LINES, budget=1005)  # 100 whole lines of 10 bytes and half of one more
    assert lines == [f"{i:09d}" for i in range(99_900, 100_000)]
    # The current file goes past the budget, so the rotated one is not even opened (a directory would raise).
    (tmp_path / "a-directory").mkdir()
    assert read_tail([path, tmp_path / "a-directory"], 5, budget=1000) == [f"{i:09d}" for i in range(99_995, 100_000)]


def test_a_tail_is_at_most_1000_lines_of_at_most_1000_characters(tmp_path):
    many = tmp_path / "many.log"
    write(many, "".join(f"{i}\n" for i in range(2000)))
    assert read_tail([many], 10**6) == [str(i) for i in range(1000, 2000)]
    assert read_tail([many], 0) == ["1999"]  # at least one
    wide = tmp_path / "wide.log"
    write(wide, "x" * 5000 + "\nshort\n")
    assert read_tail([wide], MAX_LINES) == ["x" * (MAX_LINE - 1) + "…", "short"]


def test_the_bounds_are_the_protocols():
    assert (MAX_LINES, MAX_LINE) == (MAX_LOG_LINES, MAX_LOG_LINE)


def test_lines_are_cut_and_made_printable():
    assert printable(b"\x1b[31mred\x1b[0m and\tplain") == "red and\tplain"
    assert printable(b"progress 10%\rprogress 50%\rprogress 100%\r") == "progress 100%"
    assert printable(b"bell\x07 nul\x00 \xff\xfe") == "bell\ufffd nul\ufffd \ufffd\ufffd"
    cut = printable("é".encode() * 5000)
    assert len(cut) == MAX_LINE and cut.endswith("…") and cut.startswith("éé")


def test_rotation_keeps_the_last_max_bytes_and_the_writer_appends_to_the_emptied_file(replica_logs):
    path = replica_logs.path(3)
    fd = os.open(replica_logs.for_worker(3), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # as a worker does
    try:
        os.write(fd, b"a" * 5000 + b"\nlast before\n")
        replica_logs.rotate(3)
        assert path.stat().st_size == 0
        assert replica_logs.rotated(3).read_bytes().endswith(b"a\nlast before\n")
        assert replica_logs.rotated(3).stat().st_size == 4096
        os.write(fd, b"first after\n")
        assert path.read_bytes() == b"first after\n"  # at the start of the file, no hole before it
        assert replica_logs.tail(3, 2) == ["last before", "first after"]
    finally:
        os.close(fd)


def test_upkeep_holds_each_log_to_its_bound_however_much_is_written(replica_logs):
    fd = os.open(replica_logs.for_worker(3), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        for i in range(200):
            os.write(fd, f"{i:05d} {'.' * 1000}\n".encode())
            if i % 3 == 0:
                replica_logs.upkeep(live={3})
    finally:
        os.close(fd)
    # At most what is written between two checks past the bound, and one rotated file of the bound.
    assert replica_logs.path(3).stat().st_size <= 4096 + 3 * 1007
    assert replica_logs.rotated(3).stat().st_size <= 4096
    assert replica_logs.tail(3, 1)[0].startswith("00199 ")
    assert sorted(p.name for p in replica_logs.root.iterdir()) == ["replica-3.log", "replica-3.log.1"]


def test_upkeep_removes_old_logs_of_replicas_no_longer_here_but_never_a_live_ones(replica_logs, monkeypatch):
    monkeypatch.setattr(logs, "KEEP_GONE", 3)
    now = time.time()
    for replica_id, age_days in [(1, 30), (2, 8), (3, 1), (4, 0.5), (5, 0.2), (6, 0.1), (7, 40)]:
        for path in (replica_logs.path(replica_id), replica_logs.rotated(replica_id)):
            write(path, "something\n")
            os.utime(path, (now - age_days * 86400,) * 2)
    write(replica_logs.root / "notes.txt", "not a log: left alone\n")
    replica_logs.upkeep(live={1, 2}, now=now)
    left = sorted(p.name for p in replica_logs.root.iterdir())
    # 1 and 2 run here, however old their logs; of the others 7 is over a week old and 3 is beyond the
    # three most recently written (6, 5, 4).
    assert left == ["notes.txt"] + [f"replica-{r}.log{s}" for r in (1, 2, 4, 5, 6) for s in ("", ".1")]


def test_without_a_state_directory_the_logs_live_in_a_private_temporary_directory_until_closed():
    replica_logs = ReplicaLogs()
    path = replica_logs.for_worker(5)
    root = replica_logs.root
    assert path == str(root / "replica-5.log") and oct(root.stat().st_mode & 0o777) == "0o700"
    write(root / "replica-5.log", "hello\n")
    replica_logs.close()
    assert not root.exists()
