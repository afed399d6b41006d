"""A tool call and its result as a collapsible block: the title says what ran and how it went."""

from __future__ import annotations

from textual.widgets import Collapsible, Markdown

from lingcode.tui.store.export import fence
from lingcode.tui.tools.calls import Call, ToolError

ICONS = {"running": "…", "ok": "✓", "error": "✗", "denied": "⊘"}


def call_summary(call: Call, limit: int = 60) -> str:
    try:
        subject = str(call.args().get(call.tool.subject, "."))
    except ToolError:
        subject = call.arguments
    subject = subject.replace("\n", " ")
    return subject if len(subject) <= limit else subject[: limit - 1] + "…"


def result_status(result: str) -> str:
    """How a result reads: ok, error (a tool error or a command's non-zero exit) or denied."""
    if result.startswith(("denied", "skipped")):
        return "denied"
    if result.startswith("error") or (result.startswith("exit code ") and not result.startswith("exit code 0\n")):
        return "error"
    return "ok"


class ToolCallView(Collapsible):
    def __init__(self, call: Call, result: str | None = None):
        self.call, self.result = call, result
        status = "running" if result is None else result_status(result)
        super().__init__(
            Markdown(self._body(), classes="tool-body"),
            title=self._heading(status),
            collapsed=result is not None,
            classes=status,
        )

    def _heading(self, status: str) -> str:
        return f"{ICONS[status]} {self.call.name}  {call_summary(self.call)}"

    def _body(self) -> str:
        text = fence(self.call.arguments or "{}", "json")
        if self.result is not None:
            text += f"\n\n{fence(self.result, 'text')}"
        return text

    async def set_result(self, result: str) -> None:
        self.result = result
        status = result_status(result)
        self.title = self._heading(status)
        self.set_classes(status)
        self.collapsed = True
        await self.query_one(".tool-body", Markdown).update(self._body())
