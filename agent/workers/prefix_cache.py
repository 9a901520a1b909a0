"""The built-in engine's prefix cache (worker side: imports torch): the KV of prompt prefixes that requests share
(a system prompt, few-shot examples, a conversation's history), kept so a later prompt's prefill runs only on the
rest of it.

Prompts are cut into blocks of BLOCK tokens; block i is named by a chain hash of the adapter and blocks 0..i, so
a name stands for the whole prefix up to its end (an adapter changes the KV: the same tokens under another adapter
are another prefix). Each full block's keys and values are copied out of a finished prefill; a lookup takes the
longest run of cached blocks from the start. Blocks are evicted least recently used, the bytes bounded by the
replica's KV share less what its running sequences hold.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BLOCK = 16  # tokens per block: vLLM's default, small enough that most of a shared prefix is reused

# One tensor per cache layer: [1, kv heads, tokens, head size].
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class _Block:
    adapter: str | None
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    nbytes: int


def block_names(ids: Sequence[int], adapter: str | None, count: int, block: int = BLOCK) -> list[bytes]:
    """The chain hashes of the first `count` full blocks of `ids` under `adapter` (None: the base model)."""
    name = b"\0" if adapter is None else b"\1" + adapter.encode()
    names = []
    for i in range(count):
        name = hashlib.blake2b(name + array("q", ids[i * block : (i + 1) * block]).tobytes(), digest_size=16).digest()
        names.append(name)
    return names


class PrefixCache:
    """Full prompt blocks' KV by chain hash, LRU, at most `capacity_bytes` together with the running sequences'."""

    def __init__(self, capacity_bytes: int, block: int = BLOCK) -> None:
        self.capacity_bytes = capacity_bytes
        self.block = block
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.hits = 0  # lookups that reused at least one block
        self.misses = 0  # lookups of a prompt with a full block before its last token that reused none
        self.hit_tokens = 0  # prompt tokens whose prefill a hit saved

    def lookup(self, ids: Sequence[int], adapter: str | None) -> tuple[int, LayerKV | None]:
        """The longest cached prefix of `ids` that leaves at least its last token to compute (its logits give the
        first new token): (tokens, each layer's keys and values over them), or (0, None)."""
        usable = (len(ids) - 1) // self.block
        if usable == 0:
            return 0, None
        found = []
        for name in block_names(ids, adapter, usable, self.block):
            entry = self._blocks.get(name)
            if entry is None:
                break
            found.append((name, entry))
        if not found:
            self.misses += 1
            return 0, None
        self._touch([name for name, _ in found])
        tokens = len(found) * self.block
        self.hits += 1
        self.hit_tokens += tokens
        blocks = [entry.layers for _, entry in found]
        return tokens, [(torch.cat([b[i][0] for b in blocks], dim=-2), torch.cat([b[i][1] for b in blocks], dim=-2))
                        for i in range(len(blocks[0]))]

    def store(self, ids: Sequence[int], adapter: str | None, layers: LayerKV, running_bytes: int) -> None:
        """Keep the full blocks of a prefilled prompt; `layers` hold its KV from position 0 on (at least over its
        full blocks). `running_bytes`: what the running sequences' KV holds of the same share."""
        count = min(len(ids), layers[0][0].shape[-2]) // self.block if layers else 0
        names = block_names(ids, adapter, count, self.block)
        for i, name in enumerate(names):
            if name in self._blocks:
                continue
            span = slice(i * self.block, (i + 1) * self.block)
            # Copies: a view would keep the whole batch's cache tensor alive, and its bytes uncounted.
            kv = tuple((k[:, :, span].clone(), v[:, :, span].clone()) for k, v in layers)
            entry = _Block(adapter, kv, sum(k.nbytes + v.nbytes for k, v in kv))
            self._blocks[name] = entry
            self.bytes += entry.nbytes
        self._touch(names)
        self.fit(running_bytes)

    def fit(self, running_bytes: int) -> None:
        """Evict least recently used blocks until the cache and the running sequences fit the capacity."""
        while self._blocks and self.bytes + running_bytes > self.capacity_bytes:
            _, entry = self._blocks.popitem(last=False)
            self.bytes -= entry.nbytes

    def forget(self, adapter: str | None) -> None:
        """Drop the blocks computed with `adapter` (its weights were unloaded or replaced)."""
        for name in [n for n, e in self._blocks.items() if e.adapter == adapter]:
            self.bytes -= self._blocks.pop(name).nbytes

    def clear(self) -> None:
        """Drop every block (the replica sleeps: its device memory goes)."""
        self._blocks.clear()
        self.bytes = 0

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def _touch(self, names: list[bytes]) -> None:
        # The head block ends most recent: eviction takes a prefix's tail before its head, so what is left of it
        # still starts at position 0, where a lookup (which stops at the first missing block) can use it.
        for name in reversed(names):
            self._blocks.move_to_end(name)
