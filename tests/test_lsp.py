"""`lingcode lsp` driven over stdio by pytest-lsp's client, against the session's real daemon and model.

The server is a real `lingcode lsp` process; it finds the daemon through LINGCODE_HOME. Assertions
are on answers, error codes and counters (the LSP's `lingcode/stats` and the daemon's stats), never
on wall time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from conftest import share_built_caches
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

ROOT = Path("/tmp/lingcode-lsp-test-workspace")
PYTHON = 'def greet(name):\n    """Say hello."""\n    return "Hello, " + name\n\n\ndef main():\n    print(greet()\n'
MID_LINE = types.Position(7, len("    print(greet("))  # between "(" and ")": a one-line suggestion
# A list the model keeps extending line by line: a completion that runs until it is stopped.
COUNTING = "NUMBERS = [\n    1,\n    2,\n    3,\n    \n"
COUNTING_END = types.Position(4, 4)
REQUEST_CANCELLED = -32800


async def start_lsp(
    home: Path, *args: str, options: dict | None = None, editor: str = "visual-studio-code"
) -> tuple[LanguageClient, types.InitializeResult]:
    config = ClientServerConfig(
        server_command=[sys.executable, "-m", "lingcode", "lsp", *args],
        server_env={**os.environ, "LINGCODE_HOME": str(home)},
    )
    client = await config.start()
    result = await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(editor),
            root_uri=ROOT.as_uri(),
            initialization_options=options,
        )
    )
    return client, result


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def lsp(daemon):
    # No time budget and room for long answers: a multi-line completion runs until it is stopped.
    client, _ = await start_lsp(daemon.home, "--no-start", options={"maxTokens": 200, "timeBudgetMs": None})
    yield client
    await client.shutdown_session()
    await client.stop()


@pytest.fixture
async def api(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"}) as http:
        yield http


async def daemon_stats(api) -> dict:
    return (await api.get("/v1/lingcode/stats")).json()


async def wait_engine(api, running: bool, timeout_s: float = 60.0) -> dict:
    """Daemon stats once the engine is (or is no longer) running a request: a bound, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = await daemon_stats(api)
        if (now["engine"]["running"] is not None) == running and (running or not now["scheduler"]["queued"]):
            return now
        assert time.monotonic() < deadline, f"engine running={now['engine']['running']}, wanted running={running}"
        await asyncio.sleep(0.01)


async def lsp_stats(client: LanguageClient):
    return await client.protocol.send_request_async("lingcode/stats", None)


_documents = iter(range(1_000_000))


def open_document(client: LanguageClient, text: str) -> str:
    """A new document; PYTHON gets a first line of its own, so that no cached suggestion fits it."""
    n = next(_documents)
    uri = (ROOT / f"doc_{n}.py").as_uri()
    if text == PYTHON:
        text = f"# document {n}\n{text}"
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text)))
    return uri


def type_text(client: LanguageClient, uri: str, at: types.Position, text: str, version: int) -> None:
    change = types.TextDocumentContentChangePartial(range=types.Range(at, at), text=text)
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(uri=uri, version=version), [change])
    )


def inline_params(uri: str, at: types.Position) -> types.InlineCompletionParams:
    context = types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)
    return types.InlineCompletionParams(context, types.TextDocumentIdentifier(uri), at)


async def suggestions(client: LanguageClient, uri: str, at: types.Position) -> list[str]:
    result = await client.text_document_inline_completion_async(inline_params(uri, at))
    items = result.items if isinstance(result, types.InlineCompletionList) else result or []
    return [item.insert_text for item in items]


# --- the protocol -----------------------------------------------------------------------------


async def test_an_inline_completion_comes_back_and_is_logged(lsp):
    uri = open_document(lsp, PYTHON)
    [text] = await suggestions(lsp, uri, MID_LINE)
    assert text and "\n" not in text  # mid-line: one line
    logged = [m.message for m in lsp.log_messages if "prompt tokens" in m.message]
    assert logged and "cached" in logged[-1] and "ttft" in logged[-1] and "total" in logged[-1]
    stats = await lsp_stats(lsp)
    assert stats.engine_calls >= 1 and stats.last.prompt_tokens > 0


async def test_capabilities_settings_and_bad_settings(daemon):
    client, result = await start_lsp(daemon.home, "--no-start", editor="neovim", options={"maxTokens": "many"})
    await client.shutdown_session()
    await client.stop()
    capabilities = result.capabilities
    assert capabilities.inline_completion_provider is not None  # registered with InlineCompletionOptions
    assert capabilities.completion_provider is not None
    assert capabilities.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    warnings = [m.message for m in client.log_messages if m.type == types.MessageType.Warning]
    assert any("maxTokens" in w and "not valid" in w for w in warnings)


