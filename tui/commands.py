"""The chat's commands: typed as /name in the input (with completion) or picked in the palette (Ctrl+P).

`/name args` runs `command_<name>(args)` of CommandActions, which the app inherits: the table and
those methods below are the whole command system, so a new command is one row and one method.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from markdown_it import MarkdownIt
from textual.app import SystemCommand

from lingcode import models
from lingcode.client import DaemonError, ErrorResponse
from lingcode.tui.store.export import export_session
from lingcode.tui.widgets.sessions import SessionsScreen
from lingcode.tui.widgets.stats import answer_line


@dataclass(frozen=True)
class Command:
    name: str
    args: str  # how the arguments read in /help; "" for none
    help: str

    @property
    def usage(self) -> str:
        return f"/{self.name} {self.args}".rstrip()


COMMANDS = [
    Command("new", "", "start a new session"),
    Command("sessions", "", "list sessions: open, rename, delete, export"),
    Command("system", "[TEXT]", "show or set this session's system prompt"),
    Command("model", "", "the model the daemon serves, its context length, and how to switch"),
    Command("clear", "", "clear the context: later answers no longer see earlier messages (history is kept)"),
    Command("stats", "", "answer timings for this session and the daemon's counters"),
    Command("export", "[PATH]", "write this session as Markdown (default ./lingcode-session-ID.md)"),
    Command("agent", "[on|off]", "toggle agent mode: the model may read, edit and run commands (asking first)"),
    Command("copy", "[N]", "copy the last answer's Nth code block (default: the last one)"),
    Command("retry", "", "answer the last message again"),
    Command("help", "", "commands and keys"),
]
BY_NAME = {command.name: command for command in COMMANDS}


class UnknownCommand(ValueError):
    pass


def parse(text: str) -> tuple[Command, str] | None:
    """(command, arguments) for a line that starts with "/", None for a plain message."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    name, _, args = text[1:].partition(" ")
    command = BY_NAME.get(name.strip())
    if command is None:
        raise UnknownCommand(f"unknown command /{name}; /help lists the commands")
    return command, args.strip()


def complete(prefix: str) -> list[Command]:
    """Commands whose name starts with what follows the "/"."""
    return [command for command in COMMANDS if command.name.startswith(prefix)]


KEYS_HELP = """\
| key | does |
|---|---|
| Enter | send |
| Ctrl+J (Shift+Enter, Alt+Enter where the terminal sends them) | new line |
| Esc | stop the answer (the daemon aborts it) |
| Tab / ↑ ↓ | completions for `/commands` and `@paths` |
| Ctrl+P | command palette |
| Ctrl+N, Ctrl+O, Ctrl+R, Ctrl+T | new session, sessions, retry, agent mode on/off |
| click a code block | copy it |
| Ctrl+Q | quit |

`@path` attaches a file's text to the message. `//text` sends a message that starts with "/".
"""


