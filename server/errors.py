"""Every failure a client can see, in OpenAI's error shape, with the right HTTP status.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

SDKs read `error.message`, so the real reason reaches the user. Nothing else leaks out: FastAPI's
422 lists become 400s, unknown routes 404s, and an unexpected exception a 500 that says only that
(the traceback goes to the daemon's log, never to the client). as_api_error() is the one mapping
from what the pipeline raises (a full queue, a context overflow, an engine failure, a grammar
problem) to what the client sees.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from lingcode.agent.grammar import GrammarError, GrammarUnavailable
from lingcode.engine import ContextOverflow, EngineError, EngineUnavailable
from lingcode.pipeline.scheduler import QueueFull

RETRY_AFTER_S = "1"
CLIENT_GONE = 499  # nginx's status for a client that left before its answer ended; logged, never sent

# The error `type` for each status (OpenAI's names where it has one).
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


# Anthropic's error `type` for each status: routes under ANTHROPIC_PATH answer in Anthropic's shape,
#     {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}
ANTHROPIC_PATH = "/v1/messages"
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "api_error",
    503: "overloaded_error",
}


class APIError(Exception):
    """Raise anywhere in a request: the client gets `status` and this message in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(self.status, "api_error"), "message": self.message},
        }

    def response(self, path: str = "") -> JSONResponse:
        """The error response; in Anthropic's shape on Anthropic's routes."""
        body = self.anthropic_body() if path.startswith(ANTHROPIC_PATH) else self.body()
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def invalid(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    """A 400: the request is malformed or asks for something this server does not do."""
    return APIError(400, message, param=param, code=code)


class ContextLengthExceeded(APIError):
    """A prompt, or a prompt plus max_tokens, that does not fit the model's context: a 400.

    Agents read the message to react, so it is worded as each API words it. opencode and litellm
    (aider) match OpenAI's "maximum context length is N tokens". Claude Code compacts on Anthropic's
    "prompt is too long: N tokens > M maximum", and on "input length and `max_tokens` exceed
    context limit: N + M > C" retries by itself with a max_tokens that fits.
    """

    def __init__(self, context: int, prompt_tokens: int, max_tokens: int | None = None, *, what: str = "messages"):
        self.context, self.prompt_tokens, self.max_tokens = context, prompt_tokens, max_tokens
        if max_tokens is None:
            message = (
                f"This model's maximum context length is {context} tokens. However, your {what} "
                f"resulted in {prompt_tokens} tokens. Please reduce the length of the {what}."
            )
        else:
            message = (
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {what}, {max_tokens} in the "
                f"completion). Please reduce the length of the {what} or completion."
            )
        param = what if max_tokens is None else "max_tokens"
        super().__init__(400, message, param=param, code="context_length_exceeded")

    def anthropic_body(self) -> dict:
        # The context, as OpenAI's message says it: a prompt of exactly that length is refused
        # for the one token the answer needs at least.
        if self.max_tokens is None and self.prompt_tokens > self.context:
            message = f"prompt is too long: {self.prompt_tokens} tokens > {self.context} maximum"
        else:
            message = (
                f"input length and `max_tokens` exceed context limit: {self.prompt_tokens} + {self.max_tokens or 1} "
                f"> {self.context}, decrease input length or `max_tokens` and try again"
            )
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


def as_api_error(exc: BaseException) -> APIError | None:
    """The client-facing error for what a turn can raise; None for a bug (a plain 500)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, QueueFull):
        return APIError(429, str(exc), code="queue_full", headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(exc, ContextOverflow):
        return APIError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, EngineUnavailable):  # e.g. SGLang restarting after a crash
        return APIError(503, str(exc), code="engine_unavailable", headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(exc, EngineError):
        return APIError(500, str(exc), code="engine_error")
    if isinstance(exc, GrammarUnavailable):
        return APIError(400, str(exc), code="grammar_unavailable")
    if isinstance(exc, GrammarError):
        return APIError(400, str(exc), code="invalid_grammar")
    return None


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response(request.url.path)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors: unknown route (404), wrong method (405), ..."""
    if exc.status_code == 404:
        message, code = f"unknown route: {request.method} {request.url.path}", "unknown_url"
    elif exc.status_code == 405:
        message, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
    else:
        message, code = str(exc.detail), None
    return APIError(exc.status_code, message, code=code, headers=exc.headers).response(request.url.path)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 (only reachable if a route ever declares a body model): a 400 like ours."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    return invalid(f"{param}: {first.get('msg', 'invalid request')}", param=param).response(request.url.path)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises the exception after this response is sent, so uvicorn logs the traceback.
    return APIError(500, "internal server error; the daemon's log has the details").response(request.url.path)


def install(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
