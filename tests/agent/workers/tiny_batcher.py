"""The prompts and the continuous batcher shared by the tests on the tiny demo Llama (the `model` fixture is in
conftest.py)."""

import contextlib

PROMPTS = [(1, 42, 449, 601, 14), (1, 7), (1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309), (1, 99, 98)]


def batcher(model, **kwargs):
    from agent.workers.continuous import ContinuousBatcher

    kwargs.setdefault("eos_ids", ())  # random weights: no early end of sequence
    return ContinuousBatcher(model, lambda names: contextlib.nullcontext(), max_positions=256, **kwargs)
