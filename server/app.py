"""The daemon's HTTP app: OpenAI-compatible routes over one scheduler, behind the token.

    GET  /health                 no token; {"status": "ok", "model": ...}
    GET  /v1/models[/{id}]       the one served model
    POST /v1/chat/completions    chat, streamed (SSE) or not
    POST /v1/completions         plain prompts (and fill-in-the-middle where the model has it)
    GET  /v1/lingcode/stats      the engine's and the scheduler's counters
    POST /v1/lingcode/complete   code completion at a cursor, for editors (server/editor/)
    /v1/sessions...              token-exact agent sessions (server/sessions/)
    POST /v1/messages[/count_tokens]  Anthropic Messages (server/anthropic/)
    POST /v1/responses           OpenAI Responses (server/responses/)
    GET  /metrics                Prometheus metrics (server/observability.py)
    GET  /openapi.json           this API's OpenAPI document (server/openapi.py)

Around the routes, outermost first: request ids, metrics and access logs (observability.py); the
Host and Origin checks (access.py); CORS for configured origins; the token (access.py); the
APIs' own routes, reached directly (frameworks.DirectRoutes).

create_app() takes what it serves as arguments, so the daemon (server/daemon.py) and tests build
it the same way.
"""

from __future__ import annotations

import functools
import time

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from lingcode import __version__
from lingcode.engine import ModelInfo
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server import errors, openapi
from lingcode.server.access import OPEN_PATHS, AccessGuard, TokenAuth
from lingcode.server.anthropic.messages import MessagesServing
from lingcode.server.validation import MAX_BODY_BYTES
from lingcode.server.editor.serving import EditorServing
from lingcode.server.observability import RequestObserver, add_metrics_route
from lingcode.server.openai.chat import ChatServing
from lingcode.server.openai.completions import CompletionsServing
from lingcode.server.responses.serving import ResponsesServing
from lingcode.server.frameworks import DirectRoutes
from lingcode.server.sessions.serving import SessionsServing
from lingcode.server.streaming import KEEP_ALIVE_S
from lingcode.agent.sessions import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_BYTES, DEFAULT_MAX_SESSIONS, SessionStore
from lingcode.agent import grammar
from lingcode.agent.tool_prompt import template_takes_tools
from lingcode.text.chat_template import compile_template


def create_app(
    scheduler: Scheduler,
    info: ModelInfo,
    token: str,
    *,
    model_id: str,
    max_body_bytes: int = MAX_BODY_BYTES,
    session_idle_s: float = DEFAULT_IDLE_TIMEOUT_S,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_bytes: int = DEFAULT_MAX_BYTES,
    keep_alive_s: float = KEEP_ALIVE_S,
    allowed_hosts: tuple[str, ...] = (),
    allowed_origins: tuple[str, ...] = (),
    unix_socket: str | None = None,
) -> FastAPI:
    """keep_alive_s: how far apart a stream's comments are until its first token (server/streaming.py);
    allowed_hosts / allowed_origins: Host names and browser origins served besides loopback ones
    (server/access.py); unix_socket: the path of the daemon's own socket, whose clients need no token."""
    # No /docs: /openapi.json (behind the token) is for tools; every other path that is not a route is a 404.
    # No OpenTelemetry: the daemon has its own metrics, and FastAPI would otherwise ask for OTel's
    # providers on every request.
    app = FastAPI(
        title="lingcode",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.openapi = functools.partial(openapi.document, app, OPEN_PATHS)
    errors.install(app)
    app.add_middleware(DirectRoutes, routes=app.router.routes)
    app.add_middleware(TokenAuth, token=token, unix_socket=unix_socket)
    if allowed_origins:  # preflights are answered here, before the token (browsers send none with them)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["x-request-id", "retry-after"],
        )
    app.add_middleware(AccessGuard, allowed_hosts=allowed_hosts, allowed_origins=allowed_origins)
    app.add_middleware(RequestObserver, routes=app.router.routes)
    ready_first_requests(info)
    sessions = SessionStore(session_idle_s, max_sessions, session_bytes)
    served = (scheduler, info, model_id, max_body_bytes)
    kept = {"keep_alive_s": keep_alive_s}
    editor = EditorServing(*served, **kept)
    # The APIs first: a request is matched against the routes in order, by the router and for its
    # metrics label, and the editor's keystrokes and agents' turns are the requests that wait.
    for serving in (
        editor,
        ChatServing(*served, **kept),
        MessagesServing(*served, **kept),
        ResponsesServing(*served, **kept),
        CompletionsServing(*served, **kept),
        SessionsServing(*served, store=sessions, **kept),
    ):
        serving.install(app)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> dict:  # Claude Code sends HEAD / when it starts
        return {"status": "ok"}

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: monitors probe with it; no body
    async def health() -> dict:
        return {"status": "ok", "model": model_id}

    model = {
        "id": model_id,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "lingcode",
        "context_length": info.context_length,
    }

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [model]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str) -> dict:
        if name != model_id:
            raise errors.APIError(
                404,
                f"model {name!r} is not served here; this daemon serves {model_id!r}",
                param="model",
                code="model_not_found",
            )
        return model

    @app.get("/v1/lingcode/stats")
    async def stats() -> dict:
        return {
            "engine": scheduler.engine.stats(),
            "scheduler": scheduler.stats(),
            "completions": editor.stats(),
            "sessions": sessions.stats(),
        }

    add_metrics_route(app, scheduler)
    return app


def ready_first_requests(info: ModelInfo) -> None:
    """Build now what the first request of a kind would otherwise build while its client waits
    (~0.35 s in all on 2 cores): the chat template and the variables it reads, the tokenizer the
    editor's prompts use, the grammar compiler (the engine's own process builds its own)."""
    compile_template(info.chat_template)
    template_takes_tools(info.chat_template)
    info.tokenizer.encode_text("")
    grammar.prepare(info.tokenizer, info.eos_token_ids)
