"""The parts of uvicorn's, h11's, Starlette's and FastAPI's internals the daemon relies on still exist.

server/frameworks.py overrides uvicorn's HTTP protocols (reading h11's connection state) and Server
loop, Starlette's Request and FastAPI's route handling, and server/streaming.py's EventStream
Starlette's StreamingResponse; pyproject.toml caps each framework at the minor version tested. A new release that renames one of these parts fails here, in CI, rather
than silently in a user's daemon. No daemon, no model: the frameworks' own classes and sources.
"""

from __future__ import annotations

import inspect
import re

import h11
import pytest
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import StreamingResponse
from uvicorn.protocols.http import h11_impl, httptools_impl
from uvicorn.server import Server

# What each class must still have: methods we override or call, and attributes we read or set
# (an attribute counts when the class's source assigns it: most are set in __init__ or per request).
PROTOCOL = ["__init__", "data_received", "connection_made", "connection_lost", "on_response_complete",
            "send_400_response", "cycle", "flow", "transport", "loop", "logger", "connections",
            "limit_concurrency", "app"]  # fmt: skip
RELIED_ON = {
    h11_impl.H11Protocol: [*PROTOCOL, "handle_events", "conn"],
    httptools_impl.HttpToolsProtocol: [
        *PROTOCOL,
        "on_message_begin",
        "on_headers_complete",
        "on_message_complete",
        "url",
        "pipeline",
    ],
    h11_impl.RequestResponseCycle: ["transport", "scope", "more_body", "response_complete"],
    httptools_impl.RequestResponseCycle: ["transport", "scope", "more_body", "response_complete"],
    h11.Connection: ["their_state", "trailing_data", "send"],
    Server: ["__init__", "startup", "handle_exit", "main_loop", "on_tick", "serve", "started", "should_exit"],
    APIRoute: ["__init__", "get_route_handler", "app", "endpoint"],
    StreamingResponse: ["__init__", "__call__", "stream_response", "body_iterator", "raw_headers", "status_code"],
}


def has(cls: type, name: str) -> bool:
    if hasattr(cls, name):
        return True
    source = "\n".join(inspect.getsource(c) for c in cls.__mro__ if c.__module__ != "builtins")
    return re.search(rf"self\.{name}\s*(:[^=\n]+)?=[^=]", source) is not None


@pytest.mark.parametrize("cls", list(RELIED_ON), ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_the_framework_internals_the_daemon_overrides_still_exist(cls):
    missing = [name for name in RELIED_ON[cls] if not has(cls, name)]
    assert not missing, f"{cls.__module__}.{cls.__qualname__} no longer has {missing}: see pyproject.toml's caps"


def test_a_request_still_takes_scope_receive_and_send():
    """server/frameworks.py's ServingRequest keeps `send`, which Starlette's Request takes but does not expose."""
    assert list(inspect.signature(Request.__init__).parameters)[1:4] == ["scope", "receive", "send"]


def test_the_check_finds_what_is_missing():
    assert has(h11_impl.H11Protocol, "cycle") and not has(h11_impl.H11Protocol, "no_such_part")
