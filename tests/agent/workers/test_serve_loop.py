"""The worker's loop (torch-free, with a fake model and batcher): commands interleave with generation steps,
the reply is sent before any tidying up, and a sleep ends the generations under it."""

from agent.workers.continuous import Failure, StepOutput
from agent.workers.generation_spec import EngineStats, GenerationRequest, GenerationResult, Token
from agent.workers.messages import Cancel, Command, Generate, Refusal, Reply, Stop, Tokens
from agent.workers.process import serve


class Channel:
    """Hands the loop one scripted batch of messages per turn, then closes."""

    def __init__(self, turns):
        self.turns, self.events = list(turns), []

    def take(self, wait):
        return self.turns.pop(0) if self.turns else [None]

    def settled(self, kind, reply):
        pass

    def send(self, message):
        if isinstance(message, Tokens):
            self.events.append(("tokens", len(message.tokens)))
        else:
            self.events.append(("sent", type(message), message.request_id))
        return True


class Batcher:
    """Each sequence makes `length` tokens, one per step."""

    def __init__(self, events, length=2):
        self.events, self.length, self.running = events, length, {}

    @property
    def busy(self):
        return bool(self.running)

    def submit(self, request_id, request):
        self.running[request_id] = 0

    def cancel(self, request_id):
        self.running.pop(request_id, None)

    def abort(self, text, kind):
        failed = [Failure(rid, text, kind) for rid in self.running]
        self.running.clear()
        return failed

    def stats(self):
        return EngineStats(running=len(self.running))

    def phases(self):
        yield self.step()

    def step(self):
        self.events.append(("step",))
        out = StepOutput()
        for rid in list(self.running):
            self.running[rid] += 1
            out.tokens.append(Token(rid, 5))
            if self.running[rid] == self.length:
                out.finished.append((rid, GenerationResult((5,) * self.length, "length")))
                del self.running[rid]
        return out


class Model:
    device = "cpu"
    asleep = False

    def __init__(self, events, batcher=None):
        self.events, self.batcher = events, batcher
        self.commands = {"sleep": lambda payload: {"bytes": 1}, "infer": lambda payload: {"ok": True}}
        self.spec = type("Spec", (), {"replica_id": 3})

    def after_reply(self, kind):
        self.events.append(("after", kind))


REQUEST = GenerationRequest((1, 2), 2)


def test_the_agent_hears_a_sleep_finished_before_the_worker_tidies_up():
    channel = Channel([[Command("sleep", 1), Command("infer", 2, {})], [], [Stop()]])
    serve(Model(channel.events), channel, ValueError)
    assert channel.events == [("sent", Reply, 1), ("after", "sleep"), ("sent", Reply, 2), ("after", "infer")]


def test_a_forward_request_runs_between_two_generation_steps():
    channel = Channel([[Generate(1, REQUEST)], [Command("infer", 2, {})], [], [Stop()]])
    model = Model(channel.events)
    model.batcher = Batcher(channel.events, length=3)
    serve(model, channel, ValueError)
    assert channel.events[:5] == [("step",), ("tokens", 1), ("sent", Reply, 2), ("after", "infer"), ("step",)]


def test_a_sleep_ends_the_running_generations_as_unavailable_first():
    channel = Channel([[Generate(1, REQUEST)], [Command("sleep", 2)], [Stop()]])
    model = Model(channel.events)
    model.batcher = Batcher(channel.events, length=10)
    serve(model, channel, ValueError)
    assert channel.events[2:4] == [("sent", Refusal, 1), ("sent", Reply, 2)]


def test_a_cancelled_generation_makes_no_more_tokens():
    channel = Channel([[Generate(1, REQUEST), Generate(2, REQUEST)], [Cancel(1)], [Stop()]])
    model = Model(channel.events)
    model.batcher = Batcher(channel.events, length=5)
    serve(model, channel, ValueError)
    assert channel.events[:4] == [("step",), ("tokens", 2), ("step",), ("tokens", 1)]


def test_an_encoder_refuses_to_generate_and_a_sleeping_model_says_so():
    channel = Channel([[Generate(1, REQUEST)], [Stop()]])
    serve(Model(channel.events), channel, ValueError)
    assert channel.events == [("sent", Refusal, 1)]
    channel = Channel([[Generate(1, REQUEST)], [Stop()]])
    model = Model(channel.events, Batcher(channel.events))
    model.asleep = True
    serve(model, channel, ValueError)
    assert channel.events == [("sent", Refusal, 1)]


class TooBig:
    def __reduce__(self):
        raise MemoryError("cannot pickle 96 MiB under the cap")


class PicklingChannel(Channel):
    """Pickles what it sends, as the real pipe does before writing a byte."""

    def send(self, message):
        import pickle

        pickle.dumps(message)
        return super().send(message)


def test_an_answer_too_big_to_send_under_the_cap_is_an_oom_error_and_the_worker_serves_on():
    channel = PicklingChannel([[Command("infer", 1, {})], [Command("infer", 2, {})], [], [Stop()]])
    model = Model(channel.events)
    answers = iter([{"logits": TooBig()}, {"ok": True}])
    model.commands["infer"] = lambda payload: next(answers)
    model.recover_from_oom = lambda: channel.events.append(("recovered",))
    serve(model, channel, ValueError)
    assert channel.events == [("recovered",), ("sent", Refusal, 1), ("after", "infer"),
                              ("sent", Reply, 2), ("after", "infer")]


class BrokenBatcher(Batcher):
    """Its first step raises outside any one sequence's forward (a bug, a driver error)."""

    def __init__(self, events, length=2):
        super().__init__(events, length)
        self.broken = True

    def phases(self):
        if self.broken:
            self.broken = False
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        yield self.step()


def test_a_step_that_raises_fails_the_running_generations_and_the_worker_serves_on():
    channel = Channel([[Generate(1, REQUEST), Generate(2, REQUEST)], [Generate(3, REQUEST)], [], [], [Stop()]])
    model = Model(channel.events)
    model.batcher = BrokenBatcher(channel.events, length=2)
    serve(model, channel, ValueError)
    assert channel.events[:2] == [("sent", Refusal, 1), ("sent", Refusal, 2)]
    assert ("sent", Reply, 3) in channel.events
