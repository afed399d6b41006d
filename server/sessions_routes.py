"""Token-exact agent sessions (lingcode.agent.sessions) over HTTP.

    POST   /v1/sessions               create: {messages?, tools?, idle_timeout_s?} -> the session
    GET    /v1/sessions               list open sessions
    GET    /v1/sessions/{id}          one session (turns, history_tokens, expires_in_s)
    DELETE /v1/sessions/{id}          forget it
    POST   /v1/sessions/{id}/turns    append {messages: [new ones only]} and generate

A turn takes a chat-completions body (sampling, stop, stream, tool_choice, response_format; not
`tools`, which are the session's) and answers in chat-completions shape, plus a `session` object:
`appended_tokens` (the new messages' tokens) and `history_tokens`. A turn that fails or is
aborted leaves the history as it was, so it can be sent again.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI
from pydantic import Field, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lingcode.engine import ModelInfo
from lingcode.text.families import family_for
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server import inputs
from lingcode.server.body import read_json
from lingcode.server.chat_turns import chat_sse, json_format
from lingcode.server.errors import APIError, invalid
from lingcode.server.openai_api import ChatCompletionRequest, Message, ToolDef
from lingcode.server.openapi import request_body
from lingcode.server.responses import ChatShape
from lingcode.server.turn_runner import constrained, respond
from lingcode.server.validation import StrictModel, check_unique_tool_names, parse
from lingcode.agent.sessions import Session, SessionError, SessionStore, commit, turn_prompt
from lingcode.agent.tool_parsers import Tool
from lingcode.pipeline.turns import TurnEnd, TurnEvent, TurnSpec, run_turn, starts_in_reasoning


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


class SessionRoutes:
    def __init__(self, scheduler: Scheduler, info: ModelInfo, model_id: str, max_body_bytes: int, store: SessionStore):
        self.scheduler, self.info, self.model_id = scheduler, info, model_id
        self.max_body_bytes = max_body_bytes
        self.store = store

    def install(self, app: FastAPI) -> None:
        app.add_api_route("/v1/sessions", self.create, methods=["POST"], openapi_extra=request_body(SessionCreateRequest))
        app.add_api_route("/v1/sessions", self.list, methods=["GET"])
        app.add_api_route("/v1/sessions/{session_id}", self.get, methods=["GET"])
        app.add_api_route("/v1/sessions/{session_id}", self.delete, methods=["DELETE"])
        app.add_api_route("/v1/sessions/{session_id}/turns", self.turn, methods=["POST"],
                          openapi_extra=request_body(SessionTurnRequest))  # fmt: skip

    async def create(self, request: Request) -> JSONResponse:
        body = parse(SessionCreateRequest, await read_json(request, self.max_body_bytes))
        tools = [Tool(t.function.name, t.function.description or "", t.function.parameters or {"type": "object", "properties": {}})
                 for t in body.tools or []]  # fmt: skip
        try:
            check_unique_tool_names(t.name for t in tools)
        except ValueError as exc:
            raise invalid(str(exc), param="tools") from None
        session = self.store.create(family_for(self.info), tools, [m.for_template() for m in body.messages],
                                    body.idle_timeout_s)  # fmt: skip
        return JSONResponse(session.describe())

    async def list(self) -> dict:
        return {"object": "list", "data": [s.describe() for s in self.store.list()]}

    async def get(self, session_id: str) -> dict:
        return self._session(session_id).describe()

    async def delete(self, session_id: str) -> dict:
        session = self._session(session_id)
        if session.busy:
            raise APIError(409, f"session {session_id} has a turn running; wait for it or abort it", code="session_busy")
        self.store.delete(session_id)
        return {"id": session_id, "object": "session.deleted", "deleted": True}

    async def turn(self, session_id: str, request: Request) -> Response:
        body = parse(SessionTurnRequest, await read_json(request, self.max_body_bytes))
        session = self._session(session_id)
        if session.busy:
            raise APIError(409, f"session {session_id} already has a turn running", code="session_busy")
        choice = body.choice()
        if choice.name is not None and choice.name not in {t.name for t in session.tools}:
            raise invalid(f"tool_choice: the session has no tool named {choice.name!r}", param="tool_choice")
        if choice.mode == "required" and not session.tools:
            raise invalid("tool_choice: 'required' needs a session created with tools", param="tool_choice")
        try:
            input_ids, appended = turn_prompt(self.info, session, [m.for_template() for m in body.messages])
        except SessionError as exc:
            raise invalid(str(exc), param="messages") from None
        params = inputs.sampling_params(self.info, body, len(input_ids), "messages")
        spec = TurnSpec(session.family, session.tools, choice, body.parallel_tool_calls is not False,
                        starts_in_reasoning(session.family, appended))  # fmt: skip
        params = await constrained(self.info, params, spec, json_format(body),
                             "tool_choice" if spec.forced_tools() else "response_format")  # fmt: skip
        shape = SessionShape(f"chatcmpl-{uuid.uuid4().hex}", self.model_id, body.include_usage(), session,
                             len(input_ids) - len(session.token_ids))  # fmt: skip
        events = _recorded(session, input_ids,
                           run_turn(self.scheduler, self.info, shape.request_id, input_ids, params, spec, body.stop_strings()))  # fmt: skip
        session.busy = True
        try:
            return await respond(request, events, bool(body.stream), shape.turn_response, lambda ev: chat_sse(ev, shape))
        except BaseException:
            session.busy = False
            raise

    def _session(self, session_id: str) -> Session:
        session = self.store.get(session_id)
        if session is None:
            raise APIError(404, f"no session {session_id!r} (never created, deleted, or expired after being idle)",
                           code="session_not_found")  # fmt: skip
        return session


async def _recorded(session: Session, input_ids: list[int], events: AsyncIterator[TurnEvent]) -> AsyncIterator[TurnEvent]:
    """The turn's events; a finished turn is committed to the history before its end is shaped."""
    try:
        async for event in events:
            if isinstance(event, TurnEnd) and event.finish_reason != "abort":
                commit(session, input_ids, event.output_ids)
            yield event
    finally:
        session.busy = False
        await events.aclose()


class SessionShape(ChatShape):
    """Chat-completions shape, plus the session's counts on the response and on the stream's last chunk."""

    def __init__(self, request_id: str, model: str, include_usage: bool, session: Session, appended: int):
        super().__init__(request_id, model, include_usage)
        self.session, self.appended = session, appended

    def _session(self) -> dict:
        return {"id": self.session.id, "turn": self.session.turns, "appended_tokens": self.appended,
                "history_tokens": len(self.session.token_ids)}  # fmt: skip

    def turn_response(self, end) -> dict:
        return {**super().turn_response(end), "session": self._session()}

    def closing(self, finish_reason, usage, timing) -> dict:
        return {**super().closing(finish_reason, usage, timing), "session": self._session()}
