"""`lingcode chat`: the Textual app that joins the widgets, the session store and the daemon.

The answer loop is `answer()`: stream one reply into the chat (each fragment stored before it is
shown), and in agent mode run the tool calls it asks for (asking the person first where the rules
say so), then ask the model again. Esc cancels the loop wherever it is; cancelling closes the
stream, which makes the daemon abort the request in the engine. Daemon trouble never reaches the
person as a crash: the message stays, the status line says what is happening, and the answer
starts once a daemon answers again.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header

from lingcode.client import DaemonError, DaemonLink, ErrorResponse, Progress
from lingcode.tui import commands
from lingcode.tui.attachments import AttachError, attach
from lingcode.tui.commands import CommandActions, UnknownCommand
from lingcode.tui.conversation import (
    INTERRUPTED_RESULT,
    Reply,
    context_used,
    model_messages,
    request_body,
    stream_reply,
    tool_calls_json,
)
from lingcode.tui.store import ChatSession, ChatStore
from lingcode.tui.tools.calls import Call, ToolError, schemas
from lingcode.tui.tools.permissions import Permissions
from lingcode.tui.widgets import CSS_FILES
from lingcode.tui.widgets.message import MessageView, NoteView
from lingcode.tui.widgets.permission import PermissionScreen
from lingcode.tui.widgets.prompt import PromptBox, PromptInput
from lingcode.tui.widgets.stats import WARN_AT, StatsBar
from lingcode.tui.widgets.tool_call import ToolCallView

log = logging.getLogger("lingcode.tui")

SKIPPED = "skipped: an earlier call was declined"
CHARS_PER_TOKEN = 3  # a cautious guess for the warning before sending; the daemon counts exactly
PROGRESS_LINES = 40  # a daemon's start-up log is short; a pull's progress bar is one line


class ChatApp(CommandActions, App):
    TITLE = "lingcode chat"
    CSS_PATH = [str(Path(__file__).with_name("app.tcss")), *CSS_FILES]
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "command('new')", "New"),
        Binding("ctrl+o", "command('sessions')", "Sessions"),
        Binding("ctrl+r", "command('retry')", "Retry"),
        Binding("ctrl+t", "command('agent')", "Agent"),
    ]

    def __init__(
        self,
        *,
        link: DaemonLink,
        store: ChatStore,
        workdir: Path,
        permissions: Permissions | None = None,
        resume: int | str | None = None,
        agent: bool = False,
        system: str = "",
        max_tokens: int | None = None,
        temperature: float | None = None,
    ):
        super().__init__()
        self.link, self.store, self.workdir = link, store, workdir.resolve()
        # A start's log lines go to a note; its outcome is the Connected message or an error here.
        link.progress = Progress(begin=lambda _: None, report=self.show_progress, end=lambda _: None)
        self.permissions = permissions or Permissions.load()
        self.resume = resume  # "last", a session id, or None for a new session
        self.new_session_settings = {"agent": agent, "system": system}
        self.max_tokens, self.temperature = max_tokens, temperature
        self.session: ChatSession | None = None  # created with the first message
        self.answering = False
        self.waiting_for_daemon = False  # a message waits to be answered once the daemon is back
        self.progress: list[str] = []
        self.progress_note: NoteView | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield VerticalScroll(id="chat")
        yield PromptBox(self.workdir, id="prompt-box")
        yield StatsBar()
        yield Footer()

    @property
    def chat(self) -> VerticalScroll:
        return self.query_one("#chat", VerticalScroll)

    @property
    def prompt(self) -> PromptBox:
        return self.query_one(PromptBox)

    @property
    def stats_bar(self) -> StatsBar:
        return self.query_one(StatsBar)

    async def on_mount(self) -> None:
        self.chat.anchor()
        self.prompt.input.focus()
        if self.permissions.problem:
            await self.note(self.permissions.problem, error=True)
        if self.store.recovered:  # the history was damaged and moved aside: say so, and where it went
            await self.note(self.store.recovered, error=True)
        if self.resume is not None:
            session = self.store.last() if self.resume == "last" else self.store.get(int(self.resume))
            if session is not None:
                await self.open_session(session)
            else:
                await self.note("No earlier session to continue; this is a new one.")
        await self.note_store_problems()
        self.show_header()
        self.connect()

    async def on_unmount(self) -> None:
        await self.link.close()

    # the daemon

    @work(exclusive=True, group="link", exit_on_error=False)
    async def connect(self) -> None:
        self.stats_bar.set_link("connecting to the daemon…", "busy")
        try:
            await self.link.ready()
        except DaemonError as e:
            log.warning("connect failed: %s", e)
            await self.note(f"Could not reach or start the daemon: {e}", error=True)
            self.reconnect()
            return
        self.post_message(self.Connected())  # queued after the start's progress lines

    @work(exclusive=True, group="link", exit_on_error=False)
    async def reconnect(self) -> None:
        def waiting(attempt: int) -> None:
            queued = ", your message waits" if self.waiting_for_daemon else ""
            self.stats_bar.set_link(f"daemon unreachable: retrying ({attempt}){queued}", "trouble")

        await self.link.reconnect(waiting)
        self.post_message(self.Connected())  # queued after the start's progress lines

    class Connected(Message):
        pass

    @on(Connected)
    async def connected(self) -> None:
        self.stats_bar.set_link(f"● {self.link.model_id}", "ok")
        if self.progress_note is not None:
            self.progress.append(f"connected: {self.link.model_id}, context {self.link.context_length} tokens")
            await self.progress_note.update(self._progress_text())
            self.progress_note = None
        self.update_stats()
        if self.waiting_for_daemon and not self.answering:
            self.waiting_for_daemon = False
            self.answer()

    class DaemonProgress(Message):
        def __init__(self, line: str):
            super().__init__()
            self.line = line

    def show_progress(self, line: str) -> None:
        """A line of the daemon's start-up log, or why it could not be reached."""
        self.post_message(self.DaemonProgress(line))

    @on(DaemonProgress)
    async def _show_progress(self, event: DaemonProgress) -> None:
        line = event.line
        fresh = self.progress_note is None  # a new start (a restart gets a note of its own)
        self.progress = [*([] if fresh else self.progress), line][-PROGRESS_LINES:]
        self.stats_bar.set_link(line[:60], "busy")
        if fresh:
            self.progress_note = NoteView(self._progress_text())
            await self.chat.mount(self.progress_note)
        else:
            await self.progress_note.update(self._progress_text())

    def _progress_text(self) -> str:
        return "**Starting the daemon**\n\n```text\n" + "\n".join(self.progress) + "\n```"

    def daemon_trouble(self, retry: bool) -> None:
        self.link.mark_down()
        self.waiting_for_daemon = self.waiting_for_daemon or retry
        self.reconnect()

    # sending and answering

    @on(PromptInput.Submitted)
    async def submit(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        try:
            parsed = commands.parse(text)
        except UnknownCommand as e:
            await self.note(str(e), error=True)
            return
        if parsed is not None:
            self.prompt.clear()
            await self.run_command(*parsed)
            return
        await self.send(text.removeprefix("/") if text.startswith("//") else text)

    async def send(self, text: str) -> None:
        if self.answering:
            self.notify("An answer is still coming: Esc stops it.", severity="warning")
            return
        try:
            attachments, notes = attach(text, self.workdir)
        except AttachError as e:
            await self.note(str(e), error=True)
            return
        session = self.ensure_session()
        self.store.add(session.id, "user", text, attachments=attachments or None)
        if not session.title:
            self.session = self.store.update(session.id, title=text.splitlines()[0][:60])
            self.show_header()
        self.prompt.clear()
        await self.chat.mount(MessageView("user", text, attachments=attachments))
        for note in notes:
            self.notify(note)
        self.warn_if_tight(len(text) + sum(len(a["text"]) for a in attachments))
        if not self.link.connected:
            self.waiting_for_daemon = True
            self.notify("The daemon is not reachable yet; your message is kept and will be answered when it is back.")
            return
        self.answer()

    @work(exclusive=True, group="answer", exit_on_error=False)
    async def answer(self, calls: list[Call] | None = None) -> None:
        """Reply, and in agent mode run the tools the reply calls and reply again, until no tools are called."""
        self.answering = True
        try:
            while True:
                if calls and not await self.run_tool_calls(calls):
                    return
                reply = await self.stream_answer()
                if reply is None or not reply.tool_calls:
                    return
                calls = reply.tool_calls
        except Exception as e:  # a bug in lingcode: say so and keep the chat alive
            log.exception("answer failed")
            await self.note(f"lingcode chat hit an internal error: {type(e).__name__}: {e}", error=True)
        finally:
            self.answering = False
            if self.waiting_for_daemon and self.link.connected:  # it came back while this answer was ending
                self.waiting_for_daemon = False
                self.call_later(self.answer)

    async def stream_answer(self) -> Reply | None:
        if not self.link.connected:  # it dropped, maybe while a tool ran
            self.waiting_for_daemon = True
            return None
        session = self.session
        messages = model_messages(session, self.store.messages(session.id))
        body = request_body(
            self.link.model_id,
            messages,
            tools=schemas() if session.agent else None,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
        )
        stored = self.store.add(session.id, "assistant", state="streaming")
        view = MessageView("assistant", message_id=stored.id)
        await self.chat.mount(view)
        view.start_stream()
        self.stats_bar.set_link(f"● {self.link.model_id} answering… (Esc stops)", "busy")
        try:
            return await self._stream_into(view, stored.id, body)
        finally:
            if self.link.connected:
                self.stats_bar.set_link(f"● {self.link.model_id}", "ok")

    async def _stream_into(self, view: MessageView, message_id: int, body: dict) -> Reply | None:
        text, reply = "", None
        try:
            async with aclosing(stream_reply(self.link.client, body)) as events:
                async for event in events:
                    if isinstance(event, Reply):
                        reply = event
                        continue
                    text += event
                    self.store.set_content(message_id, text)  # stored before shown: a kill loses nothing shown
                    await view.write(event)
        except asyncio.CancelledError:
            self.store.finish(message_id, state="stopped", content=text)
            await view.finish(text, state="stopped")
            raise
        except ErrorResponse as e:
            await self.failed(message_id, view, text, e.message)
            await self.explain(e)
            return None
        except DaemonError as e:
            log.warning("stream failed: %r", e)
            await self.failed(message_id, view, text, f"lost the daemon ({type(e).__name__}); retrying")
            self.daemon_trouble(retry=True)
            return None
        if reply is None or reply.finish_reason is None:
            await self.failed(message_id, view, text, "the stream ended before the answer did")
            return None
        stats = reply.stats()
        self.store.finish(
            message_id,
            state="done",
            content=reply.text,
            stats=stats,
            tool_calls=tool_calls_json(reply.tool_calls) or None,
        )
        await view.finish(reply.text, stats=stats)
        if reply.tool_calls and not reply.text:
            await view.remove()  # the calls show as their own blocks, with the answer's stats on the bar
        self.update_stats()
        return reply

    async def failed(self, message_id: int, view: MessageView, text: str, error: str) -> None:
        self.store.finish(message_id, state="error", content=text, error=error)
        await view.finish(text, state="error", error=error)

    async def explain(self, error: ErrorResponse) -> None:
        detail = error.body.get("error")
        code = detail.get("code") if isinstance(detail, dict) else None
        if code == "context_length_exceeded":
            await self.note(
                f"The conversation does not fit the model's context ({self.link.context_length} tokens); "
                "nothing was cut. /clear starts a fresh context in this session, /new a new session.",
                error=True,
            )
        elif "tools" in error.message and "not supported" in error.message:
            await self.note(
                "This daemon does not support tool calling yet, so agent mode cannot run. "
                "/agent off chats without tools.",
                error=True,
            )
        elif error.status == 429:
            await self.note("The daemon's queue is full; Ctrl+R tries again.", error=True)
        else:
            await self.note(f"The daemon refused: {error.message}", error=True)

    # agent tools

    async def receive_tool_calls(self, calls: list[Call], text: str = ""):
        """Take an assistant message that calls tools, as if the model had just sent it, and carry on."""
        session = self.ensure_session()
        self.store.add(session.id, "assistant", text, tool_calls=tool_calls_json(calls))
        if text:
            await self.chat.mount(MessageView("assistant", text))
        return self.answer(calls)

    async def run_tool_calls(self, calls: list[Call]) -> bool:
        """Run each call (or not); False when the person declined one, which hands the turn back to them."""
        for index, call in enumerate(calls):
            view = ToolCallView(call)
            await self.chat.mount(view)
            try:
                result, go_on = await self.run_tool(call)
            except asyncio.CancelledError:
                self.store.add(self.session.id, "tool", "error: interrupted by the person", tool_call_id=call.id)
                await view.set_result("error: interrupted by the person")
                raise
            self.store.add(self.session.id, "tool", result, tool_call_id=call.id)
            await view.set_result(result)
            if not go_on:
                for skipped in calls[index + 1 :]:
                    self.store.add(self.session.id, "tool", SKIPPED, tool_call_id=skipped.id)
                    await self.chat.mount(ToolCallView(skipped, SKIPPED))
                await self.note("Declined. The agent waits: tell it what to do instead.")
                return False
        return True

    async def run_tool(self, call: Call) -> tuple[str, bool]:
        try:
            subject, inside, preview = call.subject(self.workdir), call.inside(self.workdir), call.preview(self.workdir)
        except ToolError as e:
            return f"error: {e}", True
        decision = self.permissions.decide(
            call.name, subject, reads=call.tool.kind == "read", inside=inside, always=self.session.always_allow
        )
        if decision.action == "deny":
            return f"denied by {decision.reason}", True
        if decision.action == "ask":
            answer = await self.push_screen_wait(PermissionScreen(call.name, subject, preview, decision.reason))
            if answer == "no":
                return "denied: the person declined this call", False
            if answer == "always":
                self.session = self.store.update(self.session.id, always_allow=[*self.session.always_allow, call.name])
        check = None
        if call.tool.walks:  # each file it reaches is decided too, as read_file would be for it
            check = self.permissions.file_check(
                call.name,
                self.workdir,
                call.root(self.workdir),
                root_approved=decision.action == "ask",
                always=self.session.always_allow,
            )
        try:
            return await call.run(self.workdir, check), True
        except ToolError as e:
            return f"error: {e}", True
        except (OSError, TypeError, ValueError) as e:
            return f"error: {type(e).__name__}: {e}", True

    # sessions and the screen

    def ensure_session(self) -> ChatSession:
        if self.session is None:
            self.session = self.store.create(workdir=str(self.workdir), **self.new_session_settings)
            self.show_header()
        return self.session

    async def open_session(self, session: ChatSession) -> None:
        self.session = session
        await self.show_session()

    async def show_session(self) -> None:
        await self.chat.remove_children()
        self.progress_note = None
        session = self.session
        if session is None:
            self.update_stats()
            self.show_header()
            return
        messages = self.store.messages(session.id)
        earlier = sum(1 for m in messages if m.id <= session.context_start)
        widgets = []
        if earlier:
            widgets.append(
                NoteView(
                    f"{earlier} earlier messages are kept in this session but no longer sent "
                    "(cleared with /clear); /export writes them all."
                )
            )
        results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
        for m in messages:
            if m.id <= session.context_start or m.role == "tool":
                continue
            if m.role == "user":
                widgets.append(MessageView("user", m.content, attachments=m.attachments))
                continue
            if m.content or not m.tool_calls or m.state != "done":
                widgets.append(MessageView("assistant", m.content, stats=m.stats, state=m.state, error=m.error))
            for call in m.tool_calls:
                widgets.append(ToolCallView(Call.from_openai(call), results.get(call.get("id"), INTERRUPTED_RESULT)))
        await self.chat.mount_all(widgets)
        await self.note_store_problems()
        self.chat.scroll_end(animate=False)
        self.update_stats()
        self.show_header()

    def show_header(self) -> None:
        session = self.session
        title = session.title if session and session.title else "new session"
        agent = session.agent if session else self.new_session_settings["agent"]
        self.sub_title = f"{title}{'  ·  agent mode' if agent else ''}"

    def update_stats(self) -> None:
        messages = self.store.messages(self.session.id) if self.session else []
        answers = [m.stats for m in messages if m.role == "assistant" and m.stats.get("timings")]
        self.stats_bar.set_answer(answers[-1] if answers else None)
        self.stats_bar.set_rates([a["timings"].get("tokens_per_s") or 0.0 for a in answers])
        after_clear = [m for m in messages if self.session and m.id > self.session.context_start]
        used, length = context_used(after_clear), self.link.context_length
        self.stats_bar.set_context(used, length)
        if length and used >= WARN_AT * length:
            self.notify(
                f"The context is {100 * used // length}% full ({used} of {length} tokens). "
                "Nothing is cut: a message that does not fit is refused. /clear or /new make room.",
                severity="warning",
            )

    def warn_if_tight(self, new_chars: int) -> None:
        length = self.link.context_length
        if not length or self.session is None:
            return
        messages = [m for m in self.store.messages(self.session.id) if m.id > self.session.context_start]
        estimate = context_used(messages) + new_chars // CHARS_PER_TOKEN
        if estimate >= length:
            self.notify(
                f"This message may not fit: about {estimate} tokens against a context of {length}. "
                "If it does not, the daemon refuses it (nothing is cut).",
                severity="warning",
            )

    @on(MessageView.CodeCopied)
    def code_copied(self, event: MessageView.CodeCopied) -> None:
        self.notify(f"copied {len(event.code.splitlines())} lines of code")
        self.prompt.input.focus()

    async def note(self, text: str, *, error: bool = False) -> None:
        await self.chat.mount(NoteView(text, error=error))

    async def note_store_problems(self) -> None:
        """Rows of the history that were damaged (edited by hand, say) and read as empty or left out."""
        if problems := self.store.take_problems():
            await self.note(
                f"The chat history {self.store.path} has damaged rows: "
                + "; ".join(problems[:5])
                + (f"; and {len(problems) - 5} more (see the log)" if len(problems) > 5 else ""),
                error=True,
            )

    def action_stop(self) -> None:
        if self.answering:
            self.workers.cancel_group(self, "answer")
