"""The scheduler leader election (console/control/leader.py) and the epoch fence, on the suite's database:
a file lock on SQLite, a PostgreSQL advisory lock on the db_stack pass."""

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
from channels.db import database_sync_to_async
from django.db import connection

from console.control import leader
from console.control.leader import Elector, FileLock, NotLeader, current_leader
from console.control.loop import scheduler_loop
from console.control.reconcile import reconcile_once
from console.deployments.models import Replica
from console.deployments.services import create_deployment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_data_dir(settings, tmp_path):
    """The SQLite lock file lives in the data dir: a private one, so no other console on this machine contends."""
    settings.DATA_DIR = tmp_path


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


HOLD_FILE_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
sys.stdin.read()
"""

HOLD_ADVISORY_LOCK = """
import sys, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
conn.execute("SELECT pg_advisory_lock(%s)", [int(sys.argv[2])])
print("holding", flush=True)
sys.stdin.read()
"""


def another_process_leads(tmp_path) -> subprocess.Popen:
    """A process that holds the scheduler lock, as another console's leader would, until it is killed."""
    if on_postgres():
        p = connection.get_connection_params()
        dsn = f"host={p.get('host', '')} port={p.get('port', '')} user={p.get('user', '')} dbname={p['dbname']}"
        args = ["-c", HOLD_ADVISORY_LOCK, dsn, str(leader.ADVISORY_KEY)]
    else:
        args = ["-c", HOLD_FILE_LOCK, str(tmp_path / leader.LOCK_FILE)]
    proc = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_of_two_electors_one_leads_and_the_other_takes_over_under_the_next_epoch():
    first, second = Elector(holder="a:1"), Elector(holder="b:2")
    try:
        assert first.try_lead()
        assert not second.try_lead()
        assert not second.leading
        assert current_leader().holder == "a:1" and current_leader().epoch == first.epoch
        epoch = first.epoch
        first.step_down()
        assert second.try_lead()
        assert second.epoch == epoch + 1
        assert current_leader().holder == "b:2" and current_leader().epoch == epoch + 1
    finally:
        first.step_down()
        second.step_down()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: a file lock is freed when its "
                    "descriptor closes, and the test above covers it on SQLite")
def test_a_leader_stepping_down_frees_the_advisory_lock_before_its_session_ends(monkeypatch):
    # PostgreSQL frees a closed session's locks only when its backend exits, a moment after close() returns; CI
    # once saw the follower refused in that moment. Keeping the session open models the moment deterministically.
    first, second = Elector(holder="a:1"), Elector(holder="b:2")
    assert first.try_lead()
    lingering = first.lock._conn
    try:
        monkeypatch.setattr(lingering, "close", lambda: None)
        first.step_down()
        assert not lingering.closed
        assert second.try_lead()
    finally:  # whatever failed above, the session and both electors' locks are let go
        monkeypatch.undo()
        lingering.close()
        first.step_down()
        second.step_down()


def test_killing_the_leading_process_frees_the_lock_for_a_follower(tmp_path):
    holder = another_process_leads(tmp_path)
    follower = Elector(holder="follower:1")
    try:
        assert not follower.try_lead()
        os.kill(holder.pid, signal.SIGKILL)  # no clean release: the kernel or PostgreSQL frees the lock
        holder.wait(10)
        deadline = time.monotonic() + 10
        while not follower.try_lead():
            assert time.monotonic() < deadline, "the lock of a killed leader was never freed"
            time.sleep(0.1)
        assert current_leader().holder == "follower:1"
    finally:
        follower.step_down()
        holder.kill()
        holder.wait(10)


def test_a_deposed_leader_that_still_believes_it_leads_writes_nothing(host, model, tmp_path):
    # Split brain: each holds a lock of its own (a partitioned leader whose lock was given to another), so only
    # the epoch can tell them apart.
    stale = Elector(lock=FileLock(tmp_path / "stale.lock"), holder="stale:1")
    fresh = Elector(lock=FileLock(tmp_path / "fresh.lock"), holder="fresh:2")
    try:
        assert stale.try_lead() and fresh.try_lead()
        assert fresh.epoch == stale.epoch + 1
        create_deployment("chat", "tiny")
        with pytest.raises(NotLeader, match=rf"epoch {stale.epoch} was superseded .*epoch {fresh.epoch}"):
            reconcile_once(fence=stale.fence)
        assert not Replica.objects.exists()
        reconcile_once(fence=fresh.fence)
        assert Replica.objects.filter(host=host).count() == 1
    finally:
        stale.step_down()
        fresh.step_down()


