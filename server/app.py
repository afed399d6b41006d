"""The daemon's HTTP app: OpenAI-compatible routes over one scheduler, behind the token.

    GET  /health                 no token; {"status": "ok", "model": ...}
    GET  /v1/models[/{id}]       the one served model
    POST /v1/chat/completions    chat, streamed (SSE) or not
    POST /v1/completions         plain prompts (and fill-in-the-middle where the model has it)
    GET  /v1/lingcode/stats      the engine's and the scheduler's counters
    POST /v1/lingcode/complete   code completion at a cursor, for editors (server/completion_routes.py)

create_app() takes what it serves as arguments, so the daemon (server/daemon.py) and tests build
it the same way.
"""

from __future__ import annotations

import time

from fastapi import FastAPI

from lingcode import __version__
from lingcode.engine import ModelInfo
from lingcode.scheduler import Scheduler
from lingcode.server import errors
from lingcode.server.auth import TokenAuth
from lingcode.server.body import MAX_BODY_BYTES
from lingcode.server.completion_routes import CompletionRoutes
from lingcode.server.openai_routes import OpenAIRoutes


def create_app(
    scheduler: Scheduler, info: ModelInfo, token: str, *, model_id: str, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    # No /docs or /openapi.json: the API is OpenAI's, and every path that is not a route is a 404.
    app = FastAPI(title="lingcode", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    errors.install(app)
    app.add_middleware(TokenAuth, token=token)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_id}

    model = {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "lingcode",
             "context_length": info.context_length}  # fmt: skip

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [model]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str) -> dict:
        if name != model_id:
            raise errors.APIError(404, f"model {name!r} is not served here; this daemon serves {model_id!r}",
                                  param="model", code="model_not_found")  # fmt: skip
        return model

    completions = CompletionRoutes(scheduler, info, model_id, max_body_bytes)

    @app.get("/v1/lingcode/stats")
    async def stats() -> dict:
        return {"engine": scheduler.engine.stats(), "scheduler": scheduler.stats(), "completions": completions.stats()}

    OpenAIRoutes(scheduler, info, model_id, max_body_bytes).install(app)
    completions.install(app)
    return app
