from agent.restarts import RestartBackoff


def test_the_delay_doubles_per_failure_up_to_the_maximum():
    backoff = RestartBackoff(minimum=1, maximum=5)
    assert [backoff.failed(3, now=t) for t in range(5)] == [1, 2, 4, 5, 5]
    assert backoff.failures(3) == 5


def test_a_worker_that_stayed_up_a_while_starts_its_backoff_over_for_its_own_replica_only():
    backoff = RestartBackoff(minimum=1, maximum=60, stable_s=600)
    backoff.failed(1, now=0), backoff.failed(1, now=1), backoff.failed(2, now=1)
    backoff.ready(1, now=10)
    assert backoff.failed(1, now=10 + 600) == 1 and backoff.failures(2) == 1


def test_a_worker_that_dies_soon_after_it_reads_ready_keeps_its_backoff_growing():
    """A model vLLM starts but cannot run read ready, then died at every first request: the ready worker reset the
    backoff, so it restarted at the minimum interval forever. Only a worker that stayed up a while resets it now."""
    backoff = RestartBackoff(minimum=1, maximum=60, stable_s=600)
    delays = []
    now = 0.0
    for _ in range(5):
        delays.append(backoff.failed(7, now=now))
        now += delays[-1] + 55  # restarted after its delay, read ready 55 s later...
        backoff.ready(7, now=now)
        now += 1  # ... and died at its first request
    assert delays == [1, 2, 4, 8, 16] and backoff.failures(7) == 5


def test_the_total_of_failures_outlives_a_worker_that_stayed_up():
    backoff = RestartBackoff(minimum=1, maximum=60, stable_s=600)
    backoff.failed(1, now=0), backoff.failed(1, now=1)
    backoff.ready(1, now=2)
    backoff.failed(1, now=700)
    backoff.failed(2, now=700)
    assert backoff.failures(1) == 1 and backoff.totals() == {1: 3, 2: 1}
    backoff.forget(1)
    assert backoff.totals() == {2: 1}


async def test_a_restart_called_off_leaves_no_coroutine_behind():
    """A crashed worker's restart waits out its backoff; a second failure or the agent stopping calls it off. The
    restart was a coroutine made when it was scheduled, so each one called off was never awaited (a RuntimeWarning
    CI printed): it is made when the timer fires."""
    import gc
    import warnings
    from types import SimpleNamespace

    from agent.gpus import SimulatedBackend
    from agent.replicas import Replicas, ReplicaSettings

    replicas = Replicas(ReplicaSettings(restart_backoff_min=30, restart_backoff_max=60),
                        SimulatedBackend("sim:1x24GiB", host="h"), lambda handle, progress: None)
    crashed = SimpleNamespace(spec=SimpleNamespace(replica_id=7, engine="torch"), pid=4242, state="failed",
                              reason="killed", measurement=None, transition=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replicas._on_change(crashed)
        replicas._on_change(crashed)  # failed again before its restart: the first is called off
        await replicas._quiesce()  # the agent stops: so is the second
        gc.collect()
    assert replicas._restart_timers == {}
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


async def test_a_failed_workers_restart_and_its_backoff_are_told_in_its_reason():
    from types import SimpleNamespace

    from agent.gpus import SimulatedBackend
    from agent.replicas import Replicas, ReplicaSettings

    told = []
    replicas = Replicas(ReplicaSettings(restart_backoff_min=30, restart_backoff_max=600),
                        SimulatedBackend("sim:1x24GiB", host="h"), lambda handle, progress: told.append(handle.reason))
    crashed = SimpleNamespace(spec=SimpleNamespace(replica_id=7, engine="torch"), pid=4242, state="failed",
                              reason="vLLM exited with code 1: RuntimeError: boom", measurement=None, transition=None)
    replicas._on_change(crashed)
    replicas._on_change(crashed)  # the same failure told again: counted once
    assert told[0] == told[-1] == "vLLM exited with code 1: RuntimeError: boom; restarts in 30 s (failure 1 in a row)"
    assert replicas.backoff.failures(7) == 1
    await replicas._quiesce()
