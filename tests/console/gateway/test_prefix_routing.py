"""Prefix-aware routing, pure: a prompt's leading text blocks, the index of which replicas were sent them, and the
choice among replicas that hold them within the bounded-load bound."""

from console.gateway.prefix_index import BLOCK_BYTES, MAX_BLOCKS, PrefixIndex, block_hashes, prompt_text
from console.gateway.routing import bounded_load_bound, prefix_choice

SYSTEM = "You are a careful assistant. " * 40  # ~1,160 characters: 4 full blocks


def _blocks(suffix: str, prefix: str = SYSTEM, salt: str = "chat\x1f") -> tuple[int, ...]:
    return block_hashes(prompt_text("/v1/completions", {"prompt": prefix + suffix}), salt)


def _route(index: PrefixIndex, blocks, replicas, outstanding, turn=0, adapter=None) -> tuple[int, str]:
    chosen, reason = prefix_choice(index.matches(blocks, replicas), len(blocks), replicas, outstanding, turn, adapter)
    index.sent(blocks, chosen)
    return chosen, reason


def test_prompts_sharing_a_prefix_share_their_leading_blocks_and_a_different_salt_shares_none():
    a, b = _blocks("What is 2+2?"), _blocks("Tell me a story about a dragon who " * 20)
    assert a == b[: len(a)] and len(a) == len(SYSTEM) // BLOCK_BYTES
    assert not set(_blocks("What is 2+2?", salt="chat\x1fsupport-fr")) & set(a)  # another adapter: another KV
    assert _blocks("x" * 10, prefix="y" * (100 * BLOCK_BYTES)) == _blocks("", prefix="y" * (MAX_BLOCKS * BLOCK_BYTES))


def test_chat_messages_are_hashed_by_role_and_content_in_order():
    def chat(*messages):
        return prompt_text("/v1/chat/completions", {"messages": [{"role": r, "content": c} for r, c in messages]})

    assert chat(("system", SYSTEM), ("user", "hi")).startswith(chat(("system", SYSTEM)))
    assert chat(("system", SYSTEM)) != chat(("user", SYSTEM))
    parts = [{"type": "text", "text": SYSTEM}, {"type": "image_url", "image_url": {"url": "data:..."}}]
    assert chat(("system", parts)) == chat(("system", SYSTEM))
    assert prompt_text("/v1/completions", {"prompt": [1, 2, 3]}) == ""  # token ids: no text to hash
    assert prompt_text("/v1/embeddings", {"input": SYSTEM}) == ""
    huge = prompt_text("/v1/chat/completions", {"messages": [{"role": "user", "content": "z" * 10**6}] * 50})
    assert len(huge) == MAX_BLOCKS * BLOCK_BYTES  # bounded whatever the body


def test_the_same_prefix_goes_to_the_same_replica_where_least_outstanding_would_alternate():
    index, replicas = PrefixIndex(), [1, 2]
    first, reason = _route(index, _blocks("q0"), replicas, {})
    assert reason == "least-outstanding"
    for turn in range(1, 10):  # idle replicas: least outstanding alone would rotate
        chosen, reason = _route(index, _blocks(f"q{turn}"), replicas, {}, turn)
        assert chosen == first and reason == "prefix 4/4"
    other, reason = _route(index, _blocks("q", prefix="Another system prompt entirely. " * 40), replicas, {}, 0)
    assert reason == "least-outstanding"


def test_the_longest_held_prefix_wins_and_ties_go_to_the_least_loaded():
    index = PrefixIndex()
    index.sent(_blocks("")[:2], 1)
    index.sent(_blocks(""), 2)
    load = {1: 0, 2: 1, 3: 1}  # 2 is busier than 1, yet within the bound (2 of 3 in flight once it is added)
    assert prefix_choice(index.matches(_blocks("q"), [1, 2, 3]), 4, [1, 2, 3], load) == (2, "prefix 4/4")
    index.sent(_blocks(""), 1)
    assert prefix_choice(index.matches(_blocks("q"), [1, 2, 3]), 4, [1, 2, 3], load) == (1, "prefix 4/4")


def test_a_hot_prefix_spills_over_and_no_replica_exceeds_the_bound():
    index, replicas, outstanding = PrefixIndex(), [1, 2, 3, 4], {}
    reasons = set()
    for i in range(40):  # one prefix's burst, nobody finishing
        total = sum(outstanding.values())
        chosen, reason = _route(index, _blocks(f"q{i}"), replicas, outstanding, i)
        outstanding[chosen] = outstanding.get(chosen, 0) + 1
        assert outstanding[chosen] <= bounded_load_bound(total, len(replicas))
        reasons.add(reason.split()[0])
    assert reasons >= {"prefix", "spill"}
    assert len(outstanding) == 4 and max(outstanding.values()) <= 1.25 * 40 / 4 + 1


def test_a_replica_that_leaves_is_forgotten():
    index = PrefixIndex()
    index.sent(_blocks(""), 1)
    index.sent(_blocks(""), 2)
    index.keep({2, 3})
    assert index.matches(_blocks("q"), [1, 2, 3]) == {2: 4}
    index.keep({3})
    assert index.matches(_blocks("q"), [1, 2, 3]) == {}
    index.sent(_blocks("")[:2], 1)  # 1 is back (woken, its cache empty): only what it was sent since counts
    assert index.matches(_blocks("q"), [1, 2, 3]) == {1: 2}


def test_the_index_is_bounded_and_forgets_the_least_recently_sent_first():
    index = PrefixIndex(capacity=8)
    old, new = _blocks("", prefix="a" * 4 * BLOCK_BYTES), _blocks("", prefix="b" * 4 * BLOCK_BYTES)
    index.sent(old, 1)
    index.sent(new, 2)
    index.sent(old, 1)  # old is the most recent now
    index.sent(_blocks("", prefix="c" * 2 * BLOCK_BYTES), 3)
    assert len(index) == 8
    assert index.matches(old, [1, 2, 3]) == {1: 4}
    assert index.matches(new, [1, 2, 3]) == {}  # its first two blocks went first


def test_an_adapter_keeps_its_affinity_as_the_fallback():
    index, replicas = PrefixIndex(), [1, 2, 3, 4]
    salted = _blocks("q", salt="chat\x1fsupport-fr")
    home, reason = prefix_choice({}, len(salted), replicas, {}, 0, "support-fr")
    assert reason == "adapter-affinity"
    assert all(prefix_choice({}, 4, replicas, {}, t, "support-fr")[0] == home for t in range(8))
    index.sent(salted, 3)
    assert prefix_choice(index.matches(salted, replicas), 4, replicas, {}, 0, "support-fr") == (3, "prefix 4/4")


def test_the_lowest_prediction_wins_within_the_bound_and_near_ties_go_to_the_replica_holding_the_prompt():
    from console.gateway.routing import predicted_choice

    assert predicted_choice({1: 0.5, 2: 0.2}, {}, 4, [1, 2], {}) == (2, "least-outstanding")
    assert predicted_choice({1: 0.201, 2: 0.2}, {1: 3}, 4, [1, 2], {}) == (1, "prefix 3/4")  # within 5%: held wins
    assert predicted_choice({1: 0.1, 2: 0.9}, {1: 4}, 4, [1, 2], {1: 6, 2: 0}) == (2, "spill")  # 1 is past the bound
