"""The worker's command loop: one command at a time, the reply sent before any tidying up."""

from agent.workers.process import serve


class Channel:
    def __init__(self, messages):
        self.inbox, self.events = list(messages), []

    def recv(self):
        return self.inbox.pop(0) if self.inbox else None

    def send(self, message):
        self.events.append(("sent", message[0], message[1]))
        return True


class Model:
    device = "cpu"

    def __init__(self, events):
        self.events = events
        self.commands = {"sleep": lambda payload: {"bytes": 1}, "infer": lambda payload: {"ok": True}}

    def after_reply(self, kind):
        self.events.append(("after", kind))


def test_the_agent_hears_a_sleep_finished_before_the_worker_tidies_up():
    channel = Channel([("sleep", 1, None), ("infer", 2, {}), ("stop",)])
    serve(Model(channel.events), channel, ValueError)
    assert channel.events == [("sent", "result", 1), ("after", "sleep"), ("sent", "result", 2), ("after", "infer")]
