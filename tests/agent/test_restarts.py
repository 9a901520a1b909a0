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
