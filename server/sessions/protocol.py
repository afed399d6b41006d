"""What a client may send to the session routes: a chat-completions body, tools set at creation."""

from __future__ import annotations

from pydantic import Field, model_validator

from lingcode.server.openai.protocol import ChatCompletionRequest, Message, ToolDef
from lingcode.server.validation import StrictModel


class SessionCreateRequest(StrictModel):
    model: str | None = None
    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolDef] | None = None
    idle_timeout_s: float | int | None = Field(None, gt=0, le=7 * 24 * 3600)


class SessionTurnRequest(ChatCompletionRequest):
    @model_validator(mode="after")
    def _tool_choice_fits(self):  # overrides the chat check: the tools are the session's
        if self.tools:
            raise ValueError("tools: a session's tools are set when it is created")
        return self
