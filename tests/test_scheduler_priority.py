"""Completions first: a completion preempts a running chat, which resumes after it; latest wins per key.

In process, on the real default model. Assertions are on outputs, order of events and counters.
"""

from __future__ import annotations

import asyncio

from lingcode.text.chat_template import render_chat
from lingcode.engine import STREAM_INTERVAL_S, SamplingParams
from lingcode.pipeline.generation import generate_text
from lingcode.pipeline.scheduler import Priority, Scheduler

GREEDY = dict(temperature=0.0)


def chat_ids(engine, text: str) -> list[int]:
    prompt = render_chat(engine.info.chat_template, [{"role": "user", "content": text}])
    return engine.info.tokenizer.encode(prompt)


def code_ids(engine) -> list[int]:
    return engine.info.tokenizer.encode("<file_sep>numbers.py\nNUMBERS = [\n    1,\n    2,\n    3,\n")


async def run(scheduler, engine, rid, ids, params, log: list, **kwargs):
    """Generate to the end; log `rid:token` per token and `rid:finish_reason` at the end; return the last chunk."""
    async for chunk in generate_text(scheduler, engine.info.tokenizer, rid, ids, params, **kwargs):
        log.extend(f"{rid}:token" for _ in chunk.token_ids if chunk.finish_reason is None)
        if chunk.finish_reason is not None:
            log.append(f"{rid}:{chunk.finish_reason}")
            return chunk


async def until(condition, what: str, timeout_s: float = 120.0):
    """Wait for a condition (a bound against a hang, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def test_a_completion_preempts_a_running_chat_which_resumes_after_it(engine, monkeypatch):
    # the chat's tokens reach the loop every few ms, not at the CPU's 10 a second: it is seen
    # streaming well before its 24 tokens end, on any machine
    monkeypatch.setattr(engine, "stream_interval_s", STREAM_INTERVAL_S)
    scheduler = Scheduler(engine)
    chat, log = chat_ids(engine, "Tell me a long story about the sea."), []
    chat_task = asyncio.create_task(
        run(scheduler, engine, "chat", chat, SamplingParams(max_tokens=24, ignore_eos=True, **GREEDY), log)
    )
    await until(lambda: log.count("chat:token") >= 3, "the chat to stream")
    completion = await run(
        scheduler,
        engine,
        "complete",
        code_ids(engine),
        SamplingParams(max_tokens=3, **GREEDY),
        log,
        priority=Priority.COMPLETION,
    )
    tokens_before_resume = log.count("chat:token")
    last = await chat_task

    assert completion.finish_reason in ("stop", "length")
    assert log.index("complete:" + completion.finish_reason) < log.index("chat:length")  # the completion went first
    assert last.finish_reason == "length" and last.usage.completion_tokens == 24  # one unbroken stream
    assert last.usage.prompt_tokens == len(chat)
    stats = scheduler.stats()
    assert (stats["preempted"], stats["resumed"], stats["completed"]) == (1, 1, 2)
    # The chat resumed from its prompt plus the tokens it had generated when it yielded.
    resumed = engine.stats()["last_request"]
    assert resumed["request_id"] == "chat"
    assert len(chat) + 3 <= resumed["prompt_tokens"] <= len(chat) + tokens_before_resume
    assert resumed["prompt_tokens"] + resumed["generated_tokens"] == len(chat) + 24


async def test_a_chat_cancelled_while_it_waits_to_resume_is_dropped(engine):
    scheduler = Scheduler(engine)
    log: list[str] = []
    chat_task = asyncio.create_task(
        run(
            scheduler,
            engine,
            "chat",
            chat_ids(engine, "Count to fifty."),
            SamplingParams(max_tokens=40, ignore_eos=True, **GREEDY),
            log,
        )
    )
    await until(lambda: "chat:token" in log, "the chat to stream")
    completion = asyncio.create_task(
        run(
            scheduler,
            engine,
            "complete",
            code_ids(engine),
            SamplingParams(max_tokens=30, ignore_eos=True, **GREEDY),
            log,
            priority=Priority.COMPLETION,
        )
    )
    await until(lambda: scheduler.stats()["queued"] == ["chat"], "the chat to yield the slot")
    assert await scheduler.cancel("chat")
    await asyncio.gather(chat_task, completion)
    assert log.index("chat:abort") < log.index("complete:length")  # dropped at once, while the completion ran
    stats = scheduler.stats()
    assert (stats["preempted"], stats["resumed"], stats["dropped_while_queued"]) == (1, 0, 1)
    assert stats["running"] is None and stats["queued"] == []


async def test_latest_wins_cancels_the_previous_completion_for_the_same_key(engine):
    scheduler = Scheduler(engine)
    log: list[str] = []
    long = SamplingParams(max_tokens=60, ignore_eos=True, **GREEDY)
    first = asyncio.create_task(
        run(scheduler, engine, "first", code_ids(engine), long, log, priority=Priority.COMPLETION, latest_wins="doc-a")
    )
    await until(lambda: "first:token" in log, "the first completion to stream")
    short = SamplingParams(max_tokens=2, **GREEDY)
    other = asyncio.create_task(
        run(scheduler, engine, "other", code_ids(engine), short, log, priority=Priority.COMPLETION, latest_wins="doc-b")
    )
    await asyncio.sleep(0)
    second = await run(
        scheduler,
        engine,
        "second",
        code_ids(engine),
        SamplingParams(max_tokens=2, **GREEDY),
        log,
        priority=Priority.COMPLETION,
        latest_wins="doc-a",
    )
    await asyncio.gather(first, other)
    assert "first:abort" in log and log.count("first:token") < 60
    assert second.finish_reason in ("stop", "length")
    assert "other:abort" not in log  # another document's completion is not touched
    assert scheduler.stats()["superseded"] == 1
    assert engine.stats()["running"] is None
