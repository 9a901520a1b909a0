import asyncio

from console.realtime import notify


async def test_pushes_go_out_several_at_a_time_but_never_more_than_the_bound(monkeypatch):
    running, most, sent = 0, 0, []

    async def send(group, event):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        sent.append(group)

    monkeypatch.setattr(notify, "_send", send)
    await notify.push_desired(range(100))
    assert sorted(sent) == sorted(notify.host_group(h) for h in range(100))
    assert 1 < most <= notify.PUSHES_AT_ONCE  # a thousand at once exhausted the Redis connection pool
