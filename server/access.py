"""Who may talk to the daemon: the Host header and browser origins (AccessGuard), then the token (TokenAuth).

- DNS rebinding (Ollama's CVE-2024-28224): a web page on attacker.example re-points its own name at
  127.0.0.1 and then talks to the daemon as a same-origin page. The browser still sends
  `Host: attacker.example`, so only Host names that are loopback (localhost, 127.0.0.0/8, ::1), the
  address the daemon was bound to, or ones the user configured (`--allow-host`) are served.
- Web pages: a browser marks every cross-origin request (and every POST) with `Origin`. No browser
  page is a client of this daemon unless the user configured its origin (`--allow-origin`); any
  other request that carries an Origin is refused. Configured origins also get CORS answers
  (Starlette's CORSMiddleware, added in app.py), so such a page can read the replies.

Both are 403s in the API's error shape (Anthropic's on /v1/messages), for every path (/health
included); a WebSocket is closed before it is accepted (the server answers 403). A request with
two Host headers is a 400: which one a check reads is anyone's guess.

The token: every route but `GET /health` needs it. Clients send it as `Authorization: Bearer <token>` (OpenAI SDKs) or `x-api-key: <token>`
(Anthropic SDKs). It is compared in constant time. This is pure ASGI middleware, so it guards
every route, including ones added later and unknown ones, before any body is read.

Requests that came in over the daemon's own Unix socket (`--unix-socket`, mode 0600: only this
user can connect) need no token; the ASGI server names that socket's path in scope["server"],
which no TCP client can forge.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from lingcode.server.errors import APIError

LOOPBACK_NAMES = frozenset({"localhost"})
# RFC 9110's Host: a DNS name or IPv4 address, or an IPv6 literal in brackets, then an optional
# :port of digits. Nothing else may follow: "[::1]evil.com" or "localhost:evil" is no loopback host.
HOST = re.compile(r"(?:\[(?P<ipv6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_.])?))(?::[0-9]{1,5})?")


def host_name(host_header: str) -> str | None:
    """The name or address in a Host header, without its port, lowercased: "[::1]:8377" -> "::1".

    None if the header is no well-formed host: an IPv6 address must be in brackets ("::1" alone is
    none, as RFC 9110 and every browser have it).
    """
    match = HOST.fullmatch(host_header.strip().lower())
    if match is None:
        return None
    if match["ipv6"] is not None:
        try:
            return str(ipaddress.IPv6Address(match["ipv6"]))
        except ValueError:
            return None
    return match["name"].removesuffix(".") or None


def configured_host_name(value: str) -> str | None:
    """A name given with --allow-host, as host_name() reads it; a bare IPv6 address ("::1") is taken whole."""
    try:
        return str(ipaddress.IPv6Address(value.strip().lower()))
    except ValueError:
        return host_name(value)


def is_loopback_host(name: str) -> bool:
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normalize_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


class AccessGuard:
    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()):
        self.app = app
        self.allowed_hosts = frozenset(name for h in allowed_hosts if (name := configured_host_name(h)) is not None)
        self.allowed_origins = frozenset(normalize_origin(o) for o in allowed_origins)
        self._seen: dict[str, bool] = {}  # Host header -> allowed

    def host_allowed(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        allowed = self._seen.get(host_header)
        if allowed is None:  # a client sends the same Host every time: judged once (~50 us, ipaddress's)
            name = host_name(host_header)
            allowed = name is not None and (is_loopback_host(name) or name in self.allowed_hosts)
            if len(self._seen) < 64:
                self._seen[host_header] = allowed
        return allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        error = self.refusal(Headers(scope=scope))
        if error is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})
        else:
            await error.response(scope["path"])(scope, receive, send)

    def refusal(self, headers: Headers) -> APIError | None:
        hosts = headers.getlist("host")
        if len(hosts) > 1:  # which one a proxy or a check reads is anyone's guess: RFC 9112 refuses it
            return APIError(400, f"the request has {len(hosts)} Host headers; send one", code="invalid_http_request")
        host = hosts[0] if hosts else None
        if not self.host_allowed(host):
            return APIError(
                403,
                f"Host {host!r} is not served here: use localhost or 127.0.0.1, or start the "
                "daemon with --allow-host for this name",
                code="host_not_allowed",
            )
        origin = headers.get("origin")
        if origin is not None and normalize_origin(origin) not in self.allowed_origins:
            return APIError(
                403,
                f"requests from web pages (Origin {origin!r}) are refused; start the daemon "
                "with --allow-origin for a page you trust",
                code="origin_not_allowed",
            )
        return None


# --- the token ---------------------------------------------------------------------------------

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
        message = (
            f"{problem}: send `Authorization: Bearer <token>` or `x-api-key: <token>`, with the "
            "token from the file that `lingcode serve` printed"
        )
        await APIError(401, message, code="invalid_api_key").response(scope["path"])(scope, receive, send)
