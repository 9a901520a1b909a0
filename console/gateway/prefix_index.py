"""Approximate prefix-aware routing's memory: which replicas were recently sent which prompt prefixes.

The console does not tokenize, so a prompt's text stands for its tokens: its UTF-8 is cut into blocks of
BLOCK_BYTES bytes, and block i is named by a chain hash of the adapter (or model) and the text of blocks 0..i, so
one name stands for the whole prefix up to its end (as the engines' own prefix caches name token blocks). Only the
first MAX_BLOCKS full blocks count: the hashing is bounded whatever the body's size (it runs on the event loop).

Each deployment has a PrefixIndex: a bounded LRU map from block name to the replicas that were sent that block,
fed with what the gateway routed, and told when a replica leaves. Pure: no clock, no I/O, no Django.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

BLOCK_BYTES = 256  # about 64 tokens of English: long enough to be cheap, short enough to match a system prompt
MAX_BLOCKS = 64  # 16 KiB of text at most is hashed per request
INDEX_BLOCKS = 16384  # block names remembered per deployment (a few MiB at most)
_SEP = "\x1e"  # between a chat message's role, its content and the next message: not in ordinary text


def prompt_text(path: str, body: Mapping | None, limit: int = MAX_BLOCKS * BLOCK_BYTES) -> str:
    """The start (at most `limit` characters) of what an OpenAI completion or chat body asks the model to continue:
    the prompt, or the messages' roles and text contents in order; "" when it holds neither (token ids, other
    paths). Only what the limit needs is joined, so a 1 MB prompt costs no more than a 16 KB one."""
    if not isinstance(body, Mapping):
        return ""
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return prompt[:limit] if isinstance(prompt, str) else ""
    if not path.endswith("/chat/completions") or not isinstance(body.get("messages"), list):
        return ""
    parts, size = [], 0
    for message in body["messages"]:
        if size >= limit or not isinstance(message, Mapping):
            break
        for piece in (str(message.get("role", "")), *_contents(message.get("content"))):
            piece = piece[: limit - size]
            parts.append(piece + _SEP)
            size += len(piece) + 1
            if size >= limit:
                break
    return "".join(parts)[:limit]


def _contents(content) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):  # content parts: their text, in order (images and audio are not hashed)
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]


def block_hashes(text: str, salt: str, block: int = BLOCK_BYTES, most: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Chain hashes of the first `most` full `block`-byte blocks of `text` (UTF-8), `salt` (adapter or model) first:
    equal names mean equal prefixes under the same salt. A partial last block is left out, as engines cache only
    full blocks. Python's own hash (SipHash, in C, salted per process): the index lives in one process, and 64-bit
    names collide too rarely to matter (a collision only sends a request to a replica that lacks its prefix)."""
    data = text.encode()
    name = hash(salt)
    names = []
    for start in range(0, min(len(data) // block, most) * block, block):
        name = hash((name, data[start:start + block]))
        names.append(name)
    return tuple(names)


class PrefixIndex:
    """Block name -> the replicas that were sent it, least recently sent names forgotten first. Each replica's entries
    carry its epoch: forgetting a replica bumps its epoch (O(1), nothing scanned on the event loop), and entries of
    an older epoch no longer count, until the LRU drops them."""

    def __init__(self, capacity: int = INDEX_BLOCKS) -> None:
        self.capacity = capacity
        self._holders: OrderedDict[int, dict[int, int]] = OrderedDict()  # name -> {replica: its epoch when sent}
        self._epochs: dict[int, int] = {}  # replica -> its current epoch (absent: 0)
        self.members: set[int] = set()  # replicas sent anything in their current epoch

    def __len__(self) -> int:
        return len(self._holders)

    def matches(self, blocks: Sequence[int], replicas: Iterable[int]) -> dict[int, int]:
        """For each of `replicas` that holds the first block: how many leading blocks it holds."""
        alive, counts, epochs = set(replicas), {}, self._epochs
        for i, name in enumerate(blocks):
            holders = self._holders.get(name)
            if not holders:
                break
            alive = {r for r in alive if holders.get(r, -1) == epochs.get(r, 0)}
            if not alive:
                break
            for r in alive:
                counts[r] = i + 1
        return counts

    def sent(self, blocks: Sequence[int], replica: int) -> None:
        """`replica` was sent a prompt with these blocks: it holds them now, as the most recent."""
        self.members.add(replica)
        epoch = self._epochs.get(replica, 0)
        for name in blocks:
            holders = self._holders.get(name)
            if holders is None:
                self._holders[name] = {replica: epoch}
            else:
                holders[replica] = epoch
                self._holders.move_to_end(name)
        while len(self._holders) > self.capacity:
            self._holders.popitem(last=False)

    def keep(self, replicas: set[int]) -> None:
        """Forget every replica not in `replicas` (it stopped, slept or left: its cache is gone)."""
        for r in self.members - replicas:
            self._epochs[r] = self._epochs.get(r, 0) + 1
        self.members &= replicas