class CommandActions:
    """The commands' actions, for ChatApp (which has store, link, session, note(), show_session(), ...)."""

    # commands: /name in the input, the same in the palette and some on keys

    async def action_command(self, name: str) -> None:
        await self.run_command(BY_NAME[name], "")

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for command in COMMANDS:
            yield SystemCommand(f"/{command.name}", command.help, partial(self.run_command, command, ""))

    async def run_command(self, command: Command, args: str) -> None:
        await getattr(self, f"command_{command.name}")(args)

    async def command_new(self, args: str) -> None:
        self.action_stop()
        if self.session is not None:
            self.new_session_settings["agent"] = self.session.agent
        self.session = None
        await self.show_session()

    async def command_sessions(self, args: str) -> None:
        async def opened(session_id: int | None) -> None:
            if self.session is not None and self.store.get(self.session.id) is None:
                self.session = None  # deleted on that screen
                await self.show_session()
            if session_id is not None and (self.session is None or session_id != self.session.id):
                self.action_stop()
                await self.open_session(self.store.get(session_id))

        current = self.session.id if self.session else None
        await self.push_screen(SessionsScreen(self.store, current, Path.cwd()), opened)

    async def command_system(self, args: str) -> None:
        if not args:
            current = self.session.system if self.session else self.new_session_settings["system"]
            await self.note(
                f"System prompt: {current!r}"
                if current
                else "No system prompt (the model's default). `/system TEXT` sets one."
            )
            return
        self.session = self.store.update(self.ensure_session().id, system=args)
        await self.note("System prompt set for this session.")

    async def command_model(self, args: str) -> None:
        lines = []
        if self.link.connected:
            daemon = self.link.daemon
            lines.append(
                f"Serving **{self.link.model_id}** (context {self.link.context_length} tokens), "
                f"engine `{daemon.engine}`, at {daemon.url} (pid {daemon.pid})."
            )
        else:
            lines.append("Not connected to a daemon yet.")
        local = [row for row in models.list_models() if row["pulled"]]
        if local:
            lines += ["", "Models on this machine: " + ", ".join(f"`{row['name']}`" for row in local)]
        lines += [
            "",
            "The daemon serves one model. To switch, restart it: `lingcode serve --model NAME`; "
            "this chat reconnects by itself.",
        ]
        await self.note("\n".join(lines))

    async def command_clear(self, args: str) -> None:
        if self.session is None:
            return
        messages = self.store.messages(self.session.id)
        if messages:
            self.session = self.store.update(self.session.id, context_start=messages[-1].id)
        await self.show_session()

    async def command_stats(self, args: str) -> None:
        messages = self.store.messages(self.session.id) if self.session else []
        answers = [m.stats for m in messages if m.role == "assistant" and m.stats.get("timings")]
        lines = ["**This session**", ""]
        if answers:
            rates = [a["timings"]["tokens_per_s"] for a in answers if a["timings"].get("tokens_per_s")]
            ttfts = [a["timings"]["ttft_ms"] for a in answers if a["timings"].get("ttft_ms") is not None]
            mean_rate, mean_ttft = sum(rates) / max(len(rates), 1), sum(ttfts) / max(len(ttfts), 1)
            lines.append(
                f"{len(answers)} answers; mean {mean_rate:.1f} tok/s, mean ttft {mean_ttft:.0f} ms; "
                f"last: {answer_line(answers[-1])}"
            )
        else:
            lines.append("no answers yet")
        if self.link.connected:
            try:
                daemon = await self.link.client.get("/v1/lingcode/stats")
                lines += ["", "**The daemon**", "", "| counter | value |", "|---|---|"]
                for part, counters in daemon.items():
                    for key, value in (counters or {}).items():
                        lines.append(f"| {part}.{key} | {value} |")
            except (ErrorResponse, DaemonError) as e:
                lines += ["", f"(the daemon's counters are unavailable: {e})"]
        await self.note("\n".join(lines))

    async def command_export(self, args: str) -> None:
        if self.session is None:
            await self.note("Nothing to export yet.", error=True)
            return
        path = Path(args).expanduser() if args else Path.cwd() / f"lingcode-session-{self.session.id}.md"
        try:
            export_session(self.store, self.session.id, path)
        except OSError as e:
            await self.note(f"Could not export to {path}: {e}", error=True)
            return
        await self.note(f"Exported this session to `{path}`.")

    async def command_agent(self, args: str) -> None:
        if args not in ("", "on", "off"):
            await self.note("/agent takes on, off, or nothing (toggles).", error=True)
            return
        current = self.session.agent if self.session else self.new_session_settings["agent"]
        agent = {"on": True, "off": False}.get(args, not current)
        self.new_session_settings["agent"] = agent
        if self.session is not None:
            self.session = self.store.update(self.session.id, agent=agent)
        self.show_header()
        if agent:
            await self.note(
                f"Agent mode on: the model may use tools in `{self.workdir}`. Reads inside it run at "
                "once; writes and commands ask first (rules: "
                f"`{self.permissions.source}`). Esc interrupts."
            )
        else:
            await self.note("Agent mode off: plain chat.")

    async def command_copy(self, args: str) -> None:
        messages = self.store.messages(self.session.id) if self.session else []
        answers = [m for m in messages if m.role == "assistant" and m.content]
        tokens = MarkdownIt().parse(answers[-1].content) if answers else []
        blocks = [t.content.removesuffix("\n") for t in tokens if t.type == "fence"]
        if not blocks:
            await self.note("The last answer has no code block to copy.", error=True)
            return
        number = int(args) if args.isdigit() else len(blocks) if not args else 0
        if not 1 <= number <= len(blocks):
            await self.note(f"/copy takes a block number from 1 to {len(blocks)}.", error=True)
            return
        code = blocks[number - 1]
        self.copy_to_clipboard(code)
        self.notify(f"copied code block {number} of {len(blocks)} ({len(code.splitlines())} lines)")

    async def command_retry(self, args: str) -> None:
        if self.session is None or self.answering:
            return
        start = self.session.context_start
        users = [m for m in self.store.messages(self.session.id) if m.role == "user" and m.id > start]
        if not users:
            await self.note("There is no message to answer again.", error=True)
            return
        self.store.delete_messages_after(self.session.id, users[-1].id)
        await self.show_session()
        if self.link.connected:
            self.answer()
        else:
            self.waiting_for_daemon = True

    async def command_help(self, args: str) -> None:
        def cell(text: str) -> str:  # a cell ends at any unescaped |, in a code span too (GFM, as Textual reads it)
            return text.replace("|", "\\|")

        rows = "\n".join(f"| `{cell(c.usage)}` | {cell(c.help)} |" for c in COMMANDS)
        await self.note(f"| command | does |\n|---|---|\n{rows}\n\n{KEYS_HELP}")
