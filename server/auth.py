"""The token check: every route but `GET /health` needs the daemon's token.

Clients send it as `Authorization: Bearer <token>` (OpenAI SDKs) or `x-api-key: <token>`
(Anthropic SDKs). It is compared in constant time. This is pure ASGI middleware, so it guards
every route, including ones added later and unknown ones, before any body is read.

Requests that came in over the daemon's own Unix socket (`--unix-socket`, mode 0600: only this
user can connect) need no token; the ASGI server names that socket's path in scope["server"],
which no TCP client can forge.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from lingcode.server.errors import APIError

OPEN_PATHS = frozenset({"/health", "/"})  # "/": Claude Code probes it with HEAD at start


def presented_tokens(headers: Headers) -> list[str]:
    """The tokens a request carries, from either header."""
    tokens = []
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        tokens.append(value.strip())
    if api_key := headers.get("x-api-key", "").strip():
        tokens.append(api_key)
    return tokens


class TokenAuth:
    def __init__(
        self, app: ASGIApp, token: str, open_paths: frozenset[str] = OPEN_PATHS, unix_socket: str | None = None
    ):
        if not token:
            raise ValueError("the daemon's token is empty")
        self.app = app
        self._token = token.encode()
        self.open_paths = open_paths
        self.unix_socket = unix_socket

    def _over_unix_socket(self, scope: Scope) -> bool:
        server = scope.get("server")
        return self.unix_socket is not None and server is not None and tuple(server) == (self.unix_socket, None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or self._over_unix_socket(scope):
            await self.app(scope, receive, send)
            return
        tokens = presented_tokens(Headers(scope=scope))
        if any(hmac.compare_digest(t.encode(), self._token) for t in tokens):
            await self.app(scope, receive, send)
            return
        problem = "invalid token" if tokens else "missing token"
        message = (f"{problem}: send `Authorization: Bearer <token>` or `x-api-key: <token>`, with the "
                   "token from the file that `lingcode serve` printed")  # fmt: skip
        await APIError(401, message, code="invalid_api_key").response(scope["path"])(scope, receive, send)
