"""The per-replica dynamic batcher over a fake forward whose answers depend only on each row's real tokens."""

import asyncio

import numpy as np
import pytest

from agent.serving.batching import Batcher, BatcherClosed, InvalidInput, QueueFull, merge, pad_rows
from agent.workers.supervisor import InferenceInputError

VOCAB = 4


class FakeForward:
    """logits[b, s, v] = running sum of the row's ids * 10 + v; embeddings[b] = (sum of ids, tokens, types)."""

    def __init__(self, task="causal-lm", gate=None, fails=None):
        self.task, self.gate, self.fails = task, gate, fails
        self.calls = []

    async def __call__(self, inputs, adapters):
        self.calls.append((inputs, adapters))
        if self.gate is not None:
            await self.gate.wait()
        ids = inputs["input_ids"]
        if self.fails is not None:
            raise self.fails
        if (ids >= 100).any():
            raise InferenceInputError(f"input 'input_ids' holds {int(ids.max())}, outside this model's range")
        mask = inputs.get("attention_mask", np.ones_like(ids))
        if self.task == "causal-lm":
            return {"logits": (np.cumsum(ids * mask, axis=1)[..., None] * 10 + np.arange(VOCAB)).astype(np.float32)}
        types = inputs.get("token_type_ids", np.zeros_like(ids))
        summary = [(ids * mask).sum(1), mask.sum(1), (types * mask).sum(1)]
        return {"embeddings": np.stack(summary, axis=1).astype(np.float32)}


def ids(*rows):
    return {"input_ids": np.array(rows, dtype=np.int64)}


async def expected(task, inputs):
    return await FakeForward(task)(inputs, [None] * len(inputs["input_ids"]))


