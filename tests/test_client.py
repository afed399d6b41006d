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
        body = {
            "model": models["data"][0]["id"],
            "max_tokens": 4,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Say hi."}],
        }
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
        body = {
            "model": "x",
            "max_tokens": 500,
            "temperature": 0,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a long story."}],
        }
        stream = api.stream("/v1/chat/completions", body)
        async for event in stream:  # the role chunk opens the stream before the engine has it: wait for a token
            if event["choices"][0]["delta"].get("content"):
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


async def test_a_daemon_that_does_not_answer_is_daemon_gone(daemon):
    """No server on the port: every kind of call raises DaemonGone (a front end then finds the
    daemon again), never a transport library's own exception."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    api = client.Client(client.Daemon(f"http://127.0.0.1:{port}", daemon.token, 0, "", ""))
    try:
        with pytest.raises(client.DaemonGone):
            await api.get("/v1/models")
        with pytest.raises(client.DaemonGone):
            await api.post("/v1/chat/completions", {"messages": []})
        with pytest.raises(client.DaemonGone):
            [e async for e in api.stream("/v1/chat/completions", {"messages": []})]
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


# --- DaemonLink: the one rule for finding, starting and finding again ---------------------------


def link_watching(serve_args: list[str]) -> tuple[client.DaemonLink, list[str]]:
    begun: list[str] = []
    ignore = lambda _line: None  # noqa: E731
    return client.DaemonLink(serve_args, progress=client.Progress(begun.append, ignore, ignore)), begun


async def test_a_failed_start_is_not_repeated_but_a_daemon_is_still_found(monkeypatch, tmp_path, daemon):
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path / "empty"))
    link, begun = link_watching(["--model", str(tmp_path / "no-such-model.gguf"), "--port", "0"])
    try:
        with pytest.raises(client.DaemonError) as first:
            await link.ready()
        with pytest.raises(client.DaemonError) as again:  # within RETRY_AFTER_S: its error, no second start
            await link.ready()
        assert len(begun) == 1 and str(again.value) == str(first.value) and "status 2" in str(first.value)
        monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))  # a daemon is named now: looking finds it at once
        found = await link.ready()
        assert found.daemon.url == daemon.url and link.connected and len(begun) == 1
        assert link.model_id == "smollm2-135m-instruct" and link.context_length > 0
    finally:
        await link.close()


async def test_after_losing_a_daemon_a_link_waits_for_one_before_starting_one(monkeypatch, tmp_path, daemon):
    monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))
    link, begun = link_watching(["--model", str(tmp_path / "no-such-model.gguf"), "--port", "0"])
    try:
        await link.ready()
        link.mark_down()  # as after a request failed on the connection
        assert not link.connected
        monkeypatch.setenv("LINGCODE_HOME", str(tmp_path / "empty"))  # none named: as while one restarts
        waiting = asyncio.ensure_future(link.reconnect(lambda _attempt: None))
        await asyncio.sleep(client.START_AFTER_S / 3)
        monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))  # the daemon names itself again
        found = await asyncio.wait_for(waiting, 30)
        assert found.daemon.url == daemon.url and begun == []  # found within START_AFTER_S: nothing started
    finally:
        await link.close()
