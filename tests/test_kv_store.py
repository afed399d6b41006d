"""Saved KV prefixes (lingcode.engine.local.kv_store): a conversation's cache survives other requests.

On the real engine: a long prompt A, an unrelated prompt B that overwrites the cache, then A
extended: A's prefix is restored, so only the extension is prefilled, and the tokens generated
are the same as without the interruption. On real KV caches: the store stays under its byte
budget, dropping the least recently used, and a prefix that a newer one extends. And the engine's
own prefix rule (LocalEngine._reuse_prefix) over caches whose every position says which prefix it
belongs to: whatever requests come, a saved entry's positions (copied or still resident) and the
live cache hold what they claim to.
"""

from __future__ import annotations

import sys
import threading

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lingcode.engine import SamplingParams, common_prefix
from lingcode.engine.local.engine import LocalEngine
from lingcode.engine.local.kv_store import PrefixStore, _Entry
from lingcode.engine.local.model import KVCache

GREEDY = SamplingParams(max_tokens=6, temperature=0)


async def generate(engine, request_id: str, ids: list[int]) -> list[int]:
    out = []
    async for chunk in engine.generate(request_id, ids, GREEDY):
        out += chunk.token_ids
    return out


async def test_a_prefix_survives_an_unrelated_request(engine):
    encode = engine.info.tokenizer.encode
    conversation = encode("A long agent conversation about refactoring the parser module of a compiler. " * 6)
    unrelated = encode("def add(a, b):\n    return a + b\n" * 5)
    extension = encode(" Next step: rename the visitor class.")

    await generate(engine, "kv-a", conversation)
    await generate(engine, "kv-b", unrelated)
    before = engine.stats()["kv_store"]
    answer = await generate(engine, "kv-a2", conversation + extension)
    last, after = engine.stats()["last_request"], engine.stats()["kv_store"]
    assert after["restores"] == before["restores"] + 1
    assert last["cached_tokens"] >= len(conversation) and last["prefilled_tokens"] <= len(extension)

    # The restored keys/values are the right ones: the same answer as from an empty cache.
    await generate(engine, "kv-other", encode("Something else entirely, long enough to be worth saving. " * 4))
    engine.kv_store.clear()  # forget saved prefixes: the next one is prefilled whole
    fresh = await generate(engine, "kv-a3", conversation + extension)
    assert engine.stats()["last_request"]["cached_tokens"] == 0
    assert fresh == answer


async def test_saving_the_displaced_cache_never_evicts_the_prefix_being_restored(engine):
    """The store's budget holds one conversation: the one asked for stays, the displaced one is not saved."""
    encode = engine.info.tokenizer.encode
    first = encode("The first conversation is about sorting algorithms and their complexity. " * 6)
    second = encode("The second one is about network protocols, sockets and retries. " * 6)
    per_token = sum(layer.attn.kv_cache.k[:, :, :1].nbytes * 2 for layer in engine.model.layers)
    max_bytes = engine.kv_store.max_bytes
    engine.kv_store.clear()
    engine.kv_store.max_bytes = per_token * (len(first) + 40)
    try:
        await generate(engine, "ev-1", first)
        await generate(engine, "ev-2", second)  # saves the first conversation
        answer = await generate(engine, "ev-3", first + encode(" Which one is stable?"))
        assert engine.stats()["last_request"]["cached_tokens"] >= len(first)  # restored, not evicted
        assert answer and engine.stats()["kv_store"]["bytes"] <= engine.kv_store.max_bytes
        assert engine.stats()["kv_store"]["entries"] == 1
    finally:
        engine.kv_store.max_bytes = max_bytes
        engine.kv_store.clear()


async def test_a_saved_prompt_that_opens_alike_does_not_block_saving_the_conversation(engine):
    """bench agent's cold probes: each opens with "request <time_ns>", so it shares a few tokens with
    the probe before it. Restoring those few tokens kept the old probe from eviction, and the
    conversation it displaced went unsaved: the next turn prefilled its whole history again."""
    encode = engine.info.tokenizer.encode
    conversation = encode("The conversation is about parsing, tokens and grammars in a compiler. " * 6)
    probe_1 = encode("request 1795980906 " + "Unrelated words about gardens and flowers. " * 5)
    probe_2 = encode("request 1795980912 " + "Other words about oceans, ships and harbours. " * 5)
    per_token = sum(layer.attn.kv_cache.k[:, :, :1].nbytes * 2 for layer in engine.model.layers)
    max_bytes = engine.kv_store.max_bytes
    engine.kv_store.clear()
    engine.kv_store.max_bytes = per_token * (len(conversation) + 40)  # the conversation, not it and a probe
    try:
        await generate(engine, "al-1", probe_1)
        await generate(engine, "al-2", conversation)  # saves probe_1
        await generate(engine, "al-3", probe_2)  # shares a few tokens with probe_1, none with the conversation
        await generate(engine, "al-4", conversation + encode(" Which parser is simplest?"))
        assert engine.stats()["last_request"]["cached_tokens"] >= len(conversation)
        assert engine.stats()["kv_store"]["bytes"] <= engine.kv_store.max_bytes
    finally:
        engine.kv_store.max_bytes = max_bytes
        engine.kv_store.clear()


