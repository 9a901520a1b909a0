from agent.restarts import RestartBackoff


def test_the_delay_doubles_per_failure_up_to_the_maximum():
    backoff = RestartBackoff(minimum=1, maximum=5)
    assert [backoff.failed(3) for _ in range(5)] == [1, 2, 4, 5, 5]
    assert backoff.failures(3) == 5


def test_a_ready_worker_resets_only_its_own_replica():
    backoff = RestartBackoff(minimum=1, maximum=60)
    backoff.failed(1), backoff.failed(1), backoff.failed(2)
    backoff.ready(1)
    assert backoff.failed(1) == 1 and backoff.failures(2) == 1


def test_the_total_of_failures_outlives_a_ready_worker():
    backoff = RestartBackoff(minimum=1, maximum=60)
    backoff.failed(1), backoff.failed(1)
    backoff.ready(1)
    backoff.failed(1)
    backoff.failed(2)
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
