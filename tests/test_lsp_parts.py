"""The LSP server's own parts, without a model: the typed-ahead cache, the context ring, the settings."""

from __future__ import annotations

from lingcode.lsp.completer import CHUNK_LINES, WALK_BACK, ContextRing, Settings, TypedAheadCache


def test_typing_along_a_suggestion_reuses_it():
    cache = TypedAheadCache()
    cache.put("x = compute(", ")\n", "alpha, beta")
    assert cache.get("x = compute(", ")\n") == "alpha, beta"  # asked again at the same place
    assert cache.get("x = compute(al", ")\n") == "pha, beta"
    assert cache.get("x = compute(alpha, bet", ")\n") == "a"
    assert cache.get("x = compute(alpha, beta", ")\n") is None  # all typed: nothing left to show
    assert cache.get("x = compute(ab", ")\n") is None  # typed something else
    assert cache.get("x = compute(al", "]\n") is None  # another place (the text after the cursor differs)


def test_an_empty_suggestion_is_remembered_only_at_its_own_place():
    cache = TypedAheadCache()
    cache.put("def f(", "", "")
    assert cache.get("def f(", "") == ""
    assert cache.get("def f(a", "") is None


def test_the_walk_back_is_bounded_and_the_cache_is_an_lru():
    cache = TypedAheadCache(capacity=2)
    long = "y" * (WALK_BACK + 10)
    cache.put("s = '", "'", long)
    assert cache.get("s = '" + long[:WALK_BACK], "'") == long[WALK_BACK:]
    assert cache.get("s = '" + long[: WALK_BACK + 1], "'") is None
    cache.put("a", "", "1")
    cache.put("b", "", "2")
    assert cache.get("s = '", "'") is None and len(cache) == 2  # the oldest was evicted


def test_the_ring_dedupes_similar_chunks_and_leaves_out_what_the_prompt_has():
    ring = ContextRing(capacity=3)
    util = "".join(f"def helper_{i}():\n    return {i}\n" for i in range(40))
    ring.add("file:///util.py", "util.py", util)
    ring.add("file:///util.py", "util.py", util + "# saved again\n")  # > 0.9 similar: replaces the first
    assert len(ring.chunks) == 1 and ring.chunks[0].text.count("\n") <= CHUNK_LINES
    ring.add("file:///models.py", "models.py", "class User:\n    name: str\n")
    assert [c["path"] for c in ring.pick("file:///main.py", "import util\n")] == ["util.py", "models.py"]
    assert [c["path"] for c in ring.pick("file:///util.py", "")] == ["models.py"]  # not the current file
    assert [c["path"] for c in ring.pick("file:///main.py", ring.chunks[0].text)] == ["models.py"]  # already near
    for i in range(3):
        ring.add(f"file:///m{i}.py", f"m{i}.py", f"value_{i} = {i}\n")
    assert [c.path for c in ring.chunks] == ["m0.py", "m1.py", "m2.py"]  # the newest three


def test_settings_from_initialization_options():
    settings, warnings = Settings.from_options({"maxTokens": 32, "timeBudgetMs": None, "multiline": True})
    assert (settings.max_tokens, settings.time_budget_ms, settings.multiline) == (32, None, True) and not warnings
    settings, warnings = Settings.from_options({"maxTokens": 0, "context": "yes", "unknown": 1})
    assert settings.max_tokens == Settings().max_tokens and settings.context is True
    assert len(warnings) == 2 and "maxTokens" in warnings[0]
    assert Settings.from_options(["not", "an", "object"])[1] == ["initializationOptions must be an object; ignored"]
