"""The embedded engine in a process of its own (LINGCODE_ENGINE_PROCESS=1; lingcode.engine.local.process).

A real daemon started that way, against the session's default daemon (the engine in the daemon's
own process): the same greedy answers, a forced tool call (the grammar is compiled again in the
child), a client that leaves mid-stream (the child aborts, and the counters say so), and SIGTERM
(the daemon exits 0 and takes the child with it).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import serve, share_built_caches

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def isolated(model_path, tmp_path_factory):
    home = share_built_caches(tmp_path_factory.mktemp("engine-process-home"))
    started = serve(model_path, home, env={"LINGCODE_ENGINE_PROCESS": "1"})
    process = started.process
    yield process, started.url, started.token, started.log
    if process.poll() is None:
        process.kill()
        process.wait()


def _stats(url: str, token: str) -> dict:
    return httpx.get(f"{url}/v1/lingcode/stats", headers={"Authorization": f"Bearer {token}"}).json()["engine"]


def test_answers_as_the_engine_in_the_daemons_process(isolated, daemon):
    _, url, token, _ = isolated
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    answers = []
    for base, key in ((url, token), (daemon.url, daemon.token)):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key)
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=24, **GREEDY)
        streamed = client.chat.completions.create(model="m", messages=messages, max_tokens=24, stream=True, **GREEDY)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        answers.append((reply.choices[0].message.content, text, reply.usage.completion_tokens))
    assert answers[0] == answers[1]
    assert answers[0][0] == answers[0][1] and answers[0][2] == 24
    stats = _stats(url, token)
    assert stats["process"] != isolated[0].pid and stats["finished"] >= 2 and stats["running"] is None


def test_a_conversation_sends_the_child_only_its_new_ids(isolated, daemon):
    # Each turn goes to the child as the ids it shares with the turn before plus the rest: the
    # child must rebuild every prompt exactly (the same answers as the in-process engine), through
    # a grown conversation, an unrelated prompt in between, a retry and a shorter prompt.
    _, url, token, _ = isolated
    answers, sent = {}, []
    for base, key in ((url, token), (daemon.url, daemon.token)):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key)

        def ask(messages):
            before = _stats(url, token)["ids_sent"]
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=12, **GREEDY)
            if base == url:
                sent.append((_stats(url, token)["ids_sent"] - before, reply.usage.prompt_tokens))
            return reply.choices[0].message.content

        history = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
        got = []
        for turn in range(3):
            got.append(ask(history))
            history = history + [
                {"role": "assistant", "content": got[-1]},
                {"role": "user", "content": f"Now make it take {turn + 3} numbers."},
            ]
        got.append(ask([{"role": "user", "content": "Name three sorting algorithms."}]))
        got += [ask(history), ask(history), ask(history[:1])]
        answers[base] = got
    assert answers[url] == answers[daemon.url]
    # turns 2 and 3 send only their new turn; the retry and the shorter prompt, a prefix of the
    # request before, send nothing
    grown, retry = sent[1:3], sent[5]
    assert all(0 < new < prompt // 2 for new, prompt in grown), sent
    assert retry[0] == 0 and sent[6][0] == 0, sent
    assert sum(new for new, _ in sent) < sum(prompt for _, prompt in sent)


def test_a_forced_tool_call_is_constrained_in_the_child(isolated):
    _, url, token, _ = isolated
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=token)
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        tool_choice="required",
        max_tokens=64,
        **GREEDY,
    )
    call = reply.choices[0].message.tool_calls[0]
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the daemon's mappings in /proc")
def test_the_daemon_checks_a_requests_grammar_without_torch(isolated):
    # Only the child masks logits. The daemon compiles a grammar to check it, and importing torch
    # for that cost its first constrained request ~1.2 s.
    process, url, token, _ = isolated
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=token)
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "A JSON object, please."}],
        response_format={"type": "json_object"},
        max_tokens=16,
        **GREEDY,
    )
    assert reply.choices[0].message.content.lstrip().startswith("{")
    assert "libtorch" not in Path(f"/proc/{process.pid}/maps").read_text()


def test_a_client_that_leaves_aborts_the_request_in_the_child(isolated):
    _, url, token, _ = isolated
    before = _stats(url, token)
    body = {
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i == 4:
                break
    deadline = time.monotonic() + 30
    while (stats := _stats(url, token))["aborted"] == before["aborted"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stats["aborted"] == before["aborted"] + 1 and stats["running"] is None
    assert stats["generated_tokens"] - before["generated_tokens"] < 2000


def test_sigterm_stops_the_daemon_and_its_engine_process(isolated):
    process, url, token, log_path = isolated
    child = _stats(url, token)["process"]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, log_path.read_text()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_an_abort_that_comes_before_its_request_started_is_kept(model_path):
    """Aborts travel on a socket of their own, so one can arrive before its request was read: the
    request then ends at once ("abort", no tokens), and never runs."""
    import asyncio

    from lingcode.engine import SamplingParams
    from lingcode.engine.local.process import EngineProcess

    async def scenario() -> tuple[list, list, dict]:
        engine = EngineProcess.start(model_path, device="cpu")
        try:
            ids = engine.info.tokenizer.encode("def reverse(s):")
            params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
            first = engine.generate("long", ids, params)
            await anext(first)  # the child runs "long" now; "late" waits behind it in the request socket
            late = engine.generate("late", ids, params)
            late_next = asyncio.ensure_future(anext(late))
            await asyncio.sleep(0.05)  # its generate message is sent
            await engine.abort("late")
            await engine.abort("long")
            long_chunks = [c async for c in first]
            late_chunks = [await late_next] + [c async for c in late]
            return long_chunks, late_chunks, engine.stats()
        finally:
            await engine.close()

    long_chunks, late_chunks, stats = asyncio.run(scenario())
    assert long_chunks[-1].finish_reason == "abort"
    assert [(c.token_ids, c.finish_reason) for c in late_chunks] == [([], "abort")]
    assert stats["requests"] == 1 and stats["aborted"] == 1  # "late" never reached the engine


def test_a_request_the_socket_takes_only_in_part_arrives_whole(model_path, engine):
    """A request goes to the child in one send where the socket takes it whole, and the rest through
    the event loop where it does not: with a send buffer far smaller than a long prompt's message,
    the child must still run the prompt as sent (the in-process engine's greedy tokens)."""
    import asyncio
    import pickle
    import socket

    from lingcode.engine import SamplingParams
    from lingcode.engine.local.process import EngineProcess

    ids = (engine.info.tokenizer.encode("def double(x):\n    return x * 2\n" * 700) * 2)[:6000]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    async def tokens(source) -> list[int]:
        return [t async for chunk in source.generate("long-prompt", ids, params) for t in chunk.token_ids]

    async def scenario() -> tuple[list[int], int, dict]:
        child = EngineProcess.start(model_path, device="cpu")
        try:
            child._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            return await tokens(child), child._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF), child.stats()
        finally:
            await child.close()

    got, buffer, stats = asyncio.run(scenario())
    assert buffer < len(pickle.dumps(ids))  # the first send can take only part of it
    assert stats["ids_sent"] == len(ids) and stats["prompt_tokens"] == len(ids)
    assert got == asyncio.run(tokens(engine)) and len(got) == 4


def test_a_gpu_engine_gets_a_process_of_its_own_a_cpu_engine_does_not(monkeypatch):
    from lingcode.server.daemon import _engine_in_own_process

    monkeypatch.delenv("LINGCODE_ENGINE_PROCESS", raising=False)
    assert _engine_in_own_process("cpu") is False
    monkeypatch.setenv("LINGCODE_ENGINE_PROCESS", "1")
    assert _engine_in_own_process("cpu") is True
    monkeypatch.setenv("LINGCODE_ENGINE_PROCESS", "0")
    assert _engine_in_own_process("cuda") is False
