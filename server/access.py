"""Who may talk to the daemon at all, checked before the token: the Host header and browser origins.

- DNS rebinding (Ollama's CVE-2024-28224): a web page on attacker.example re-points its own name at
  127.0.0.1 and then talks to the daemon as a same-origin page. The browser still sends
  `Host: attacker.example`, so only Host names that are loopback (localhost, 127.0.0.0/8, ::1), the
  address the daemon was bound to, or ones the user configured (`--allow-host`) are served.
- Web pages: a browser marks every cross-origin request (and every POST) with `Origin`. No browser
  page is a client of this daemon unless the user configured its origin (`--allow-origin`); any
  other request that carries an Origin is refused. Configured origins also get CORS answers
  (Starlette's CORSMiddleware, added in app.py), so such a page can read the replies.

Both are 403s in OpenAI's error shape, for every path (/health included); a WebSocket is closed
before it is accepted (the server answers 403).
"""

from __future__ import annotations

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

    None if the header is no well-formed host. A bare IPv6 address ("::1", as --allow-host may
    give it) is taken whole.
    """
    host = host_header.strip().lower()
    match = HOST.fullmatch(host)
    if match is None:
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            return None
    if match["ipv6"] is not None:
        try:
            return str(ipaddress.IPv6Address(match["ipv6"]))
        except ValueError:
            return None
    return match["name"].removesuffix(".") or None


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
        self.allowed_hosts = frozenset(name for h in allowed_hosts if (name := host_name(h)) is not None)
        self.allowed_origins = frozenset(normalize_origin(o) for o in allowed_origins)

    def host_allowed(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        name = host_name(host_header)
        return name is not None and (is_loopback_host(name) or name in self.allowed_hosts)

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
            await error.response()(scope, receive, send)

    def refusal(self, headers: Headers) -> APIError | None:
        host = headers.get("host")
        if not self.host_allowed(host):
            return APIError(403, f"Host {host!r} is not served here: use localhost or 127.0.0.1, or start the "
                                 "daemon with --allow-host for this name", code="host_not_allowed")  # fmt: skip
        origin = headers.get("origin")
        if origin is not None and normalize_origin(origin) not in self.allowed_origins:
            return APIError(403, f"requests from web pages (Origin {origin!r}) are refused; start the daemon "
                                 "with --allow-origin for a page you trust", code="origin_not_allowed")  # fmt: skip
        return None