async def test_a_completion_item_holds_the_same_suggestion(lsp):
    uri = open_document(lsp, PYTHON)
    [inline] = await suggestions(lsp, uri, MID_LINE)
    result = await lsp.text_document_completion_async(
        types.CompletionParams(types.TextDocumentIdentifier(uri), MID_LINE)
    )
    assert result.is_incomplete and len(result.items) == 1
    item = result.items[0]
    assert item.text_edit.new_text == inline  # no word before the cursor: the suggestion itself
    assert item.text_edit.range.end == MID_LINE


async def test_with_a_popup_item_selected_the_suggestion_extends_it(lsp):
    uri = open_document(lsp, PYTHON)
    selected = types.SelectedCompletionInfo(range=types.Range(MID_LINE, MID_LINE), text="name")
    context = types.InlineCompletionContext(types.InlineCompletionTriggerKind.Automatic, selected)
    result = await lsp.text_document_inline_completion_async(
        types.InlineCompletionParams(context, types.TextDocumentIdentifier(uri), MID_LINE)
    )
    assert len(result.items) == 1
    item = result.items[0]
    assert item.insert_text.startswith("name") and item.range == selected.range


async def test_ghost_text_and_popup_for_the_same_keystroke_share_one_engine_call(lsp):
    uri = open_document(lsp, PYTHON)
    before = await lsp_stats(lsp)
    popup = lsp.text_document_completion_async(types.CompletionParams(types.TextDocumentIdentifier(uri), MID_LINE))
    [inline], completion = await asyncio.gather(suggestions(lsp, uri, MID_LINE), popup)
    assert completion.items[0].text_edit.new_text == inline
    after = await lsp_stats(lsp)
    assert after.engine_calls == before.engine_calls + 1 and after.shared == before.shared + 1
    assert after.superseded == before.superseded


async def test_a_document_neither_open_nor_on_disk_gets_no_suggestion_and_no_error(lsp):
    uri = (ROOT / "never-opened.py").as_uri()
    assert await suggestions(lsp, uri, types.Position(0, 0)) == []
    assert any("cannot complete" in m.message for m in lsp.log_messages)


# --- latency design ---------------------------------------------------------------------------


async def test_a_typed_ahead_hit_makes_no_engine_call(lsp, api):
    uri = open_document(lsp, PYTHON)
    [text] = await suggestions(lsp, uri, MID_LINE)
    assert len(text) >= 2
    before, engine_before = await lsp_stats(lsp), (await daemon_stats(api))["engine"]["requests"]
    type_text(lsp, uri, MID_LINE, text[0], version=2)
    typed = types.Position(MID_LINE.line, MID_LINE.character + 1)
    assert await suggestions(lsp, uri, typed) == [text[1:]]
    after = await lsp_stats(lsp)
    assert after.cache_hits == before.cache_hits + 1 and after.engine_calls == before.engine_calls
    assert (await daemon_stats(api))["engine"]["requests"] == engine_before


async def test_typing_one_character_prefills_only_the_tail(lsp):
    uri = open_document(lsp, PYTHON)
    [text] = await suggestions(lsp, uri, MID_LINE)
    other = "z" if not text.startswith("z") else "q"  # not along the suggestion: the engine is asked
    type_text(lsp, uri, MID_LINE, other, version=2)
    before = await lsp_stats(lsp)
    await suggestions(lsp, uri, types.Position(MID_LINE.line, MID_LINE.character + 1))
    after = await lsp_stats(lsp)
    assert after.engine_calls == before.engine_calls + 1
    assert after.last.prompt_tokens > 40 and after.last.prefilled_tokens <= 3


async def test_did_change_is_handled_and_cancel_reaches_the_engine(lsp, api):
    uri = open_document(lsp, COUNTING)
    before = await lsp_stats(lsp)
    request = asyncio.ensure_future(
        lsp.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, COUNTING_END), msg_id="long-one"
        )
    )
    await wait_engine(api, running=True)
    # While the completion runs: an edit is applied and another request is answered.
    type_text(lsp, uri, types.Position(0, 0), "# numbers\n", version=2)
    stats = await lsp_stats(lsp)
    assert not request.done()
    assert {"uri": uri, "version": 2} in [{"uri": d.uri, "version": d.version} for d in stats.documents]

    lsp.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="long-one"))
    with pytest.raises(JsonRpcException) as error:
        await request
    assert error.value.code == REQUEST_CANCELLED
    idle = await wait_engine(api, running=False)  # freed: nothing runs or waits
    last = idle["engine"]["last_request"]
    assert last["finish_reason"] == "abort" and last["steps_after_abort"] <= 1 and last["generated_tokens"] < 200
    assert (await lsp_stats(lsp)).cancelled == before.cancelled + 1