async def test_a_retried_prompt_saves_nothing(engine):
    """The same prompt again after an answer longer than it (a retry, a regenerated answer): the cache
    holds the whole prompt, and what the retry overwrites is only that answer. Copying it to the store
    (prompt and answer, every layer) delayed the retry's first token; nothing is saved."""
    prompt = engine.info.tokenizer.encode("Write a limerick about a cache.")
    long_answer = SamplingParams(max_tokens=3 * len(prompt) + 32, temperature=0, ignore_eos=True)
    before = None
    for attempt in range(3):
        async for _ in engine.generate(f"retry-{attempt}", prompt, long_answer):
            pass
        store = engine.stats()["kv_store"]
        if attempt:  # (the first may save what an earlier request left in the cache)
            assert engine.stats()["last_request"]["cached_tokens"] == len(prompt) - 1
            assert (store["saves"], store["entries"]) == before
        before = store["saves"], store["entries"]


def caches(n_layers=2, max_len=256) -> list[KVCache]:
    made = []
    for _ in range(n_layers):
        cache = KVCache(max_len, 2, 8, torch.float32, torch.device("cpu"))
        cache.k.normal_()
        cache.v.normal_()
        made.append(cache)
    return made


def test_store_is_bounded_lru_and_restores_exact_values():
    layers = caches()
    per_token = sum(c.k[:, :, :1].nbytes * 2 for c in layers)
    store = PrefixStore(max_bytes=per_token * 200)
    a, b, c = list(range(100)), list(range(1000, 1090)), list(range(2000, 2080))
    store.save(a, layers)
    saved_k = layers[0].k[:, :, :100].clone()
    store.save(b, layers)
    assert store.stats()["entries"] == 2
    store.save(c, layers)  # 270 tokens do not fit in 200: the oldest (a) goes
    assert store.stats()["bytes"] <= store.max_bytes and store.stats()["evictions"] == 1
    assert store.best_match(a + [5]) == (None, 0) and store.best_match(c[:50] + [5]) == (tuple(c), 50)

    store = PrefixStore(max_bytes=per_token * 1000)
    store.save(a, layers)
    layers[0].k.zero_()
    store.restore(tuple(a), 100, layers)
    assert torch.equal(layers[0].k[:, :, :100], saved_k)
    store.save(a + [7, 8, 9] * 20, layers)  # extends a: a is redundant now
    assert store.stats()["entries"] == 1 and len(store.best_match(a)[0]) == 160


@settings(deadline=None)  # outcomes, not wall time: a loaded 2-core machine once took 232 ms for one example
@given(
    st.lists(st.integers(0, 3), max_size=400),
    st.integers(0, 400),
    st.lists(st.integers(0, 3), max_size=80),
    st.booleans(),
)
def test_common_prefix_counts_the_shared_start_of_lists_and_tuples(a, keep, tail, as_tuple):
    b = a[:keep] + tail
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    assert common_prefix(tuple(a) if as_tuple else a, b) == shared
    assert common_prefix(b, tuple(a) if as_tuple else a) == shared


async def test_a_short_request_copies_only_what_it_overwrites(engine):
    """A completion between two turns of a long conversation: the conversation is saved, but only the
    positions the completion can write are copied before its first step; the rest stays in place,
    and the next turn restores the conversation with the same answer as from an empty cache."""
    encode = engine.info.tokenizer.encode
    conversation = encode("An agent conversation about caching layers, eviction and write-back. " * 30)
    completion = encode("def area(r):\n    return")
    extension = encode(" Which eviction policy fits a CDN?")
    engine.kv_store.clear()
    await generate(engine, "rt-1", conversation)
    before = engine.stats()["kv_store"]
    await generate(engine, "rt-2", completion)
    after = engine.stats()["kv_store"]
    reach = len(completion) + GREEDY.max_tokens + max(engine.step.widths)
    assert after["saves"] == before["saves"] + 1
    assert after["copied_tokens"] - before["copied_tokens"] == reach  # not the conversation's ~500
    assert after["resident_tokens"] >= len(conversation) - reach
    answer = await generate(engine, "rt-3", conversation + extension)
    assert engine.stats()["last_request"]["cached_tokens"] >= len(conversation)
    engine.kv_store.clear()
    await generate(engine, "rt-4", encode("Unrelated: " * 40))
    engine.kv_store.clear()
    assert await generate(engine, "rt-5", conversation + extension) == answer
    assert engine.stats()["last_request"]["cached_tokens"] == 0


