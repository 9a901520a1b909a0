"""A deployment's state says what its replicas are: one whose replicas all sleep in host memory reads `asleep`,
one scaled to zero with nothing in memory `idle`, never `ready`."""

from console.control.states import StateRow, derive_state

ZERO = "idle for 312 s (idle_timeout_s 300): scaled to zero; a request places it"


def row(index, desired, observed, host=1, reason="", observed_reason="", start_seconds=None):
    return StateRow(index, host, desired, observed, reason, observed_reason, start_seconds)


def test_it_reads_asleep_when_every_replica_sleeps_in_host_memory():
    state, reason = derive_state([row(0, "sleeping", "sleeping"), row(1, "sleeping", "sleeping")])
    assert state == "asleep"
    assert reason == "all 2 replica(s) asleep in host memory; a request wakes one"


def test_it_reads_asleep_when_scaled_to_zero_with_a_replica_still_in_host_memory():
    state, reason = derive_state([row(0, "sleeping", "sleeping"), row(1, "ready", "pending", host=None, reason=ZERO)])
    assert state == "asleep"
    assert reason.startswith("scaled to zero (1 asleep in host memory, 1 stopped)")


def test_it_reads_idle_when_scaled_to_zero_with_nothing_in_memory():
    state, reason = derive_state([row(0, "ready", "pending", host=None, reason=ZERO)])
    assert state == "idle"
    assert reason == "scaled to zero (1 stopped); a request brings one back"


def test_it_reads_ready_when_one_replica_serves_and_another_sleeps():
    state, reason = derive_state([row(0, "ready", "ready"), row(1, "sleeping", "sleeping")])
    assert state == "ready"
    assert reason == "1 replica(s) asleep in host memory"


def test_when_a_request_would_be_refused_it_does_not_promise_that_one_wakes_it():
    why = "needs 20.00 GiB; every replica it could displace is of a higher tier: a/0 holds crit#0 (critical)"
    state, reason = derive_state([row(0, "sleeping", "sleeping")], blocked=why)
    assert state == "asleep"
    assert reason == f"all 1 replica(s) asleep in host memory; requests get 503 now: {why}"
    state, reason = derive_state([row(0, "ready", "pending", host=None, reason=ZERO)], blocked=why)
    assert reason == f"scaled to zero (1 stopped); requests get 503 now: {why}"


STOPPED = "stopped instead of sleeping: vLLM cannot sleep on CPU (its sleep mode needs CUDA)"


def test_a_replica_that_could_not_sleep_reads_stopped_with_its_start_estimate_not_asleep():
    """vLLM cannot sleep on CPU: a replica asked to sleep is stopped instead. It read "asleep in host memory; a
    request wakes one", and its wake was a 59 s cold start."""
    state, reason = derive_state([row(0, "sleeping", "stopped", observed_reason=STOPPED, start_seconds=59.4)])
    assert state == "idle"
    assert reason == ("all 1 replica(s) stopped instead of sleeping: vLLM cannot sleep on CPU (its sleep mode needs "
                      "CUDA); a request starts one (its last start took 59 s)")
    state, reason = derive_state([row(0, "sleeping", "stopped", observed_reason=STOPPED),
                                  row(1, "ready", "pending", host=None, reason=ZERO)])
    assert (state, reason) == ("idle", "scaled to zero (2 stopped); a request brings one back")
    state, reason = derive_state([row(0, "ready", "ready"), row(1, "sleeping", "stopped", observed_reason=STOPPED)])
    assert (state, reason) == ("ready", "1 replica(s) stopped")


def test_the_serving_word_for_a_replica_that_could_not_sleep_is_cold():
    from types import SimpleNamespace

    from console.deployments.serving import serving_state

    stopped = SimpleNamespace(desired_state="sleeping", observed_state="stopped", host_id=1)
    asleep = SimpleNamespace(desired_state="sleeping", observed_state="sleeping", host_id=1)
    assert serving_state([stopped]) == "cold" and serving_state([stopped, asleep]) == "asleep"
