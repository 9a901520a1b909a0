"""Dynamic batching in front of one replica: queue requests, right-pad them into one forward, split the answer.

A batch is cut at `max_batch_size` rows or `max_delay` seconds after its first request was queued,
whichever comes first; while the replica runs a batch, the next one fills up. numpy only, no torch.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.workers.supervisor import InferenceInputError

log = logging.getLogger(__name__)

RunBatch = Callable[[dict[str, np.ndarray], list[str | None]], Awaitable[dict[str, np.ndarray]]]

# The inputs a batch can merge, and what pads them: padding is never attended (mask 0) and id 0
# is a real id of every vocabulary, so it cannot trip the worker's range check.
PAD_VALUES = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}


class InvalidInput(ValueError):
    """A request the batcher cannot merge (wrong rank, mixed shapes, not integers); a client error."""


class QueueFull(RuntimeError):
    """The replica's queue holds `max_queue` requests already; the client should retry later."""


class BatcherClosed(RuntimeError):
    """The replica went away while the request waited."""


@dataclass(frozen=True)
class BatchSettings:
    """How a replica's batcher cuts batches (the deployment's, sent by the console; else the agent's default)."""

    max_batch_size: int = 8  # rows per forward; a request with more rows runs alone
    max_delay: float = 0.005  # seconds the first queued request waits for company
    max_queue: int = 1024  # queued requests per replica before "queue full"
    # Padded tokens (rows x longest) per merged forward: requests are merged only while the batch stays
    # within it, so eight requests at the per-request budget never become one forward eight times as big.
    max_batch_tokens: int = 16384

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue < 1 or self.max_delay < 0 or self.max_batch_tokens < 1:
            raise ValueError("batching needs max_batch_size >= 1, max_queue >= 1, max_delay >= 0 and "
                             "max_batch_tokens >= 1")


@dataclass(frozen=True)
class Result:
    """One request's share of a batch, with what metrics record about it."""

    outputs: dict[str, np.ndarray]
    queue_seconds: float
    batch_size: int  # rows in the forward that answered this request


@dataclass(eq=False)  # compared by identity: a cancelled caller removes exactly its own request
class _Pending:
    inputs: dict[str, np.ndarray]
    adapter: str | None
    rows: int
    length: int
    future: asyncio.Future
    queued_at: float
    adapters: list[str | None] = field(init=False)

    def __post_init__(self) -> None:
        self.adapters = [self.adapter] * self.rows


