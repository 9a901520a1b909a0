"""The cyclic garbage collector paused for bursts of allocations (a pass, a batch of agent messages, the chores)."""

import gc
import threading

import pytest

from console.gcpause import gc_paused


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_it_pauses_the_collector_and_restores_it():
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_it_restores_the_collector_after_an_error():
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_overlapping_pauses_on_two_threads_end_with_the_last():
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with gc_paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with gc_paused():
            second_in.set()
            first_out.wait(5)
            seen.append(gc.isenabled())  # the first has ended its pause: still paused for this one

    threads = [threading.Thread(target=f) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off():
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


@pytest.mark.django_db
def test_a_scheduler_pass_runs_with_the_collector_paused(host, model, monkeypatch):
    from console.deployments import reconcile
    from console.deployments.services import create_deployment

    create_deployment("chat", "tiny")
    seen = []
    real = reconcile._plan_and_apply
    monkeypatch.setattr(reconcile, "_plan_and_apply", lambda *a: seen.append(gc.isenabled()) or real(*a))
    reconcile.reconcile_once()
    assert seen == [False]
    assert gc.isenabled()