async def test_it_merges_concurrent_requests_into_one_padded_forward_and_splits_the_answer():
    forward = FakeForward()
    batcher = Batcher(forward, max_batch_size=8, max_delay=0.05)
    requests = [ids([5, 6]), ids([1, 2, 3], [4, 5, 6]), ids([7, 8, 9, 10, 11])]
    async with asyncio.timeout(5):
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
    [(merged, adapters)] = forward.calls
    assert merged["input_ids"].tolist() == [[5, 6, 0, 0, 0], [1, 2, 3, 0, 0], [4, 5, 6, 0, 0], [7, 8, 9, 10, 11]]
    assert merged["attention_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1] * 5]
    assert adapters == [None] * 4
    for request, result in zip(requests, results, strict=True):
        assert result.batch_size == 4 and result.queue_seconds >= 0
        np.testing.assert_array_equal(result.outputs["logits"], (await expected("causal-lm", request))["logits"])


async def test_encoder_rows_are_split_and_missing_masks_and_token_types_are_filled_in():
    forward = FakeForward("encoder")
    batcher = Batcher(forward, max_delay=0.05)
    typed = {"input_ids": np.array([[3, 4, 5]]), "token_type_ids": np.array([[0, 1, 1]])}
    masked = {"input_ids": np.array([[9, 9]]), "attention_mask": np.array([[1, 0]])}
    async with asyncio.timeout(5):
        results = await asyncio.gather(batcher.submit(typed), batcher.submit(masked), batcher.submit(ids([2])))
    assert [r.outputs["embeddings"].tolist() for r in results] == [[[12, 3, 2]], [[9, 1, 0]], [[2, 1, 0]]]
    assert forward.calls[0][0]["token_type_ids"].tolist() == [[0, 1, 1], [0, 0, 0], [0, 0, 0]]


async def test_a_batch_is_cut_at_max_batch_size_rows_without_waiting_for_the_delay():
    forward = FakeForward()
    batcher = Batcher(forward, max_batch_size=4, max_delay=30)
    async with asyncio.timeout(5):  # a 30 s delay would blow this bound
        await asyncio.gather(*(batcher.submit(ids([i])) for i in range(4)))
    assert [call[0]["input_ids"].shape[0] for call in forward.calls] == [4]


async def test_rows_beyond_the_batch_size_go_to_the_next_batch_and_a_big_request_runs_alone():
    forward = FakeForward()
    batcher = Batcher(forward, max_batch_size=4, max_delay=0.01)
    async with asyncio.timeout(5):
        results = await asyncio.gather(
            *(batcher.submit(ids([i])) for i in range(3)),
            batcher.submit(ids([1], [2])),
            batcher.submit(ids(*[[1]] * 6)),
        )
    assert [call[0]["input_ids"].shape[0] for call in forward.calls] == [3, 2, 6]
    assert [r.batch_size for r in results] == [3, 3, 3, 2, 6]


async def test_requests_are_merged_only_while_the_padded_batch_stays_within_the_token_budget():
    forward = FakeForward()
    batcher = Batcher(forward, max_batch_size=8, max_delay=0.01, max_batch_tokens=12)
    long = ids(list(range(1, 7)))  # 6 tokens: with two one-token rows it pads to 3 x 6 = 18 > 12
    async with asyncio.timeout(5):
        results = await asyncio.gather(batcher.submit(ids([1])), batcher.submit(ids([2])), batcher.submit(long),
                                       batcher.submit(ids([3])))
    assert [call[0]["input_ids"].shape for call in forward.calls] == [(2, 1), (2, 6)]
    np.testing.assert_array_equal(results[2].outputs["logits"], (await expected("causal-lm", long))["logits"])


async def test_a_lone_request_waits_at_most_the_delay_and_goes_unchanged():
    forward = FakeForward()
    batcher = Batcher(forward, max_batch_size=8, max_delay=0.01)
    request = ids([1, 2])
    async with asyncio.timeout(5):
        result = await batcher.submit(request)
    assert forward.calls[0][0] is request and result.batch_size == 1


async def test_each_row_carries_its_requests_adapter():
    forward = FakeForward()
    batcher = Batcher(forward, max_delay=0.05)
    async with asyncio.timeout(5):
        await asyncio.gather(batcher.submit(ids([1], [2]), adapter="fr"), batcher.submit(ids([3])))
    assert forward.calls[0][1] == ["fr", "fr", None]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"attention_mask": np.ones((1, 2), np.int64)}, "missing input 'input_ids'"),
        ({"input_ids": np.ones((2,), np.int64)}, "must be a non-empty [batch, sequence] matrix"),
        ({"input_ids": np.ones((1, 2), np.float32)}, "must hold integers"),
        ({"input_ids": np.ones((1, 2), np.int64), "attention_mask": np.ones((1, 3), np.int64)}, "different shapes"),
        ({"input_ids": np.ones((1, 2), np.int64), "pixels": np.ones((1, 2), np.int64)}, "unknown input 'pixels'"),
    ],
)
async def test_a_request_that_cannot_be_merged_is_refused_alone_before_queueing(inputs, message):
    forward = FakeForward()
    batcher = Batcher(forward, max_delay=0.01)
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[")):
        await batcher.submit(inputs)
    assert batcher.depth == 0 and forward.calls == []


async def test_an_input_error_in_a_merged_forward_fails_only_the_culprit():
    forward = FakeForward()
    batcher = Batcher(forward, max_delay=0.05)
    async with asyncio.timeout(5):
        good, bad, other = await asyncio.gather(
            batcher.submit(ids([1, 2])), batcher.submit(ids([500])), batcher.submit(ids([3])), return_exceptions=True
        )
    assert isinstance(bad, InferenceInputError) and "500" in str(bad)
    assert good.outputs["logits"][0, :, 0].tolist() == [10, 30] and other.outputs["logits"][0, :, 0].tolist() == [30]
    assert [call[0]["input_ids"].shape[0] for call in forward.calls] == [3, 1, 1, 1]
    assert good.batch_size == 1


async def test_any_other_forward_error_fails_every_request_of_the_batch():
    batcher = Batcher(FakeForward(fails=RuntimeError("CUDA error: out of memory")), max_delay=0.05)
    async with asyncio.timeout(5):
        results = await asyncio.gather(*(batcher.submit(ids([i])) for i in range(3)), return_exceptions=True)
    assert [str(r) for r in results] == ["CUDA error: out of memory"] * 3


async def test_a_cancelled_caller_leaves_the_queue():
    gate = asyncio.Event()
    forward = FakeForward(gate=gate)
    batcher = Batcher(forward, max_batch_size=8, max_delay=0)
    async with asyncio.timeout(5):
        running = asyncio.create_task(batcher.submit(ids([1])))
        while not forward.calls:  # the first batch is in the forward, holding the replica
            await asyncio.sleep(0)
        given_up = asyncio.create_task(batcher.submit(ids([2])))
        kept = asyncio.create_task(batcher.submit(ids([3])))
        await asyncio.sleep(0)
        assert batcher.depth == 3
        given_up.cancel()
        await asyncio.gather(given_up, return_exceptions=True)
        assert batcher.depth == 2
        gate.set()
        await asyncio.gather(running, kept)
    assert [call[0]["input_ids"].tolist() for call in forward.calls] == [[[1]], [[3]]]


async def test_a_full_queue_refuses_new_requests_with_queue_full():
    gate = asyncio.Event()
    forward = FakeForward(gate=gate)
    batcher = Batcher(forward, max_batch_size=1, max_delay=0, max_queue=2)
    async with asyncio.timeout(5):
        tasks = [asyncio.create_task(batcher.submit(ids([0])))]
        while not forward.calls:  # it holds the replica; the next two wait
            await asyncio.sleep(0)
        tasks += [asyncio.create_task(batcher.submit(ids([i]))) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="queue is full"):
            await batcher.submit(ids([9]))
        gate.set()
        assert len(await asyncio.gather(*tasks)) == 3


async def test_closing_fails_the_requests_still_queued():
    gate = asyncio.Event()
    batcher = Batcher(FakeForward(gate=gate), max_batch_size=1, max_delay=0)
    async with asyncio.timeout(5):
        tasks = [asyncio.create_task(batcher.submit(ids([i]))) for i in range(2)]
        await asyncio.sleep(0.01)
        batcher.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, BatcherClosed) for r in results)
    with pytest.raises(BatcherClosed):
        await batcher.submit(ids([1]))


def test_pad_rows_and_merge_right_pad_with_zero_ids_and_zero_mask():
    assert {k: v.tolist() for k, v in pad_rows([[4, 5, 6], [7]]).items()} == {
        "input_ids": [[4, 5, 6], [7, 0, 0]],
        "attention_mask": [[1, 1, 1], [1, 0, 0]],
    }
    merged = merge([ids([1, 2]), {"input_ids": np.array([[3]]), "token_type_ids": np.array([[1]])}], [2, 1])
    assert {k: v.tolist() for k, v in merged.items()} == {
        "input_ids": [[1, 2], [3, 0]],
        "attention_mask": [[1, 1], [1, 0]],
        "token_type_ids": [[0, 0], [1, 0]],
    }