class Batcher:
    """A per-replica queue that merges concurrent requests into batched forwards of `run_batch`."""

    def __init__(
        self,
        run_batch: RunBatch,
        max_batch_size: int = 8,
        max_delay: float = 0.005,
        max_queue: int = 1024,
        max_batch_tokens: int = 16384,
    ) -> None:
        self.settings = BatchSettings(max_batch_size, max_delay, max_queue, max_batch_tokens)  # validates
        self._run_batch = run_batch
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._running = 0
        self._arrived = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False

    @classmethod
    def from_settings(cls, run_batch: RunBatch, settings: BatchSettings) -> Batcher:
        return cls(run_batch, settings.max_batch_size, settings.max_delay, settings.max_queue,
                   settings.max_batch_tokens)

    @property
    def depth(self) -> int:
        """Requests queued or in the running batch."""
        return len(self._queue) + self._running

    async def submit(self, inputs: dict[str, np.ndarray], adapter: str | None = None) -> Result:
        """Queue one request ([rows, seq] int tensors) and wait for its rows of the batched answer."""
        if self._closed:
            raise BatcherClosed("the replica is gone")
        rows, length = check_inputs(inputs)
        if len(self._queue) >= self.settings.max_queue:
            raise QueueFull(f"the replica's queue is full ({self.settings.max_queue} requests waiting); retry later")
        loop = asyncio.get_running_loop()
        pending = _Pending(inputs, adapter, rows, length, loop.create_future(), loop.time())
        self._queue.append(pending)
        self._queued_rows += rows
        self._arrived.set()
        if self._task is None:
            self._task = loop.create_task(self._loop(), name="batcher")
        try:
            return await pending.future
        except asyncio.CancelledError:
            self._forget(pending)  # still queued: nobody waits for it any more
            raise

    def close(self) -> None:
        """Stop batching: queued requests fail with BatcherClosed now, the running batch's as it is cancelled."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(BatcherClosed("the replica is gone"))
        self._queued_rows = 0

    def _forget(self, pending: _Pending) -> None:
        try:
            self._queue.remove(pending)
        except ValueError:
            return  # already taken into a batch
        self._queued_rows -= pending.rows

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            deadline = self._queue[0].queued_at + self.settings.max_delay
            while self._queue and self._queued_rows < self.settings.max_batch_size and loop.time() < deadline:
                self._arrived.clear()
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._arrived.wait()
                except TimeoutError:
                    break
            if self._queue:
                await self._run(self._cut())

    def _cut(self) -> list[_Pending]:
        batch = [self._queue.popleft()]
        rows, width = batch[0].rows, batch[0].length
        while self._queue and rows + self._queue[0].rows <= self.settings.max_batch_size:
            nxt = self._queue[0]
            if (rows + nxt.rows) * max(width, nxt.length) > self.settings.max_batch_tokens:
                break  # merged, the padded batch would pass the token budget: it waits for the next forward
            rows, width = rows + nxt.rows, max(width, nxt.length)
            batch.append(self._queue.popleft())
        self._queued_rows -= rows
        return batch

    async def _run(self, batch: list[_Pending]) -> None:
        self._running = len(batch)
        try:
            try:
                await self._forward(batch)
            except InferenceInputError:
                if len(batch) == 1:
                    raise
                # One request's bad ids (say, outside the vocabulary) must not fail the others:
                # run each alone so only the culprit gets the error.
                for pending in batch:
                    try:
                        await self._forward([pending])
                    except Exception as e:
                        _fail(pending, e)
        except asyncio.CancelledError:
            for pending in batch:
                _fail(pending, BatcherClosed("the replica is gone"))
            raise
        except Exception as e:
            for pending in batch:
                _fail(pending, e)
        finally:
            self._running = 0

    async def _forward(self, batch: list[_Pending]) -> None:
        started = asyncio.get_running_loop().time()
        if len(batch) == 1:
            # Alone, a request goes as it came: no copy, no padding, no mask added.
            inputs, adapters = batch[0].inputs, batch[0].adapters
        else:
            inputs = merge([p.inputs for p in batch], [p.length for p in batch])
            adapters = [a for p in batch for a in p.adapters]
        outputs = await self._run_batch(inputs, adapters)
        parts = split(outputs, [p.rows for p in batch], [p.length for p in batch])
        rows = sum(p.rows for p in batch)
        for pending, part in zip(batch, parts, strict=True):
            if not pending.future.done():
                pending.future.set_result(Result(part, started - pending.queued_at, rows))


def check_inputs(inputs: dict[str, np.ndarray]) -> tuple[int, int]:
    """Rows and sequence length of a mergeable request; InvalidInput naming the tensor otherwise."""
    if "input_ids" not in inputs:
        raise InvalidInput("missing input 'input_ids'")
    shape = None
    for name, value in inputs.items():
        if name not in PAD_VALUES:
            raise InvalidInput(f"unknown input {name!r}; a batch takes {', '.join(PAD_VALUES)}")
        array = np.asarray(value)
        if array.ndim != 2 or 0 in array.shape:
            raise InvalidInput(f"input {name!r} must be a non-empty [batch, sequence] matrix, got {list(array.shape)}")
        if not np.issubdtype(array.dtype, np.integer):
            raise InvalidInput(f"input {name!r} must hold integers, got {array.dtype}")
        if shape is not None and array.shape != shape:
            raise InvalidInput(f"inputs have different shapes: {list(shape)} and {list(array.shape)} ({name!r})")
        shape = array.shape
    rows, length = np.asarray(inputs["input_ids"]).shape
    return int(rows), int(length)


def merge(requests: Sequence[dict[str, np.ndarray]], lengths: Sequence[int]) -> dict[str, np.ndarray]:
    """Stack requests into one batch, right-padded to the longest; every row gets an attention mask."""
    width = max(lengths)
    names = {name for inputs in requests for name in inputs} | {"attention_mask"}
    merged = {}
    for name in sorted(names, key=list(PAD_VALUES).index):
        blocks = []
        for inputs, length in zip(requests, lengths, strict=True):
            rows = np.asarray(inputs["input_ids"]).shape[0]
            block = np.full((rows, width), PAD_VALUES[name], dtype=np.int64)
            if name in inputs:
                block[:, :length] = inputs[name]
            elif name == "attention_mask":
                block[:, :length] = 1  # absent means "every token counts", as the model would assume
            blocks.append(block)
        merged[name] = np.concatenate(blocks)
    return merged


def split(outputs: dict[str, np.ndarray], rows: Sequence[int], lengths: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Each request's rows of a batched answer; per-token outputs ([B, S, ...]) cut to its own length."""
    total, width = sum(rows), max(lengths)
    parts: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for name, value in outputs.items():
        array = np.asarray(value)
        if array.ndim == 0 or array.shape[0] != total:
            raise RuntimeError(f"the replica answered {name!r} with shape {list(array.shape)} for {total} rows")
        per_token = array.ndim >= 3 and array.shape[1] == width
        start = 0
        for part, count, length in zip(parts, rows, lengths, strict=True):
            piece = array[start : start + count]
            part[name] = piece[:, :length] if per_token else piece
            start += count
    return parts


def pad_rows(sequences: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """Token id lists of different lengths as one right-padded request with its attention mask."""
    width = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), width), dtype=np.int64)
    mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _fail(pending: _Pending, error: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(error)
