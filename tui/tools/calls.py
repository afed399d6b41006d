"""The agent's tool table and the model's calls to it.

Each LocalTool is a plain function over the working directory (files.py, shell.py) with its
OpenAI function schema and what it touches. A Call is one tool call from the model, parsed;
`preview` is what the permission prompt shows (a diff for writes), `run` does it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lingcode.tui.tools import files, shell
from lingcode.tui.tools.files import ToolError


@dataclass(frozen=True)
class LocalTool:
    """A tool the chat runs on this machine for the model (not lingcode.agent's Tool, a schema only)."""

    name: str
    description: str
    parameters: dict
    kind: str  # read | write | command
    subject: str  # the argument naming what the call touches: a path or the command line
    run: Callable[..., Any]
    walks: bool = False  # reads the files under its path: run takes `check`, deciding each one

    def schema(self) -> dict:
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


def _object(required: list[str], **properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_PATH = {"type": "string", "description": "a path, relative to the working directory"}

TOOLS = {
    tool.name: tool
    for tool in [
        LocalTool(
            "read_file",
            f"Read a text file, {files.READ_LINES} numbered lines at a time.",
            _object(
                ["path"],
                path=_PATH,
                offset={"type": "integer", "description": "first line, from 1"},
                limit={"type": "integer", "description": f"lines to read, at most {files.READ_LINES}"},
            ),
            "read",
            "path",
            files.read_file,
        ),
        LocalTool("list_dir", "List a directory's entries.", _object([], path=_PATH), "read", "path", files.list_dir),
        LocalTool(
            "grep",
            "Search files for a Python regular expression; prints path:line: text.",
            _object(
                ["pattern"],
                pattern={"type": "string"},
                path=_PATH,
                glob={"type": "string", "description": "file name glob, such as *.py"},
            ),
            "read",
            "path",
            files.grep,
            walks=True,
        ),
        LocalTool(
            "apply_edit",
            "Replace the one occurrence of old_text in a file with new_text.",
            _object(
                ["path", "old_text", "new_text"], path=_PATH, old_text={"type": "string"}, new_text={"type": "string"}
            ),
            "write",
            "path",
            files.apply_edit,
        ),
        LocalTool(
            "write_file",
            "Create or overwrite a text file.",
            _object(["path", "content"], path=_PATH, content={"type": "string"}),
            "write",
            "path",
            files.write_file,
        ),
        LocalTool(
            "run_command",
            "Run a bash command in the working directory; prints its exit code and output.",
            _object(
                ["command"],
                command={"type": "string"},
                timeout_s={"type": "integer", "description": f"default {shell.DEFAULT_TIMEOUT_S}"},
            ),
            "command",
            "command",
            shell.run_command,
        ),
    ]
}


def schemas() -> list[dict]:
    return [tool.schema() for tool in TOOLS.values()]


@dataclass
class Call:
    """One tool call of the model's, checked against its tool's schema."""

    id: str
    name: str
    arguments: str  # JSON, as the model wrote it

    @property
    def tool(self) -> LocalTool:
        if self.name not in TOOLS:
            raise ToolError(f"there is no tool {self.name!r}; the tools are {', '.join(TOOLS)}")
        return TOOLS[self.name]

    def args(self) -> dict:
        try:
            args = json.loads(self.arguments or "{}")
        except ValueError as e:
            raise ToolError(f"the arguments are not valid JSON ({e}): {self.arguments!r}") from None
        if not isinstance(args, dict):
            raise ToolError("the arguments must be a JSON object")
        properties = self.tool.parameters["properties"]
        unknown = set(args) - set(properties)
        missing = set(self.tool.parameters["required"]) - set(args)
        if unknown or missing:
            raise ToolError(
                f"{self.name} takes {sorted(properties)}; missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        return args

    def subject(self, workdir: Path) -> str:
        """What the call touches, as permission rules match it."""
        value = self.args().get(self.tool.subject, ".")
        if self.tool.subject == "path":
            return files.display(workdir, files.resolve(workdir, value))
        return str(value)

    def inside(self, workdir: Path) -> bool:
        if self.tool.subject != "path":
            return True
        return files.resolve(workdir, self.args().get("path", ".")).is_relative_to(workdir.resolve())

    def preview(self, workdir: Path) -> tuple[str, str]:
        """(language, text) for the permission prompt: a diff for writes, the command or arguments."""
        args = self.args()
        if self.name == "apply_edit":
            target, before, after = files.edited_text(workdir, args["path"], args["old_text"], args["new_text"])
            return "diff", files.unified_diff(workdir, target, before, after)
        if self.name == "write_file":
            return "diff", files.write_preview(workdir, args["path"], args["content"])
        if self.name == "run_command":
            return "bash", args["command"]
        return "json", json.dumps(args, indent=2, ensure_ascii=False)

    def root(self, workdir: Path) -> Path:
        """The resolved path the call names (file tools)."""
        return files.resolve(workdir, self.args().get("path", "."))

    async def run(self, workdir: Path, check: Callable[[Path], str] | None = None) -> str:
        """check: for a tool that walks, how each file it reaches is treated (Permissions.file_check)."""
        run, args = self.tool.run, self.args()
        if self.tool.walks and check is not None:
            args = {**args, "check": check}
        if asyncio.iscoroutinefunction(run):
            return await run(workdir, **args)
        return await asyncio.to_thread(run, workdir, **args)

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_openai(cls, call: dict) -> Call:
        function = call.get("function") or {}
        return cls(call.get("id", ""), function.get("name", ""), function.get("arguments", ""))


__all__ = ["TOOLS", "Call", "LocalTool", "ToolError", "schemas"]