class _Layer:
    def __init__(self, cache):
        self.attn = type("Attn", (), {"kv_cache": cache})()


class _Engine:
    """What LocalEngine._reuse_prefix reads: the live cache's tokens, the caches, the store."""

    def __init__(self, max_len: int, max_bytes: int):
        self.layers = [KVCache(max_len, 1, 1, torch.float64, torch.device("cpu")) for _ in range(2)]
        self.model = type("Model", (), {"layers": [_Layer(c) for c in self.layers]})()
        self.kv_store = PrefixStore(max_bytes)
        self._cached_ids: list[int] = []


def _mark(ids) -> float:
    """What a position holds once the tokens ids (up to and including it) were fed: keys and values
    depend on the whole prefix."""
    return float(hash(tuple(ids)) % 2**50)


def _holds(fake: _Engine, ids, start: int = 0) -> bool:
    return all(
        c.k[0, 0, p, 0].item() == _mark(ids[: p + 1]) and c.v[0, 0, p, 0].item() == -_mark(ids[: p + 1])
        for c in fake.layers
        for p in range(start, len(ids))
    )


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 60), st.integers(1, 30), st.integers(0, 9)), min_size=1, max_size=12
    ),
    st.integers(60, 400),
)
def test_whatever_comes_the_store_and_cache_hold_what_they_claim(requests, budget_tokens):
    """Requests of a few conversations (each extending its own earlier prompt, or starting over), of
    random lengths; each writes its prompt, answer and padding past them up to its reach, as a step
    may. After each, every entry (copied part and resident part) and the live cache are right."""
    max_len, width = 256, 8
    fake = _Engine(max_len, max_bytes=budget_tokens * 2 * 2 * 8)
    history: dict[int, list[int]] = {}
    for conversation, grow, answer, restart in requests:
        ids = history.get(conversation, []) if restart else []
        ids = (ids + [conversation * 1000 + len(ids) + i for i in range(grow)])[: max_len - answer - width - 1]
        history[conversation] = ids
        reach = len(ids) + answer + width
        live = LocalEngine._reuse_prefix(fake, ids, reach)
        assert _holds(fake, fake._cached_ids[:live]) and fake._cached_ids[:live] == ids[:live]
        fed = ids + [7000 + i for i in range(answer - 1)]  # the answer, its last token not fed
        for p in range(min(live, len(ids) - 1), reach):  # prompt, answer, then padding past them
            value = _mark(fed[: p + 1]) if p < len(fed) else -1.0
            for c in fake.layers:
                c.k[0, 0, p, 0], c.v[0, 0, p, 0] = value, -value
        fake._cached_ids = fed
        assert _holds(fake, fake._cached_ids)
        store = fake.kv_store
        assert store.stats()["bytes"] <= store.max_bytes
        for entry in store._entries.values():  # copied spans, then what is still in place
            probe = _Engine(max_len, 0)
            store._write_back(entry, entry.copied, probe.layers)
            for fresh, live_cache in zip(probe.layers, fake.layers):
                fresh.k[:, :, entry.copied :] = live_cache.k[:, :, entry.copied :]
                fresh.v[:, :, entry.copied :] = live_cache.v[:, :, entry.copied :]
            assert _holds(probe, list(entry.key))


def test_stats_read_while_the_engine_thread_saves_and_evicts():
    """The daemon reads the store's stats on its event loop while the engine's thread adds and drops
    entries: a change between two entries once failed the stats request (a 500 with no counts)."""
    store = PrefixStore(1 << 20)
    for n in range(64):
        store._entries[(n,) * 8] = _Entry((n,) * 8, bytes=8)
    done, failures = threading.Event(), []

    def churn() -> None:  # what save() and eviction do to the entries, as fast as it can
        n = 64
        while not done.is_set():
            store._entries[(n,) * 8] = _Entry((n,) * 8, bytes=8)
            store._entries.popitem(last=False)
            n += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows: the race shows within a few reads
    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(3000):
            try:
                stats = store.stats()
            except RuntimeError as exc:
                failures.append(exc)
                break
            assert stats["entries"] in (64, 65) and stats["bytes"] == stats["entries"] * 8  # one snapshot
    finally:
        done.set()
        worker.join()
        sys.setswitchinterval(interval)
    assert not failures, failures
