"""Every change a domain app announces (console/changes.py) reaches what acts on it in the apps above."""

import pytest
from django.dispatch import Signal

from console import changes

SIGNALS = {name: value for name, value in vars(changes).items() if isinstance(value, Signal)}


@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_every_change_signal_has_a_subscriber(name):
    assert SIGNALS[name].has_listeners()


def test_each_announcement_calls_what_it_stands_for_with_its_arguments(monkeypatch):
    called = []

    async def refresh():
        called.append(("refresh_gateways",))

    monkeypatch.setattr("console.control.hub.wake_scheduler", lambda: called.append(("wake",)))
    monkeypatch.setattr("console.control.layer.refresh_gateways", refresh)
    monkeypatch.setattr("console.control.layer.revoke_links", lambda host: called.append(("revoke", host)))
    monkeypatch.setattr("console.control.desired.mark_stale", lambda deps: called.append(("stale", deps)))
    monkeypatch.setattr("console.control.rollout.begin_rollout", lambda deps: called.append(("rollout", deps)))
    changes.wake_scheduler()
    changes.refresh_gateways()
    changes.revoke_links(7)
    changes.mark_stale(["a"])
    changes.begin_rollout(["b"])
    assert called == [("wake",), ("refresh_gateways",), ("revoke", 7), ("stale", ["a"]), ("rollout", ["b"])]
