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
    while not verdicts:  # silence past the timeout, each tick on time
        clock.now += 1.05
        beat.beat()
    assert verdicts == ["no heartbeat for 10 s"] and len(pings) == 15 + 8  # the 10th tick past the last pong judges
    beat.stop()


async def test_an_agent_that_was_paused_does_not_blame_its_worker_for_its_own_silence():
    clock = Clock()
    beat, pings, verdicts = heartbeat(clock)
    beat.start()
    clock.now += 40  # SIGSTOP, or a loop blocked 40 s: no ping went out, so no pong could come back
    beat.beat()
    assert verdicts == [] and pings == [1]
    beat.pong()
    for _ in range(20):
        clock.now += 1
        beat.pong()
        beat.beat()
    assert verdicts == []


async def test_a_worker_still_silent_after_the_agent_woke_is_judged_on_the_agents_waking_time():
    clock = Clock()
    beat, pings, verdicts = heartbeat(clock)
    beat.start()
    clock.now += 40
    beat.beat()
    ticks = 0
    while not verdicts:
        clock.now += 1
        beat.beat()
        ticks += 1
    assert verdicts == ["no heartbeat for 10 s"] and 8 <= ticks <= 10


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
