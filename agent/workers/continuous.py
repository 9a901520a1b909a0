"""Continuous (iteration-level) batching for causal LMs (worker side: imports torch).

Sequences join the running batch between decoding steps and leave as they finish. Each step first
prefills waiting prompts within a token budget (short prompts together, a long one in chunks over several
steps, so running streams never stall behind it), then runs one decoding forward for every running
sequence. Running sequences share one KV cache (transformers' DynamicCache), left-padded to the longest:
a newcomer joins by padding whichever side is shorter, a finished sequence leaves by row selection, and
columns no row attends any more are trimmed. Position ids count each row's real tokens, so padding never
shifts a sequence. With a prefix cache (agent.workers.prefix_cache), a prompt whose first blocks were prefilled
before starts from their KV, and only the rest runs through the model, in the chunked path. Every sequence samples
with its own settings and random stream, and names its own LoRA adapter (the mixed-adapter forward). A sequence
may ask for its prompt's log probabilities (for a completion that echoes its prompt): only its prefill then keeps
every position's logits, for that step alone.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

from agent.workers import limits
from agent.workers.errors import describe_error
from agent.workers.generation_spec import (
    EngineStats,
    GenerationRequest,
    GenerationResult,
    PromptError,
    PromptLogprobs,
    Token,
    TokenLogprob,
)
from agent.workers.prefix_cache import LayerKV, PrefixCache
from agent.workers.sampling import choose, model_eos_ids, new_generator, prompt_logprobs

log = logging.getLogger("agent.worker")

DEFAULT_TOKEN_BUDGET = 512  # prompt tokens prefilled per step: bounds how long one step holds running streams
DEFAULT_MAX_RUNNING = 64  # sequences decoding at once; more wait their turn

Adapters = Callable[[list[str | None]], AbstractContextManager]


@dataclass(frozen=True)
class Failure:
    """A sequence that ended in an error: the worker reports it as a Refusal (agent.workers.messages)."""

    request_id: int
    text: str
    kind: str  # "input", "oom", "timeout", "unavailable" or "error" (agent.workers.errors.ERROR_KINDS)


@dataclass
class StepOutput:
    """What one step produced: tokens to stream, sequences finished, sequences failed."""

    tokens: list[Token] = field(default_factory=list)
    finished: list[tuple[int, GenerationResult]] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)


@dataclass(eq=False)
class _Sequence:
    request_id: int
    request: GenerationRequest
    generator: torch.Generator | None
    prefilled: int = 0  # prompt tokens in the cache so far
    cache: object | None = None  # its own cache while a long prompt is prefilled in chunks
    last: int = 0  # the token to feed next
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # the prompt's so far, when asked for and not yet sent
    looked_up: bool = False  # its prompt was looked up in the prefix cache

    @property
    def prompt_length(self) -> int:
        return len(self.request.input_ids)

    def take_prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt's log probabilities, once: the sequence's first token or its result carries them."""
        taken, self.prompt_logprobs = self.prompt_logprobs, None
        return tuple(taken) if taken is not None else None


class _Batch:
    """Sequences decoding together: one cache, and an attention mask with a 0 for every left-pad column."""

    def __init__(self, sequences: list[_Sequence], cache: object, mask: torch.Tensor) -> None:
        self.sequences, self.cache, self.mask = sequences, cache, mask

    @property
    def mergeable(self) -> bool:
        # Plain full-attention layers only: sliding-window or linear-attention caches keep their own shape.
        return all(type(layer) is DynamicLayer for layer in self.cache.layers)

    def merge(self, other: _Batch) -> None:
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_pad_kv(mine.keys, width), _pad_kv(theirs.keys, width)])
            mine.values = torch.cat([_pad_kv(mine.values, width), _pad_kv(theirs.values, width)])
        self.mask = torch.cat([_pad_mask(self.mask, width), _pad_mask(other.mask, width)])
        self.sequences += other.sequences

    def keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        mask = self.mask[index]
        used = torch.nonzero(mask.any(dim=0))
        start = int(used[0]) if len(used) else 0  # the left-pad columns no remaining row needs
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]
        self.mask = mask[:, start:]
        self.sequences = [self.sequences[i] for i in rows]

    def kv_bytes(self) -> int:
        return _cache_bytes(self.cache)


