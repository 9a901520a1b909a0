
from console.realtime import notify


async def test_pushes_for_links_held_elsewhere_go_out_as_one_message_naming_the_hosts(monkeypatch):
    """One channel-layer message per pass, not one per host: a thousand per-host messages through Redis reached the
    last agent tens of seconds after the pass committed when the scheduler ran in a process of its own."""
    sent = []

    async def send(group, event, **fields):
        sent.append((group, event, fields))

    monkeypatch.setattr(notify, "_send", send)
    # Hosts with a state the pass built, and hosts to be sent theirs again (not acknowledged: a resend).
    await notify.push_desired(range(100), {h: (1, []) for h in range(0, 100, 2)})
    assert sent == [(notify.PUSH_GROUP, "desired.pushes", {"hosts": list(range(0, 100, 2)),
                                                           "again": list(range(1, 100, 2))})]
    sent.clear()
    await notify.push_desired([])
    assert sent == []