async def test_latest_wins_a_new_request_for_the_document_aborts_the_running_one(lsp, api):
    uri = open_document(lsp, COUNTING)
    before, aborted_before = await lsp_stats(lsp), (await daemon_stats(api))["engine"]["aborted"]
    first = asyncio.ensure_future(suggestions(lsp, uri, COUNTING_END))
    await wait_engine(api, running=True)
    type_text(lsp, uri, COUNTING_END, "print()", version=2)  # the user typed on: now mid-line, one line
    second = await suggestions(lsp, uri, types.Position(COUNTING_END.line, COUNTING_END.character + len("print(")))
    assert await first == []  # the stale request answers nothing
    assert len(second) <= 1
    after = await lsp_stats(lsp)
    assert after.superseded == before.superseded + 1
    idle = await wait_engine(api, running=False)
    assert idle["engine"]["aborted"] >= aborted_before + 1  # the long one was stopped in the engine


# --- auto-start -------------------------------------------------------------------------------


async def test_without_a_daemon_it_starts_one_and_reports_progress(tmp_path, model_path):
    home = share_built_caches(tmp_path / "home")
    client, _ = await start_lsp(home, "--model", str(model_path), "--device", "cpu", "--port", "0")
    daemon_file = home / "state" / "daemon.json"
    try:
        assert not daemon_file.exists()  # initialize was answered before the model loaded
        uri = open_document(client, PYTHON)
        assert await suggestions(client, uri, MID_LINE)  # the request waited for the new daemon
        assert daemon_file.exists()
        [reports] = client.progress_reports.values()
        kinds = [getattr(r, "kind", None) for r in reports]
        assert kinds[0] == "begin" and kinds[-1] == "end"
        messages = [r.message for r in reports]
        assert any("loading" in m for m in messages) and "ready" in messages[-1]
    finally:
        await client.shutdown_session()
        await client.stop()
        if daemon_file.exists():  # the daemon is detached: it outlives the LSP; stop it here
            import json

            os.kill(json.loads(daemon_file.read_text())["pid"], signal.SIGTERM)
            deadline = time.monotonic() + 60
            while daemon_file.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        assert not daemon_file.exists()


# --- the benchmark tool -------------------------------------------------------------------------


def test_bench_lsp_replays_keystrokes_and_writes_its_table(daemon, tmp_path):
    import json
    import subprocess

    env = {**os.environ, "LINGCODE_HOME": str(daemon.home)}
    command = [
        sys.executable,
        "-m",
        "lingcode",
        "bench",
        "lsp",
        "--chars",
        "4",
        "--start-line",
        "10",
        "--out",
        str(tmp_path),
    ]
    # A daemon is running (the session's): measuring it needs saying so, as its options are its own.
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "already running" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "lsp.json").exists()
    run = subprocess.run([*command, "--reuse-daemon"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert daemon.process.poll() is None  # a daemon it did not start is left running
    result = json.loads((tmp_path / "lsp.json").read_text())
    assert len(result["keystrokes"]) == 4 and result["summary"]["keystrokes"] == 4
    summary = result["summary"]
    assert summary["typed_ahead_hits"] + summary["engine_calls"] == 4
    table = (tmp_path / "lsp.md").read_text()
    assert "typed-ahead hits" in table and "tokens prefilled per engine call" in table

    missing = subprocess.run(
        [*command[:5], "--file", str(tmp_path / "nope.py"), "--reuse-daemon"], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "is not a file" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("editor", ["visual-studio-code", "neovim"])
def test_the_early_initialize_answer_is_pygls_own(editor):
    """`initialize` is answered before pygls is imported (lsp/early.py); a server that gets another
    message first lets pygls answer it. Both answers must be the same, for real editors' capabilities."""
    import json
    import subprocess

    from lingcode.bench.startup import receive, send
    from pygls.protocol import default_converter

    capabilities = default_converter().unstructure(client_capabilities(editor))
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"processId": None, "rootUri": ROOT.as_uri(), "capabilities": capabilities},
    }
    answers, logs = [], []
    for before in ([], [{"jsonrpc": "2.0", "method": "$/setTrace", "params": {"value": "off"}}]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "lingcode", "lsp", "--no-start"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for message in [*before, initialize, {"jsonrpc": "2.0", "id": 2, "method": "shutdown"}]:
            send(proc, message)
        messages = [receive(proc), receive(proc)]
        send(proc, {"jsonrpc": "2.0", "method": "exit"})
        proc.stdin.close()
        proc.wait(timeout=30)
        assert [m.get("id") for m in messages] == [1, 2], messages
        answers.append(json.dumps(messages[0]["result"], sort_keys=True))
        logs.append(proc.stderr.read().decode())
    assert answers[0] == answers[1]
    assert "answered early" not in logs[0], logs[0]
