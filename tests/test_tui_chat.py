"""`lingcode chat` in a Pilot (App.run_test) against the session's real daemon and the real default model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from markdown_it import MarkdownIt
from textual.widgets import DataTable, Input, OptionList
from textual.widgets.markdown import MarkdownFence
from conftest import share_built_caches
from tui_support import SIZE, answered, chat_app, connected, finished_answers, idle, send, wait_until

from lingcode.client import DaemonLink, read_daemon_file
from lingcode.tui.app import ChatApp
from lingcode.tui.store import ChatStore, default_path
from lingcode.tui.tools.calls import Call
from lingcode.tui.tools.permissions import Permissions, Rule
from lingcode.tui.widgets.message import MessageView, NoteView
from lingcode.tui.widgets.permission import PermissionScreen
from lingcode.tui.widgets.sessions import SessionsScreen
from lingcode.tui.widgets.stats import StatsBar, answer_line
from lingcode.tui.widgets.tool_call import ToolCallView


@pytest.fixture
def home(monkeypatch, daemon):
    monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))
    return daemon.home


@pytest.fixture
def store(tmp_path):
    store = ChatStore(tmp_path / "chat.sqlite3")
    yield store
    store.close()


def notes(app) -> list[str]:
    return [note.source for note in app.query(NoteView)]


def static_text(widget) -> str:
    return str(widget.render())


async def test_a_question_streams_as_markdown_with_a_stats_line(home, store, tmp_path):
    app = chat_app(store, tmp_path, max_tokens=24)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        before = (await app.link.client.get("/v1/lingcode/stats"))["engine"]
        await send(pilot, "Write a Python function that reverses a string.")
        await answered(pilot)
        question, answer = store.messages(app.session.id)
        assert question.content == "Write a Python function that reverses a string."
        assert answer.role == "assistant" and answer.state == "done" and answer.content
        view = app.query(MessageView).last()
        assert view.text == answer.content and view.body.source == answer.content  # the final text, set again
        timings, usage = answer.stats["timings"], answer.stats["usage"]
        assert 0 < usage["completion_tokens"] <= 24 and timings["tokens_per_s"] > 0
        footer = static_text(view.query_one(".footer"))
        assert f"ttft {timings['ttft_ms']:.0f} ms" in footer and f"{timings['tokens_per_s']:.1f} tok/s" in footer
        assert f"{usage['completion_tokens']} tokens" in footer
        bar = app.query_one(StatsBar)
        assert static_text(bar.query_one("#context")).startswith(f"ctx {usage['total_tokens']}/8192")
        assert static_text(bar.query_one("#link")) == "● smollm2-135m-instruct"
        after = (await app.link.client.get("/v1/lingcode/stats"))["engine"]
        assert after["finished"] == before["finished"] + 1
        assert app.session.title == "Write a Python function that reverses a string."

        # The answer's code block is highlighted; a click copies it, and so does /copy.
        fence = view.query_one(MarkdownFence)
        assert "def " in fence.code
        await pilot.click(fence)
        assert app.clipboard == fence.code
        app.copy_to_clipboard("")
        await send(pilot, "/copy")
        await pilot.pause()
        assert app.clipboard == fence.code


async def test_the_coding_model_s_answer_is_a_python_block_that_runs(qwen_daemon, monkeypatch, store, tmp_path):
    """On Qwen2.5-Coder (the default's family): the answer's code shows as a highlighted python fence."""
    monkeypatch.setenv("LINGCODE_HOME", str(qwen_daemon.home))
    app = chat_app(store, tmp_path, max_tokens=200)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await send(pilot, "Write a Python function fizzbuzz(n) that returns 'Fizz', 'Buzz', 'FizzBuzz' or str(n).")
        await answered(pilot)
        answer = finished_answers(app)[-1]
        assert answer.state == "done", answer.error
        fence = app.query(MessageView).last().query_one(MarkdownFence)
        assert fence.lexer == "python"
        scope: dict = {}
        exec(fence.code, scope)
        assert [scope["fizzbuzz"](n) for n in (3, 5, 15, 7)] == ["Fizz", "Buzz", "FizzBuzz", "7"]
        assert static_text(app.query_one(StatsBar).query_one("#link")) == "● qwen2.5-coder-0.5b-instruct"


def test_the_stats_line_reads_the_daemons_timings():
    stats = {
        "timings": {"ttft_ms": 120.4, "tpot_ms": 8.0, "tokens_per_s": 125.0, "accept_length": 2.71},
        "usage": {"prompt_tokens": 300, "completion_tokens": 64, "prompt_tokens_details": {"cached_tokens": 280}},
    }
    assert answer_line(stats) == (
        "ttft 120 ms · 125.0 tok/s · 8.0 ms/tok · 2.71 accepted/step · 64 tokens · prompt 300 (280 cached)"
    )


async def test_esc_stops_the_answer_at_once_and_the_daemon_aborts_it(home, store, tmp_path):
    app = chat_app(store, tmp_path, max_tokens=4000)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        before = (await app.link.client.get("/v1/lingcode/stats"))["engine"]
        await send(pilot, "Write a long story about a dragon who learns to code.")
        await wait_until(pilot, lambda: len(app.query(MessageView).last().text) > 10, "some of the answer")
        await pilot.press("escape")
        await wait_until(pilot, lambda: idle(app), "the answer to stop")
        for _ in range(100):
            engine = (await app.link.client.get("/v1/lingcode/stats"))["engine"]
            if engine["running"] is None:
                break
            await asyncio.sleep(0.05)
        assert engine["aborted"] == before["aborted"] + 1 and engine["finished"] == before["finished"]
        assert engine["last_request"]["finish_reason"] == "abort"
        answer = store.messages(app.session.id)[-1]
        view = app.query(MessageView).last()
        assert answer.state == "stopped" and answer.content == view.text  # everything shown was stored
        assert engine["last_request"]["generated_tokens"] < 4000
        assert "stopped" in static_text(view.query_one(".footer"))


async def test_resuming_shows_the_session_and_continues_it(home, store, tmp_path):
    async with chat_app(store, tmp_path, max_tokens=8).run_test(size=SIZE) as pilot:
        await connected(pilot)
        await send(pilot, "Name a color.")
        await answered(pilot)
        first = pilot.app.session.id
    resumed = chat_app(store, tmp_path, max_tokens=8, resume="last")
    async with resumed.run_test(size=SIZE) as pilot:
        await connected(pilot)
        assert resumed.session.id == first
        shown = [(v.role, v.text) for v in resumed.query(MessageView)]
        assert shown == [(m.role, m.content) for m in store.messages(first)]
        await send(pilot, "Name another one.")
        await answered(pilot, count=2)
        roles = [m.role for m in store.messages(first)]
        assert roles == ["user", "assistant", "user", "assistant"]
        # The second turn's prompt holds the first turn: the daemon reused its cached prefix.
        usage = store.messages(first)[-1].stats["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0


async def test_slash_commands_complete_in_the_input_and_act(home, store, tmp_path):
    app = chat_app(store, tmp_path, max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        app.prompt.input.insert("/he")
        await pilot.pause()
        menu = app.query_one("#completions", OptionList)
        assert menu.display and menu.get_option_at_index(0).id == "/help"
        await pilot.press("tab")
        assert app.prompt.input.text == "/help" and not menu.display
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("/sessions" in n for n in notes(app)), "the help note")
        assert app.prompt.input.text == ""
        # Each command is one row of two cells: `/agent [on|off]` is not split at its |.
        help_note = next(n for n in notes(app) if "/sessions" in n)
        tokens = MarkdownIt("gfm-like").parse(help_note)
        rows = [
            [t.children[0].content if t.children else "" for t in tokens[i:] if t.type == "inline"][:2]
            for i, t in enumerate(tokens)
            if t.type == "tr_open"
        ]
        assert [
            "/agent [on|off]",
            "toggle agent mode: the model may read, edit and run commands (asking first)",
        ] in rows

        await send(pilot, "/system Answer in one word.")
        await pilot.pause()
        assert app.session.system == "Answer in one word."
        await send(pilot, "/agent")
        await pilot.pause()
        assert app.session.agent and "agent mode" in app.sub_title
        await send(pilot, "/agent off")
        await send(pilot, "Hello?")
        await answered(pilot)
        session = app.session
        first_answer = store.messages(session.id)[-1]
        await pilot.press("ctrl+r")  # /retry: the last message is answered again, in place of its answer
        await wait_until(pilot, lambda: store.messages(session.id)[-1].id != first_answer.id, "the new answer")
        await answered(pilot)
        assert [m.role for m in store.messages(session.id)] == ["user", "assistant"]
        await send(pilot, "/clear")
        await pilot.pause()
        assert app.session.context_start == store.messages(session.id)[-1].id
        assert not app.query(MessageView)  # the view starts over; the history stays
        assert len(store.messages(session.id)) == 2
        await send(pilot, f"/export {tmp_path / 'out.md'}")
        await pilot.pause()
        assert "Hello?" in (tmp_path / "out.md").read_text()
        await send(pilot, "/stats")
        await wait_until(pilot, lambda: "| engine.requests |" in notes(app)[-1], "the stats note")
        assert notes(app)[-1].startswith("**This session**\n\n1 answers; mean ")
        await send(pilot, "/frobnicate")
        await pilot.pause()
        assert "unknown command /frobnicate; /help lists the commands" in notes(app)[-1]
        assert app.prompt.input.text == "/frobnicate"  # kept, to fix the typo
        app.prompt.clear()
        await send(pilot, "/new")
        await pilot.pause()
        assert app.session is None and not app.query(MessageView)

        await send(pilot, "/sessions")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")
        table = app.screen.query_one(DataTable)
        assert table.row_count == 1
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.session is not None and app.session.id == session.id, "the session to open")


async def test_the_sessions_screen_renames_exports_and_deletes(home, store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    keep, drop = store.create(title="keep me"), store.create(title="drop me")
    store.add(drop.id, "user", "bye")
    app = chat_app(store, tmp_path, resume=drop.id)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")
        await pilot.press("r")
        await wait_until(pilot, lambda: app.screen.query(Input), "the rename dialog")
        app.screen.query_one(Input).value = "renamed"
        await pilot.press("enter")
        await wait_until(pilot, lambda: store.get(drop.id).title == "renamed", "the new title")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")
        await pilot.press("e")
        await wait_until(pilot, lambda: (tmp_path / f"lingcode-session-{drop.id}.md").exists(), "the export")
        assert "## You\n\nbye" in (tmp_path / f"lingcode-session-{drop.id}.md").read_text()
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await wait_until(pilot, lambda: store.get(drop.id) is None, "the deletion")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, SessionsScreen), "the chat screen")
        assert app.session is None and [s.id for s in store.sessions()] == [keep.id]  # the open one was deleted


async def test_the_palette_offers_the_same_commands(home, store, tmp_path):
    app = chat_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert {"/new", "/sessions", "/system", "/model", "/clear", "/stats", "/export", "/agent", "/help"} <= titles
        await connected(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        for key in "/model":
            await pilot.press(key)
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("Serving **smollm2-135m-instruct**" in n for n in notes(app)), "/model")
        assert "context 8192 tokens" in notes(app)[-1]


async def test_at_path_attaches_the_file_and_too_long_a_prompt_is_refused_not_cut(home, store, tmp_path):
    (tmp_path / "notes.txt").write_text("The secret word is pineapple.\n")
    (tmp_path / "big.txt").write_text("word " * 40_000)  # ~40k tokens: over the model's 8192
    app = chat_app(store, tmp_path, max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        app.prompt.input.insert("What does @no")
        await pilot.pause()
        assert app.query_one("#completions", OptionList).get_option_at_index(0).id == "@notes.txt"
        await pilot.press("tab")
        assert app.prompt.input.text == "What does @notes.txt "
        app.prompt.input.insert("say?")
        await pilot.press("enter")
        await answered(pilot)
        question, answer = store.messages(app.session.id)
        assert question.attachments == [{"path": "notes.txt", "text": "The secret word is pineapple.\n"}]
        assert answer.stats["usage"]["prompt_tokens"] > 20  # the file's text went to the model

        await send(pilot, "Summarize @big.txt")
        await answered(pilot, count=2)
        failed = store.messages(app.session.id)[-1]
        assert failed.state == "error" and "maximum context length is 8192 tokens" in failed.error
        assert "does not fit the model's context" in notes(app)[-1] and "nothing was cut" in notes(app)[-1]
        assert store.messages(app.session.id)[-2].content == "Summarize @big.txt"  # the message is kept


async def test_tool_calls_ask_first_and_run_only_when_allowed(home, store, tmp_path):
    """Tool calls handed to the UI as the model's message (the daemon's tool calling is issue 6)."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "app.py").write_text("x = 1\n")
    rules = tmp_path / "permissions.toml"
    rules.write_text('[[rule]]\ntool = "run_command"\nmatch = "rm *"\naction = "deny"\n')
    # max_tokens=1: after the tools ran, the model is asked again, and must not get as far as a call of its own
    app = chat_app(store, workdir, permissions=Permissions.load(rules), agent=True, max_tokens=1)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)

        def edit(call_id: str, old: str, new: str) -> Call:
            return Call(call_id, "apply_edit", json.dumps({"path": "app.py", "old_text": old, "new_text": new}))

        # yes: the edit is made, its diff is the result
        await app.receive_tool_calls([edit("c1", "x = 1", "x = 2")])
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen), "the permission prompt")
        assert app.screen.tool == "apply_edit" and "+x = 2" in app.screen.preview[1]
        await pilot.press("y")
        await wait_until(pilot, lambda: idle(app), "the agent loop")
        assert (workdir / "app.py").read_text() == "x = 2\n"
        results = [m for m in store.messages(app.session.id) if m.role == "tool"]
        assert results[-1].tool_call_id == "c1" and "-x = 1\n+x = 2" in results[-1].content

        # no: nothing changes, the later call is skipped, and the turn goes back to the person
        await app.receive_tool_calls([edit("c2", "x = 2", "x = 3"), Call("c3", "list_dir", "{}")])
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen), "the permission prompt")
        await pilot.press("n")
        await wait_until(pilot, lambda: idle(app), "the agent loop")
        assert (workdir / "app.py").read_text() == "x = 2\n"
        results = {m.tool_call_id: m.content for m in store.messages(app.session.id) if m.role == "tool"}
        assert results["c2"].startswith("denied: the person declined")
        assert results["c3"].startswith("skipped")
        assert "Declined" in notes(app)[-1]

        # always: this call and later ones of the tool run without asking; deny rules still refuse
        await app.receive_tool_calls([Call("c4", "run_command", json.dumps({"command": "echo one > out.txt"}))])
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen), "the permission prompt")
        await pilot.press("a")
        await wait_until(pilot, lambda: idle(app), "the agent loop")
        await app.receive_tool_calls(
            [
                Call("c5", "run_command", json.dumps({"command": "echo two >> out.txt"})),
                Call("c6", "run_command", json.dumps({"command": "rm out.txt"})),
                Call("c7", "read_file", json.dumps({"path": "out.txt"})),
            ]
        )
        await wait_until(pilot, lambda: idle(app), "the agent loop")
        assert not isinstance(app.screen, PermissionScreen)
        assert (workdir / "out.txt").read_text() == "one\ntwo\n"
        results = {m.tool_call_id: m.content for m in store.messages(app.session.id) if m.role == "tool"}
        assert results["c5"] == "exit code 0\n" and results["c6"].startswith("denied by rule 1")
        assert "one" in results["c7"] and store.get(app.session.id).always_allow == ["run_command"]
        blocks = {view.call.id: view for view in app.query(ToolCallView)}
        assert blocks["c1"].has_class("ok") and blocks["c2"].has_class("denied") and blocks["c1"].collapsed