def test_a_leader_that_lost_its_lock_is_refused_before_it_writes(host, model):
    elector = Elector(holder="a:1")
    try:
        assert elector.try_lead()
        create_deployment("chat", "tiny")
        if on_postgres():  # its session ends (a dropped connection, a restarted server)
            pid = elector.lock._conn.info.backend_pid
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        else:
            elector.lock.release()
        with pytest.raises(NotLeader, match="lost the scheduler lock"):
            reconcile_once(fence=elector.fence)
        assert not Replica.objects.exists()
    finally:
        elector.step_down()


def test_a_process_that_never_led_is_refused():
    with pytest.raises(NotLeader, match="not the scheduler leader"):
        Elector(holder="a:1").fence()


async def test_of_two_scheduler_loops_one_passes_and_the_other_follows_until_the_leader_stops(
        host, model, caplog):
    caplog.set_level(logging.INFO, logger="modelgrid.scheduler")
    first, second = Elector(holder="first:1"), Elector(holder="second:2")
    stop_first, stop_second = asyncio.Event(), asyncio.Event()
    leading = asyncio.create_task(scheduler_loop(stop_first, interval=0.1, elector=first, retry=0.1))
    async with asyncio.timeout(10):
        while not first.leading:
            await asyncio.sleep(0.02)
    following = asyncio.create_task(scheduler_loop(stop_second, interval=0.1, elector=second, retry=0.1))
    try:
        await asyncio.sleep(0.5)
        assert first.leading and not second.leading
        assert f"leading scheduler (epoch {first.epoch})" in caplog.messages
        assert f"following (leader: first:1, epoch {first.epoch})" in caplog.messages
        epoch = first.epoch

        stop_first.set()
        await asyncio.wait_for(leading, 10)
        async with asyncio.timeout(10):
            while not second.leading:
                await asyncio.sleep(0.02)
        assert second.epoch == epoch + 1
        # The new leader does the work: a new deployment is placed by its passes.
        await database_sync_to_async(create_deployment)("chat", "tiny")
        async with asyncio.timeout(10):
            while not await database_sync_to_async(Replica.objects.filter(host=host).exists)():
                await asyncio.sleep(0.05)
    finally:
        stop_first.set()
        stop_second.set()
        await asyncio.wait_for(asyncio.gather(leading, following), 10)
    assert not first.leading and not second.leading  # each gave the lock up on its way out


async def test_a_loop_whose_epoch_is_superseded_stops_passing_and_follows(host, model, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="modelgrid.scheduler")
    elector = Elector(lock=FileLock(tmp_path / "partitioned.lock"), holder="partitioned:1")
    stop = asyncio.Event()
    loop = asyncio.create_task(scheduler_loop(stop, interval=0.1, elector=elector, retry=60))
    usurper = Elector(lock=FileLock(tmp_path / "usurper.lock"), holder="usurper:2")
    try:
        async with asyncio.timeout(10):
            while not elector.leading:
                await asyncio.sleep(0.02)
        deposed = elector.epoch
        assert await database_sync_to_async(usurper.try_lead)()
        async with asyncio.timeout(10):
            while not any("no longer leading the scheduler" in m for m in caplog.messages):
                await asyncio.sleep(0.02)
        assert f"no longer leading the scheduler: epoch {deposed} was superseded (the database holds epoch " \
               f"{usurper.epoch})" in caplog.messages
        # It steps down, and its own lock being free, it is elected again at once under a newer epoch: epochs
        # never repeat, so the usurper is now the one fenced off.
        async with asyncio.timeout(10):
            while elector.epoch is None or elector.epoch <= usurper.epoch:
                await asyncio.sleep(0.02)
        with pytest.raises(NotLeader):
            await database_sync_to_async(usurper.fence)()
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
        usurper.step_down()


def test_a_leader_row_deleted_by_hand_never_hands_out_an_old_epoch_again(tmp_path):
    stale = Elector(lock=FileLock(tmp_path / "stale.lock"), holder="stale:1")
    fresh = Elector(lock=FileLock(tmp_path / "fresh.lock"), holder="fresh:2")
    try:
        assert stale.try_lead()
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {leader.TABLE}")
        with pytest.raises(NotLeader, match="the database holds epoch None"):
            stale.fence()
        assert fresh.try_lead()
        assert fresh.epoch > stale.epoch
        with pytest.raises(NotLeader, match="superseded"):
            stale.fence()
        fresh.fence()
    finally:
        stale.step_down()
        fresh.step_down()
