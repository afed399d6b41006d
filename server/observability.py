"""Per request: an id, a route label, HTTP metrics and one access-log line; and GET /metrics.

RequestObserver is the outermost middleware, so it sees every answer, the 401s, 403s and 404s of
the guards included. It gives each request an id (the client's `X-Request-Id` when it sends a sane
one, else a new one), returns it in the `X-Request-Id` response header, and sets lingcode.pipeline.metrics'
context variables, so that every log line and generation metric of the request carries its id and
route. The route label is the matched route's path template ("/v1/models/{name:path}"), or
"unmatched": raw paths would let any client grow the metrics without bound.

GET /metrics is Prometheus' text format (prometheus-client), behind the token like every route.
"""

from __future__ import annotations

import logging
import re
import secrets
import time

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lingcode.pipeline import metrics
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server.errors import CLIENT_GONE
from lingcode.server.frameworks import ARRIVED_AT

REQUEST_ID_HEADER = "x-request-id"
TRACE_HEADER = "x-lingcode-trace"  # asks for `timings.trace`: where the request's time went (lingcode bench daemon)
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

HTTP_REQUESTS = Counter(
    "lingcode_http_requests",
    "HTTP responses by route, method and status (errors: status >= 400).",
    ["route", "method", "status"],
    registry=None,
)
HTTP_DURATION = Histogram(
    "lingcode_http_request_duration_seconds",
    "Time until the response ended (a whole stream, for streams).",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    registry=None,
)

access_log = logging.getLogger("lingcode.access")


def route_label(routes: list[BaseRoute], scope: Scope) -> str:
    """The path template of the route that serves `scope` (or would, with another method)."""
    other_method = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return getattr(route, "path", "unmatched")
        if match is Match.PARTIAL and other_method is None:
            other_method = getattr(route, "path", None)
    return other_method or "unmatched"


class RequestObserver:
    def __init__(self, app: ASGIApp, routes: list[BaseRoute]):
        self.app = app
        self.routes = routes  # the app's live list: routes added after this middleware are seen too
        self._labels: dict[tuple[str, str], str] = {}  # (method, path) -> route label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = Headers(scope=scope).get(REQUEST_ID_HEADER, "")
        request_id = sent if _SANE_ID.fullmatch(sent) else f"req-{secrets.token_hex(8)}"
        key = (scope["method"], scope["path"])
        label = self._labels.get(key)
        if label is None:  # matching every route costs ~20 us after an engine step; a client repeats its paths
            label = route_label(self.routes, scope)
            if label != "unmatched" and len(self._labels) < 256:
                self._labels[key] = label
        id_token, route_token = metrics.request_id.set(request_id), metrics.route.set(label)
        trace = metrics.Trace(report=TRACE_HEADER in Headers(scope=scope), started=scope.get(ARRIVED_AT))
        trace_token = metrics.trace.set(trace)
        status = 500  # if the app raises before answering, Starlette's outermost handler sends a 500
        complete = False  # the last part of the body went out

        async def send_with_id(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message).append(REQUEST_ID_HEADER, request_id)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    trace.mark("until_first_body")
                complete = not message.get("more_body", False)
            sending = time.perf_counter()
            await send(message)
            trace.add("send", time.perf_counter() - sending)

        started = time.perf_counter()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if status < 400 and not complete:
                status = CLIENT_GONE  # a stream its client left: logged as one that left before it began
            elapsed = time.perf_counter() - started
            HTTP_REQUESTS.labels(label, scope["method"], str(status)).inc()
            HTTP_DURATION.labels(label).observe(elapsed)
            client = scope.get("client")
            access_log.info(
                "%s %s %d",
                scope["method"],
                scope["path"],
                status,
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round(elapsed * 1e3, 3),
                    "client": f"{client[0]}:{client[1]}" if client else "unix",
                },
            )
            metrics.request_id.reset(id_token)
            metrics.route.reset(route_token)
            metrics.trace.reset(trace_token)


def add_metrics_route(app: FastAPI, scheduler: Scheduler) -> None:
    """GET /metrics: this daemon's registry (process, generation, HTTP, queue and engine numbers)."""
    registry = metrics.registry_for(scheduler)
    registry.register(HTTP_REQUESTS)
    registry.register(HTTP_DURATION)

    @app.get("/metrics", summary="Prometheus metrics (text format)")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