class ContinuousBatcher:
    """Runs every generation of one replica; `submit` and `cancel` between `step` calls."""

    def __init__(
        self,
        model: torch.nn.Module,
        adapters: Adapters,
        *,
        max_positions: int = 0,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        max_running: int = DEFAULT_MAX_RUNNING,
        eos_ids: set[int] | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.model = model
        self.adapters = adapters
        self.device = next(model.parameters()).device
        self.vocab_size = int(getattr(model.config, "vocab_size", 0) or 0)
        self.max_positions = max_positions
        self.token_budget = token_budget
        self.max_running = max_running
        self.eos = model_eos_ids(model) if eos_ids is None else set(eos_ids)
        self._waiting: deque[_Sequence] = deque()
        self._batches: list[_Batch] = []
        # Only the last position's logits are needed: a long prompt's full [length, vocab] would be large.
        takes_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._last_only = {"logits_to_keep": 1} if takes_keep else {}
        self.prefix_cache = prefix_cache if prefix_cache is not None and _plain_cache(model) else None
        self.prefill_tokens = 0

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._batches)

    def submit(self, request_id: int, request: GenerationRequest) -> None:
        """Queue one sequence; PromptError (the client's) when the model cannot take it."""
        ids = request.input_ids
        if self.vocab_size and not all(0 <= i < self.vocab_size for i in ids):
            # An id past the embedding table is a device-side assert on a GPU that poisons the CUDA context.
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise PromptError(f"the prompt holds token id {bad}, outside this model's range [0, {self.vocab_size})")
        # A new token needs a position after the prompt; the prompt alone (its log probabilities) may fill them all.
        if self.max_positions and len(ids) + min(request.max_new_tokens, 1) > self.max_positions:
            raise PromptError(
                f"the prompt has {len(ids)} tokens; this model takes at most {self.max_positions} positions, "
                "prompt and completion together"
            )
        self.adapters([request.adapter])  # refuses an adapter this replica has not loaded (nothing entered yet)
        sequence = _Sequence(request_id, request, new_generator(request, self.device))
        if request.prompt_logprobs is not None:
            sequence.prompt_logprobs = [None]  # nothing comes before the first token
        self._waiting.append(sequence)

    def cancel(self, request_id: int) -> bool:
        """Drop a sequence wherever it is (the client went away); False when it is not here."""
        for sequence in self._waiting:
            if sequence.request_id == request_id:
                self._waiting.remove(sequence)
                return True
        for batch in self._batches:
            rows = [i for i, s in enumerate(batch.sequences) if s.request_id != request_id]
            if len(rows) != len(batch.sequences):
                self._keep(batch, rows)
                return True
        return False

    def abort(self, text: str, kind: str) -> list[Failure]:
        """End every sequence with the same error (the replica is going to sleep or stopping)."""
        failed = [Failure(s.request_id, text, kind) for s in self._all()]
        self._waiting.clear()
        self._batches.clear()
        return failed

    def stats(self) -> EngineStats:
        running = sum(len(b.sequences) for b in self._batches)
        kv = sum(b.kv_bytes() for b in self._batches) + sum(_cache_bytes(s.cache) for s in self._waiting if s.cache)
        cache = self.prefix_cache if self.prefix_cache is not None else PrefixCache(0)  # none: nothing counted
        return EngineStats(running=running, waiting=len(self._waiting), kv_cache_bytes=kv,
                           running_adapters=_adapters(s for b in self._batches for s in b.sequences),
                           waiting_adapters=_adapters(self._waiting), prefill_tokens=self.prefill_tokens,
                           prefix_hits=cache.hits, prefix_misses=cache.misses, prefix_hit_tokens=cache.hit_tokens,
                           prefix_cache_bytes=cache.bytes)

    def step(self) -> StepOutput:
        """Prefill within the token budget, then one decoding step for every running sequence."""
        total = StepOutput()
        for part in self.phases():
            total.tokens += part.tokens
            total.finished += part.finished
            total.failed += part.failed
        return total

    @torch.inference_mode()
    def phases(self) -> Iterator[StepOutput]:
        """One step in its two parts, each handed out as soon as it is done: the prefill (the newcomers'
        first tokens, which need not wait for the running batch's forward), then the decoding step."""
        out = StepOutput()
        self._expire(out)
        self._prefill(out)
        yield out
        out = StepOutput()
        for batch in list(self._batches):
            self._decode(batch, out)
        yield out

    # --- prefill --------------------------------------------------------------------------------

    def _prefill(self, out: StepOutput) -> None:
        budget = self.token_budget
        running = sum(len(b.sequences) for b in self._batches)
        if self.prefix_cache is not None:
            self.prefix_cache.fit(self._running_bytes())  # running sequences grew: the cache makes room
        while self._waiting and budget > 0 and running < self.max_running:
            head = self._waiting[0]
            self._reuse_prefix(head)
            remaining = head.prompt_length - head.prefilled
            if head.prefilled or remaining > budget:
                # A long prompt: one chunk now, the rest in later steps, between decoding steps.
                budget -= self._prefill_chunk(head, min(remaining, budget), out)
                if head.prefilled < head.prompt_length:
                    return
                running += 1
                continue
            group = [self._waiting.popleft()]
            width = remaining
            while self._waiting and running + len(group) < self.max_running:
                nxt = self._waiting[0]
                length = nxt.prompt_length
                if nxt.prefilled or max(width, length) * (len(group) + 1) > budget:
                    break
                self._reuse_prefix(nxt)  # looked up only now that it would start: a hit goes the chunked path
                if nxt.prefilled:
                    break
                group.append(self._waiting.popleft())
                width = max(width, length)
            budget -= width * len(group)
            running += len(group)
            self._prefill_group(group, out)

    def _prefill_group(self, group: list[_Sequence], out: StepOutput) -> None:
        """Whole short prompts in one left-padded forward."""
        width = max(s.prompt_length for s in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, sequence in enumerate(group):
            ids[row, width - sequence.prompt_length :] = torch.tensor(sequence.request.input_ids)
            mask[row, width - sequence.prompt_length :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(group, out, ids, mask, positions, None, every_position=_scoring(group))
        if logits is None:
            return
        self.prefill_tokens += sum(s.prompt_length for s in group)
        running = self._running_bytes() + _cache_bytes(cache)
        for row, sequence in enumerate(group):
            sequence.prefilled = sequence.prompt_length
            columns = slice(width - sequence.prompt_length, width)
            kv = [(layer.keys[row : row + 1, :, columns], layer.values[row : row + 1, :, columns])
                  for layer in cache.layers]
            self._keep_prefix(sequence, kv, running)
            if sequence.prompt_logprobs is not None and not self._score_prompt(
                    group, sequence, logits[row, width - sequence.prompt_length :], 0, out):
                return
        self._started(_Batch(group, cache, mask), logits[:, -1], out)

    def _prefill_chunk(self, sequence: _Sequence, count: int, out: StepOutput) -> int:
        start = sequence.prefilled
        ids = torch.tensor([sequence.request.input_ids[start : start + count]], dtype=torch.long, device=self.device)
        mask = torch.ones((1, start + count), dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + count, device=self.device).unsqueeze(0)
        logits, cache = self._forward([sequence], out, ids, mask, positions, sequence.cache,
                                      every_position=_scoring([sequence]))
        if logits is None or (sequence.prompt_logprobs is not None
                              and not self._score_prompt([sequence], sequence, logits[0], start, out)):
            self._waiting.popleft()
            return count
        self.prefill_tokens += count
        sequence.cache, sequence.prefilled = cache, start + count
        if sequence.prefilled == sequence.prompt_length:
            self._waiting.popleft()
            sequence.cache = None
            self._keep_prefix(sequence, [(layer.keys, layer.values) for layer in cache.layers],
                              self._running_bytes() + _cache_bytes(cache))
            self._started(_Batch([sequence], cache, mask), logits[:, -1], out)
        return count

    def _hold_off_ends(self, logits: torch.Tensor, sequences: list[_Sequence]) -> torch.Tensor:
        """`logits` with the tokens that would end a sequence still short of its min_tokens made impossible."""
        held = [(row, s.request) for row, s in enumerate(sequences) if len(s.tokens) < s.request.min_tokens]
        if not held:
            return logits
        logits = logits.clone()
        for row, request in held:
            ends = set(request.stop_token_ids) | (set() if request.ignore_eos else self.eos)
            if ends:
                logits[row, sorted(ends)] = float("-inf")
        return logits

    def _reuse_prefix(self, sequence: _Sequence) -> None:
        """Start a waiting prompt from the longest prefix of it in the cache, once (before its prefill begins)."""
        if self.prefix_cache is None or sequence.looked_up or sequence.prefilled:
            return
        sequence.looked_up = True
        if sequence.prompt_logprobs is not None:
            return  # its prompt's log probabilities need every position's logits
        with self._spare_prefixes():
            tokens, layers = self.prefix_cache.lookup(sequence.request.input_ids, sequence.request.adapter)
            if tokens:
                cache = DynamicCache(config=self.model.config)
                for index, (keys, values) in enumerate(layers):
                    cache.layers[index].update(keys, values)
                sequence.cache, sequence.prefilled = cache, tokens

    def _keep_prefix(self, sequence: _Sequence, layers: LayerKV, running_bytes: int) -> None:
        """Offer a prefilled prompt's KV (from position 0) to the prefix cache."""
        if self.prefix_cache is not None:
            with self._spare_prefixes():
                self.prefix_cache.store(sequence.request.input_ids, sequence.request.adapter, layers, running_bytes)

    @contextmanager
    def _spare_prefixes(self) -> Iterator[None]:
        """The cache only saves work: out of memory while copying a prefix in or out empties it, and the sequence
        goes on (prefilled whole) rather than failing."""
        try:
            yield
        except Exception as e:
            if not limits.is_out_of_memory(e):
                raise
            log.warning("prefix cache emptied: out of memory copying a prefix: %s", describe_error(e))
            self.prefix_cache.clear()

    def _running_bytes(self) -> int:
        return sum(b.kv_bytes() for b in self._batches)

    def _score_prompt(self, group: list[_Sequence], sequence: _Sequence, logits: torch.Tensor, start: int,
                      out: StepOutput) -> bool:
        """Add the log probabilities of the prompt tokens that `logits` (of positions start, start + 1, ...)
        predict; False after failing the whole group (whose prefill then goes no further), as a failed forward."""
        ids = sequence.request.input_ids
        end = min(start + len(logits), len(ids) - 1)  # the prompt's last position predicts the first new token
        if end <= start:
            return True
        try:
            targets = torch.tensor(ids[start + 1 : end + 1], dtype=torch.long)
            count = sequence.request.prompt_logprobs
            sequence.prompt_logprobs += prompt_logprobs(logits[: end - start], targets, count)
        except Exception as e:  # noqa: BLE001 (out of memory most likely: reported to the group's sequences)
            kind, text = _failure(e)
            out.failed.extend(Failure(s.request_id, text, kind) for s in group)
            return False
        return True

    def _started(self, batch: _Batch, logits: torch.Tensor, out: StepOutput) -> None:
        """A prefilled batch: its first tokens, then it joins the running batch."""
        self._batches.append(batch)
        self._advance(batch, logits, out)
        if batch in self._batches and len(self._batches) > 1 and batch.mergeable and self._batches[0].mergeable:
            self._batches.remove(batch)
            self._batches[0].merge(batch)

    # --- decode ---------------------------------------------------------------------------------

    def _decode(self, batch: _Batch, out: StepOutput) -> None:
        ids = torch.tensor([[s.last] for s in batch.sequences], dtype=torch.long, device=self.device)
        positions = batch.mask.sum(dim=-1, keepdim=True)  # each row's real tokens so far
        mask = F.pad(batch.mask, (0, 1), value=1)
        logits, _cache = self._forward(batch.sequences, out, ids, mask, positions, batch.cache, batch)
        if logits is not None:
            batch.mask = mask
            self._advance(batch, logits[:, -1], out)

    def _advance(self, batch: _Batch, logits: torch.Tensor, out: StepOutput) -> None:
        """Each row's next token: streamed, or the end of its sequence."""
        live = [row for row, s in enumerate(batch.sequences) if s.request.max_new_tokens]
        if len(live) < len(batch.sequences):  # those that asked for no new token end with their prefill
            out.finished.extend((s.request_id, self._result(s, "length"))
                                for s in batch.sequences if not s.request.max_new_tokens)
            self._keep(batch, live)
            if not live:
                return
            logits = logits[live]
        sequences = batch.sequences
        logits = self._hold_off_ends(logits, sequences)
        try:
            tokens, logprobs, broken = choose(logits, [s.request for s in sequences], [s.generator for s in sequences])
        except Exception as e:  # noqa: BLE001 (the batch's sequences fail; the worker and its other batches go on)
            kind, text = _failure(e)
            out.failed.extend(Failure(s.request_id, text, kind) for s in sequences)
            self._keep(batch, [])
            return
        keep = []
        for row, (sequence, token, logprob) in enumerate(zip(sequences, tokens, logprobs, strict=True)):
            request = sequence.request
            if row in broken:
                out.failed.append(Failure(sequence.request_id, broken[row], "error"))
                continue
            if token in request.stop_token_ids or (token in self.eos and not request.ignore_eos):
                out.finished.append((sequence.request_id, self._result(sequence, "stop")))
                continue
            sequence.tokens.append(token)
            if logprob is not None:
                sequence.logprobs.append(logprob)
            sequence.last = token
            out.tokens.append(Token(sequence.request_id, token, logprob, sequence.take_prompt_logprobs()))
            length = sequence.prompt_length + len(sequence.tokens)
            if len(sequence.tokens) >= request.max_new_tokens or (self.max_positions and length >= self.max_positions):
                out.finished.append((sequence.request_id, self._result(sequence, "length")))
                continue
            keep.append(row)
        if len(keep) != len(sequences):
            self._keep(batch, keep)

    def _forward(self, sequences, out, ids, mask, positions, cache, batch: _Batch | None = None, *,
                 every_position: bool = False):
        """One forward with the rows' adapters; (logits, cache), or (None, None) after failing the rows. The logits
        are [rows, positions, vocab]: the last position's only unless `every_position` (for prompt log
        probabilities)."""
        keep = {"logits_to_keep": 0} if every_position and self._last_only else self._last_only
        try:
            with self.adapters([s.request.adapter for s in sequences]):
                result = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                    past_key_values=cache, use_cache=True, **keep)
            return result.logits, result.past_key_values
        except Exception as e:  # noqa: BLE001 (each kind is reported to its sequences below)
            kind, text = _failure(e)
            out.failed.extend(Failure(s.request_id, text, kind) for s in sequences)
            if batch is not None:
                self._batches.remove(batch)
            return None, None

    def _keep(self, batch: _Batch, rows: list[int]) -> None:
        if rows:
            batch.keep(rows)
        else:
            self._batches.remove(batch)

    def _expire(self, out: StepOutput) -> None:
        now = time.monotonic()
        for sequence in list(self._all()):
            deadline = sequence.request.deadline
            if deadline is not None and now >= deadline:
                self.cancel(sequence.request_id)
                text = f"the request's deadline passed after {len(sequence.tokens)} generated tokens"
                out.failed.append(Failure(sequence.request_id, text, "timeout"))

    def _all(self) -> Iterator[_Sequence]:
        yield from self._waiting
        for batch in self._batches:
            yield from batch.sequences

    @staticmethod
    def _result(sequence: _Sequence, finish: str) -> GenerationResult:
        logprobs = tuple(sequence.logprobs) if sequence.request.logprobs is not None else None
        return GenerationResult(tuple(sequence.tokens), finish, logprobs, sequence.take_prompt_logprobs())


def _scoring(sequences: list[_Sequence]) -> bool:
    """Whether a prefill must keep every position's logits: a sequence in it wants its prompt's log probabilities."""
    return any(s.prompt_logprobs is not None for s in sequences)


def _plain_cache(model: torch.nn.Module) -> bool:
    """Whether the model's cache is plain full attention in every layer, the only kind whose prefix KV can be cut
    into blocks and joined again (a sliding window or a linear-attention state cannot)."""
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # noqa: BLE001 (a config transformers cannot build a cache from: no prefix cache)
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _failure(error: Exception) -> tuple[str, str]:
    if isinstance(error, PromptError):  # the client's (runtime.InputError too: an adapter this replica lacks)
        return "input", str(error)
    if limits.is_out_of_memory(error):
        return "oom", f"out of memory while generating: {describe_error(error)}"
    log.exception("generation failed")
    return "error", describe_error(error)


def _pad_kv(tensor: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(tensor, (0, 0, width - tensor.shape[-2], 0)) if tensor.shape[-2] < width else tensor


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(mask, (width - mask.shape[-1], 0)) if mask.shape[-1] < width else mask


def _cache_bytes(cache: object) -> int:
    return sum(
        layer.keys.nbytes + layer.values.nbytes
        for layer in getattr(cache, "layers", ())
        if getattr(layer, "keys", None) is not None and getattr(layer, "values", None) is not None
    )


def _adapters(sequences: Iterable[_Sequence]) -> tuple[str, ...]:
    return tuple(sorted({s.request.adapter for s in sequences if s.request.adapter is not None}))
