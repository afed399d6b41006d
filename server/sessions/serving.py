"""Token-exact agent sessions (lingcode.agent.sessions) over HTTP.

    POST   /v1/sessions               create: {messages?, tools?, idle_timeout_s?} -> the session
    GET    /v1/sessions               list open sessions
    GET    /v1/sessions/{id}          one session (turns, history_tokens, expires_in_s)
    DELETE /v1/sessions/{id}          forget it
    POST   /v1/sessions/{id}/turns    append {messages: [new ones only]} and generate

A session's history is bounded by the model's context: messages given at creation whose prompt
does not fit get a 400 `context_length_exceeded`, as a turn past it does. The store keeps at most
`max_sessions` sessions and `max_bytes` of them (`lingcode serve --max-sessions`, `--session-memory`);
past either, the sessions idle longest are forgotten (their id gets a 404 saying so).

A turn takes a chat-completions body (sampling, stop, stream, tool_choice, response_format; not
`tools`, which are the session's) and answers in chat-completions shape, plus a `session` object:
`appended_tokens` (the new messages' tokens) and `history_tokens`. A turn that fails or is
aborted leaves the history as it was, so it can be sent again.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse

from lingcode.agent.sessions import Session, SessionError, SessionStore, StoreFull, turn_prompt
from lingcode.agent.tool_parsers import Tool
from lingcode.pipeline.turns import Turn, TurnEnd, TurnEvent
from lingcode.server.validation import read_json
from lingcode.server.errors import APIError, ContextLengthExceeded, invalid
from lingcode.server.openai.chat import ChatShape
from lingcode.server.openai.protocol import json_format
from lingcode.server.openapi import request_body
from lingcode.server.serving import Prepared, Serving
from lingcode.server.sessions.protocol import SessionCreateRequest, SessionTurnRequest
from lingcode.server.validation import check_unique_tool_names, parse


class SessionsServing(Serving):
    path = "/v1/sessions/{session_id}/turns"
    request_model = SessionTurnRequest

    def __init__(self, *args, store: SessionStore, **kwargs):
        super().__init__(*args, **kwargs)
        self.store = store

    def install(self, app: FastAPI) -> None:
        app.add_api_route(
            "/v1/sessions", self.create, methods=["POST"], openapi_extra=request_body(SessionCreateRequest)
        )
        app.add_api_route("/v1/sessions", self.list, methods=["GET"])
        app.add_api_route("/v1/sessions/{session_id}", self.get, methods=["GET"])
        app.add_api_route("/v1/sessions/{session_id}", self.delete, methods=["DELETE"])
        super().install(app)

    async def create(self, request: Request) -> JSONResponse:
        body = parse(SessionCreateRequest, await read_json(request, self.max_body_bytes))
        tools = [
            Tool(
                t.function.name,
                t.function.description or "",
                t.function.parameters or {"type": "object", "properties": {}},
            )
            for t in body.tools or []
        ]
        try:
            check_unique_tool_names(t.name for t in tools)
        except ValueError as exc:
            raise invalid(str(exc), param="tools") from None
        messages = [m.for_template() for m in body.messages]
        counted = 0
        if messages:  # the prompt they make, as the first turn would render it: it must fit the context
            counted = len((await self.prompt_ids(messages, tools))[0])
            if counted >= self.info.context_length:
                raise ContextLengthExceeded(self.info.context_length, counted, what="messages")
        try:
            session = self.store.create(self.family, tools, messages, body.idle_timeout_s, counted)
        except SessionError as exc:
            raise invalid(str(exc), param="messages") from None
        except StoreFull as exc:
            raise APIError(503, str(exc), code="session_store_full") from None
        return JSONResponse(session.describe())

    async def list(self) -> dict:
        return {"object": "list", "data": [s.describe() for s in self.store.list()]}

    async def get(self, session_id: str) -> dict:
        return self._session(session_id).describe()

    async def delete(self, session_id: str) -> dict:
        session = self._session(session_id)
        if session.busy:
            raise APIError(
                409, f"session {session_id} has a turn running; wait for it or abort it", code="session_busy"
            )
        self.store.delete(session_id)
        return {"id": session_id, "object": "session.deleted", "deleted": True}

    async def prepare(self, body: SessionTurnRequest, request: Request) -> Prepared:
        session = self._session(request.path_params["session_id"])
        if session.busy:
            raise APIError(409, f"session {session.id} already has a turn running", code="session_busy")
        choice = body.choice()
        if choice.name is not None and choice.name not in {t.name for t in session.tools}:
            raise invalid(f"tool_choice: the session has no tool named {choice.name!r}", param="tool_choice")
        if choice.mode == "required" and not session.tools:
            raise invalid("tool_choice: 'required' needs a session created with tools", param="tool_choice")
        try:
            input_ids, appended = turn_prompt(self.info, session, [m.for_template() for m in body.messages])
        except SessionError as exc:
            raise invalid(str(exc), param="messages") from None
        params, stop_loops = self.sampling_params(body.sampling(), len(input_ids), "messages")
        spec = self.turn_spec(session.tools, choice, body.parallel_tool_calls is not False, appended)
        shape = SessionShape(
            f"chatcmpl-{uuid.uuid4().hex}",
            self.model_id,
            body.include_usage(),
            session,
            len(input_ids) - len(session.token_ids),
        )
        session.busy = claim = shape.request_id  # claimed before the next await: a turn sent meanwhile gets a 409

        def release() -> None:
            if session.busy == claim:
                session.busy = None

        turn = Turn(shape.request_id, input_ids, params, spec, body.stop_strings(), stop_loops=stop_loops)
        return Prepared(turn, shape, bool(body.stream), json_format(body.response_format), release=release)

    def run(self, prepared: Prepared) -> AsyncIterator[list[TurnEvent]]:
        return _recorded(
            self.store, prepared.shape.session, prepared.turn.input_ids, super().run(prepared), prepared.release
        )

    def _session(self, session_id: str) -> Session:
        session = self.store.get(session_id)
        if session is None:
            raise APIError(
                404,
                f"no session {session_id!r} (never created, deleted, expired after being idle, or "
                f"forgotten for newer ones: {self.store.bounds()})",
                code="session_not_found",
            )
        return session


async def _recorded(
    store: SessionStore, session: Session, input_ids: list[int], events: AsyncIterator[list[TurnEvent]], release
) -> AsyncIterator[list[TurnEvent]]:
    """The turn's events; a finished turn is committed to the history before its end is shaped."""
    try:
        async for batch in events:
            end = batch[-1]
            if isinstance(end, TurnEnd) and end.finish_reason != "abort":
                store.commit(session, input_ids, end.output_ids)
            yield batch
    finally:
        release()
        await events.aclose()


class SessionShape(ChatShape):
    """Chat-completions shape, plus the session's counts on the response and on the stream's last chunk."""

    def __init__(self, request_id: str, model: str, include_usage: bool, session: Session, appended: int):
        super().__init__(request_id, model, include_usage)
        self.session, self.appended = session, appended

    def _session(self) -> dict:
        return {
            "id": self.session.id,
            "turn": self.session.turns,
            "appended_tokens": self.appended,
            "history_tokens": len(self.session.token_ids),
        }

    def whole(self, end: TurnEnd) -> dict:
        return {**super().whole(end), "session": self._session()}

    def closing(self, end: TurnEnd) -> dict:
        return {**super().closing(end), "session": self._session()}
