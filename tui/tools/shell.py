"""run_command: a shell command in the working directory, killed (with its children) on interrupt."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from lingcode.tui.tools.files import ToolError

DEFAULT_TIMEOUT_S = 120
MAX_TIMEOUT_S = 600
MAX_OUTPUT_CHARS = 20_000  # head and tail are kept; the result says how much was left out


class Output:
    """A command's output, keeping only its head and tail, so a chatty command cannot fill memory."""

    def __init__(self, keep: int = MAX_OUTPUT_CHARS // 2):
        self.keep, self.head, self.tail, self.total = keep, bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        self.head += data[:room]
        self.tail += data[room:] if room > 0 else data
        del self.tail[: max(0, len(self.tail) - self.keep)]

    def text(self) -> str:
        omitted = self.total - len(self.head) - len(self.tail)
        head, tail = self.head.decode(errors="replace"), self.tail.decode(errors="replace")
        if omitted > 0:
            return f"{head}\n[... {omitted} bytes of output left out ...]\n{tail}"
        return head + tail


async def run_command(workdir: Path, command: str, timeout_s: int = DEFAULT_TIMEOUT_S) -> str:
    if not isinstance(command, str) or not command.strip():
        raise ToolError("command must be a non-empty string")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ToolError(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S}]")
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        cwd=workdir,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    output = Output()

    async def drain() -> None:
        while data := await process.stdout.read(65536):
            output.add(data)
        await process.wait()

    try:
        await asyncio.wait_for(drain(), timeout_s)
    except asyncio.TimeoutError:
        _kill(process)
        await process.wait()
        return f"timed out after {timeout_s} s (killed)\n{output.text()}"
    except asyncio.CancelledError:  # the person interrupted the agent
        _kill(process)
        await process.wait()
        raise
    return f"exit code {process.returncode}\n{output.text()}"


def _kill(process: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: this takes its children too
    except ProcessLookupError:
        pass
