"""Each alert rule alone: what fires, with words a person can act on, and what does not (yet)."""

from datetime import UTC, datetime, timedelta

from console.alerts import rules

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
GiB = 1 << 30


def test_an_slo_violation_fires_only_once_it_lasted_the_window():
    long = rules.DeploymentSlo("chat", True, NOW - timedelta(minutes=7), 412.0, 200)
    short = rules.DeploymentSlo("fresh", True, NOW - timedelta(minutes=2), 300.0, 200)
    fine = rules.DeploymentSlo("calm", False, NOW - timedelta(hours=1), 90.0, 200)
    assert rules.slo_violations([long, short, fine], 300, NOW) == {
        "deployment/chat": "p95 latency 412 ms above its 200 ms target for 7 min"}


def test_a_replica_fires_at_its_threshold_of_failures():
    fired = rules.failing_replicas({"replica/chat#0": 3, "replica/chat#1": 2}, threshold=3, window_s=900)
    assert list(fired) == ["replica/chat#0"] and fired["replica/chat#0"].startswith("failed 3 times in the last 15 min")


def test_a_host_fires_when_unknown_or_offline_past_the_window():
    hosts = [rules.HostLife("a", "unknown", NOW - timedelta(seconds=90)),
             rules.HostLife("b", "offline", NOW - timedelta(hours=3)),
             rules.HostLife("c", "unknown", NOW - timedelta(seconds=10)),
             rules.HostLife("d", "connected", None)]
    fired = rules.offline_hosts(hosts, 60, NOW)
    assert fired == {"host/a": "unknown for 90 s: no word from its agent",
                     "host/b": "offline for 3.0 h: no word from its agent; its replicas were placed elsewhere"}


def test_foreign_memory_fires_on_growth_from_the_windows_low_not_on_a_high_steady_level():
    growing = [(0, 5 * GiB), (60, 4 * GiB), (120, 6.5 * GiB)]
    steady = [(0, 20 * GiB), (60, 20 * GiB), (120, 20.5 * GiB)]
    unknown = [(0, None), (60, 2 * GiB)]
    fired = rules.growing_foreign({"host/a": growing, "host/b": steady, "host/c": unknown}, GiB, 600)
    assert list(fired) == ["host/a"]
    assert fired["host/a"].startswith("memory used by processes ModelGrid does not own grew by 2.50 GiB in 10 min")