async def test_the_agents_grep_and_commands_keep_to_the_rules(home, store, tmp_path):
    """Issue 18, items 3 and 4, as the model's calls reach the app: grep neither follows a link out of
    the project nor reads what a rule denies, and an allowed command does not allow what is chained to it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOKEN=outside\n")
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / ".env").write_text("TOKEN=dotenv\n")
    (workdir / "app.py").write_text("TOKEN = None\n")
    (workdir / "notes.txt").symlink_to("../outside/secret.txt")
    os.mkfifo(workdir / "pipe")  # grep must not block on it
    rules = tmp_path / "permissions.toml"
    rules.write_text(
        '[[rule]]\ntool = "*"\nmatch = ".env*"\naction = "deny"\n'
        '[[rule]]\ntool = "run_command"\nmatch = "echo hi*"\naction = "allow"\n'
    )
    rules.chmod(0o600)
    app = chat_app(store, workdir, permissions=Permissions.load(rules), agent=True, max_tokens=1)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)

        def results() -> dict:
            return {m.tool_call_id: m.content for m in store.messages(app.session.id) if m.role == "tool"}

        await app.receive_tool_calls(
            [
                Call("g1", "grep", json.dumps({"pattern": "TOKEN"})),
                Call("c1", "run_command", json.dumps({"command": "echo hi"})),
            ]
        )
        await wait_until(pilot, lambda: idle(app) and "c1" in results(), "the agent loop")
        assert not isinstance(app.screen, PermissionScreen)  # a grep inside and an allowed command: no question
        grep = results()["g1"]
        assert "app.py:1: TOKEN = None" in grep and "dotenv" not in grep and "TOKEN=outside" not in grep
        assert "denied" not in grep and "deny them" in grep and "notes.txt; read_file asks" in grep
        assert results()["c1"] == "exit code 0\nhi\n"

        # The allowed command with another chained to it: asked, declined, not run.
        await app.receive_tool_calls([Call("c2", "run_command", json.dumps({"command": "echo hi; touch pwned"}))])
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen), "the permission prompt")
        assert app.screen.tool == "run_command"
        await pilot.press("n")
        await wait_until(pilot, lambda: idle(app), "the agent loop")
        assert not (workdir / "pwned").exists() and results()["c2"].startswith("denied: the person declined")

        # read_file of the link grep held back asks, as grep said it would; the denied file is denied.
        await app.receive_tool_calls(
            [
                Call("r1", "read_file", json.dumps({"path": ".env"})),
                Call("r2", "read_file", json.dumps({"path": "notes.txt"})),
            ]
        )
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen), "the permission prompt")
        assert app.screen.tool == "read_file" and "outside" in app.screen.subject
        await pilot.press("n")
        await wait_until(pilot, lambda: idle(app), "the agent loop")
        assert results()["r1"].startswith("denied by rule 1") and "TOKEN" not in results()["r2"]


async def test_a_symlink_loop_is_a_tool_error_and_a_folder_rule_covers_its_files(home, store, tmp_path):
    """Issue 62, items 3 and 7, as the model's calls reach the app: with l1 -> l2 -> l1 in the project the
    turn ended in an internal error and no tool result; a rule on `secrets` let grep and read_file in it."""
    workdir = tmp_path / "project"
    (workdir / "secrets").mkdir(parents=True)
    (workdir / "secrets" / "key.txt").write_text("TOKEN=secret\n")
    (workdir / "app.py").write_text("TOKEN = None\n")
    (workdir / "l2").symlink_to("l1")
    (workdir / "l1").symlink_to("l2")
    rules = tmp_path / "permissions.toml"
    rules.write_text('[[rule]]\ntool = "*"\nmatch = "secrets"\naction = "deny"\n')
    rules.chmod(0o600)
    app = chat_app(store, workdir, permissions=Permissions.load(rules), agent=True, max_tokens=1)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)

        def tool_results() -> dict:
            return {m.tool_call_id: m.content for m in store.messages(app.session.id) if m.role == "tool"}

        await app.receive_tool_calls(
            [
                Call("g1", "grep", json.dumps({"pattern": "TOKEN"})),
                Call("d1", "list_dir", json.dumps({"path": "."})),
                Call("r1", "read_file", json.dumps({"path": "l1"})),
                Call("r2", "read_file", json.dumps({"path": "secrets/key.txt"})),
                Call("w1", "write_file", json.dumps({"path": "l2", "content": ""})),
            ]
        )
        await wait_until(pilot, lambda: idle(app) and len(tool_results()) == 5, "the agent loop")
        results = tool_results()
        assert not isinstance(app.screen, PermissionScreen) and not any("internal error" in n for n in notes(app))
        assert "app.py:1: TOKEN = None" in results["g1"] and "TOKEN=secret" not in results["g1"]
        assert "1 files not searched: the permission rules deny them" in results["g1"]
        assert "l1 (a loop of symbolic links)" in results["g1"]
        assert "l1  (a loop of symbolic links)" in results["d1"]
        assert results["r1"] == "error: l1: a loop of symbolic links"
        assert results["r2"].startswith("denied by rule 1")
        assert results["w1"] == "error: l2: a loop of symbolic links"  # found before the person is asked


async def test_the_agent_loop_runs_the_models_tool_calls(home, store, tmp_path, monkeypatch):
    """Needs tool calling in the daemon (issue 6); until the daemon has it, it refuses `tools` and this is skipped.

    The 135M default model does not call tools on its own, so the first request asks for
    tool_choice "required" (the daemon's constrained decoding); the loop then runs as it always does.
    """
    import lingcode.tui.app as chat

    def first_call_required(*args, **kwargs):
        body = request_body(*args, **kwargs)
        if not forced:
            body["tool_choice"] = "required"
            forced.append(body)
        return body

    forced: list[dict] = []
    request_body = chat.request_body
    monkeypatch.setattr(chat, "request_body", first_call_required)
    (tmp_path / "hello.txt").write_text("hello\n")
    no_writes = Permissions([Rule(tool, "*", "deny") for tool in ("apply_edit", "write_file", "run_command")])
    app = chat_app(store, tmp_path, agent=True, max_tokens=48, permissions=no_writes)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await send(pilot, "List the files in the current directory.")
        await answered(pilot)
        first = finished_answers(app)[0]
        assert first.state == "done" and first.tool_calls, first.error
        messages = store.messages(app.session.id)
        results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
        assert [call["id"] for call in first.tool_calls] == list(results)[: len(first.tool_calls)]
        assert {view.call.id for view in app.query(ToolCallView)} >= set(results)
        assert len(finished_answers(app)) >= 2  # the loop sent the results back and the model answered again
        assert forced[0]["tools"]


def stop_daemon(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while read_daemon_file() is not None and time.monotonic() < deadline:  # a clean exit removes daemon.json
        time.sleep(0.1)


async def test_no_daemon_starts_one_and_a_lost_daemon_loses_no_message(monkeypatch, store, tmp_path, model_path):
    """Its own daemons, in an empty LINGCODE_HOME: started by the chat, stopped under it, started again."""
    monkeypatch.setenv("LINGCODE_HOME", str(share_built_caches(tmp_path / "home")))
    link = DaemonLink(["--model", str(model_path), "--port", "0", "--device", "cpu"])
    app = ChatApp(link=link, store=store, workdir=tmp_path, permissions=Permissions([]), max_tokens=4, temperature=0)
    started: list[int] = []
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: link.connected, "the chat to start a daemon", timeout=180)
            started.append(link.daemon.pid)
            # The link connects first; the app writes "connected" when it handles that, a message later.
            await wait_until(pilot, lambda: "connected:" in notes(app)[0], "the note to say it connected")
            progress = notes(app)[0]
            assert progress.startswith("**Starting the daemon**") and "starting the lingcode daemon" in progress
            assert "connected: smollm2-135m-instruct, context 8192 tokens" in progress
            await send(pilot, "Hi")
            await answered(pilot)

            stop_daemon(started[0])
            link_text = lambda: static_text(app.query_one(StatsBar).query_one("#link"))  # noqa: E731
            await send(pilot, "Hello again")
            await wait_until(pilot, lambda: link_text().startswith("daemon unreachable"), "the trouble status")
            assert not app.answering  # nothing hangs while it reconnects
            await wait_until(pilot, lambda: link.connected, "a new daemon", timeout=180)
            started.append(link.daemon.pid)
            await answered(pilot, count=3)
            messages = store.messages(app.session.id)
            assert [(m.role, m.state) for m in messages] == [
                ("user", "done"),
                ("assistant", "done"),
                ("user", "done"),
                ("assistant", "error"),
                ("assistant", "done"),
            ]
            assert messages[2].content == "Hello again" and "lost the daemon" in messages[3].error
            assert started[1] != started[0] and link_text() == "● smollm2-135m-instruct"
    finally:
        for pid in started:
            stop_daemon(pid)


async def test_a_damaged_history_is_moved_aside_and_the_chat_says_so(monkeypatch, tmp_path, daemon):
    """The store `lingcode chat` opens (the default path) holds garbage: the chat starts anyway, on a new one."""
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path / "home"))  # a home of its own for the store
    damaged = default_path()
    damaged.write_bytes(b"this is not an SQLite database " * 100)
    store = ChatStore()  # as tui/launch.py opens it
    # The chat itself connects to the session's daemon: in a home without one it would start one.
    monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))
    app = chat_app(store, tmp_path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(
                pilot, lambda: any("was damaged" in n for n in notes(app)), "the note on the damaged history"
            )
            [note] = [n for n in app.query(NoteView) if "was damaged" in n.source]
            [aside] = damaged.parent.glob("chat.sqlite3.damaged-*")
            assert str(aside) in note.source and "new, empty history" in note.source and note.has_class("error")
            await connected(pilot)
            await send(pilot, "still here")  # the new store takes the conversation
            await answered(pilot)
            assert [m.role for m in store.messages(app.session.id)] == ["user", "assistant"]
    finally:
        store.close()


async def test_a_row_damaged_by_hand_is_reported_and_the_session_continues(home, tmp_path):
    """`lingcode chat -c` on a store whose always_allow reads `[}` (issue 18, item 9): it exited with a
    JSONDecodeError; now the session opens, the chat says what was damaged, and goes on."""
    path = tmp_path / "chat.sqlite3"
    store = ChatStore(path)
    session = store.create(title="earlier")
    store.update(session.id, always_allow=["grep"])
    store.add(session.id, "user", "first question")
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = path.read_bytes()
    path.write_bytes(data.replace(b'["grep"]', b'["grep"}'))
    store = ChatStore(path)
    app = chat_app(store, tmp_path, resume="last")  # what `lingcode chat -c` builds
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: any("damaged rows" in n for n in notes(app)), "the note on the damaged row")
            [note] = [n for n in app.query(NoteView) if "damaged rows" in n.source]
            assert "session 1: its always_allow cannot be read" in note.source and note.has_class("error")
            assert app.session.id == session.id and app.session.always_allow == []
            await connected(pilot)
            await send(pilot, "second question")
            await answered(pilot)
            assert [m.content for m in store.messages(session.id)][:2] == ["first question", "second question"]
    finally:
        store.close()
