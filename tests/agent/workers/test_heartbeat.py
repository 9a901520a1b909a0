"""Heartbeat timing with a fake clock: pings go out, and silence is judged only in watched states."""

from agent.workers.heartbeat import Heartbeat


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def heartbeat(clock, watched=lambda: True):
    pings, verdicts = [], []
    beat = Heartbeat(pings.append, verdicts.append, watched, interval=1.0, timeout=10.0, clock=clock)
    return beat, pings, verdicts


async def test_it_pings_while_answers_come_and_names_the_silence_once_they_stop():
    clock = Clock()
    beat, pings, verdicts = heartbeat(clock)
    beat.start()
    for _ in range(15):  # answered every second
        clock.now += 1
        beat.pong()
        beat.beat()
    assert pings == list(range(1, 16)) and verdicts == []
    clock.now += 10.5  # silence past the timeout
    beat.beat()
    assert verdicts == ["no heartbeat for 10 s"] and len(pings) == 15
    beat.stop()


async def test_silence_outside_the_watched_states_is_not_judged():
    clock = Clock()
    beat, pings, verdicts = heartbeat(clock, watched=lambda: False)  # e.g. still loading
    beat.start()
    clock.now += 60
    beat.beat()
    assert verdicts == [] and pings == [1]
    beat.stop()


async def test_a_zero_timeout_turns_heartbeats_off():
    beat = Heartbeat(lambda n: None, lambda r: None, lambda: True, timeout=0)
    beat.start()
    assert beat._timer is None
