"""lingcode.client, the front ends' way to the daemon: find it, start it, call it, stream from it."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from conftest import share_built_caches

from lingcode import client


@pytest.fixture
def home(monkeypatch, daemon):
    monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))
    return daemon.home


def test_finds_the_running_daemon(home, daemon):
    found = client.ensure_daemon()
    assert found.url == daemon.url and found.token == daemon.token
    assert found.pid == daemon.process.pid and client.is_healthy(found)


async def test_streams_chat_and_reports_errors_in_their_shape(home):
    api = client.Client(client.ensure_daemon())
    try:
        models = await api.get("/v1/models")
        body = {"model": models["data"][0]["id"], "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hi."}]}  # fmt: skip
        events = [e async for e in api.stream("/v1/chat/completions", body)]
        assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events)
        with pytest.raises(client.ErrorResponse) as error:
            await api.post("/v1/chat/completions", {**body, "n": 3})
        assert error.value.status == 400 and "n" in error.value.message
    finally:
        await api.aclose()


async def test_closing_a_stream_aborts_it_in_the_engine(home):
    api = client.Client(client.ensure_daemon())
    try:
        before = (await api.get("/v1/lingcode/stats"))["engine"]["aborted"]
        body = {"model": "x", "max_tokens": 500, "temperature": 0, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Write a long story."}]}  # fmt: skip
        stream = api.stream("/v1/chat/completions", body)
        async for _ in stream:
            break
        await stream.aclose()
        for _ in range(100):
            stats = await api.get("/v1/lingcode/stats")
            if stats["engine"]["running"] is None:
                break
            await asyncio.sleep(0.05)
        assert stats["engine"]["aborted"] == before + 1
    finally:
        await api.aclose()


def test_starts_a_daemon_when_none_runs(monkeypatch, tmp_path, model_path):
    monkeypatch.setenv("LINGCODE_HOME", str(share_built_caches(tmp_path)))
    assert client.read_daemon_file() is None
    progress: list[str] = []
    started = client.ensure_daemon(["--model", str(model_path), "--port", "0", "--device", "cpu"], progress.append)
    try:
        assert client.is_healthy(started)
        assert progress[0].startswith("starting the lingcode daemon")
        assert any("loading" in line for line in progress) and progress[-1].startswith("daemon ready")
        assert client.ensure_daemon() == started  # the second caller finds it, starts nothing
    finally:
        os.kill(started.pid, signal.SIGTERM)
        for _ in range(300):  # a clean exit removes daemon.json
            if not (tmp_path / "state" / "daemon.json").exists():
                break
            time.sleep(0.1)
        assert client.read_daemon_file() is None
