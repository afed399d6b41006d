"""The chat's commands: typed as /name in the input (with completion) or picked in the palette (Ctrl+P).

The app runs `/name args` by calling its method `command_<name>(args)`, so the table here and
those methods are the whole command system.
"""

from __future__ import annotations

from dataclasses import dataclass


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
