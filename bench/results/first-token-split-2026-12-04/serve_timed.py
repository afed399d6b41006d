"""Scratch: `lingcode serve` with timestamps on the first-token path, reported in `timings.trace`
(X-Lingcode-Trace) as absolute perf_counter ms: the request's bytes received (recv_abs), parsed by
uvicorn's protocol (parsed_abs), the app entered (app_abs), the daemon's Trace started
(started_abs), and the write of the response head with the first event (write_abs, write_ms).
Usage: python serve_timed.py [extra `lingcode serve` arguments]; it listens on 127.0.0.1:8391."""
import sys
import time

import fastapi

from lingcode import cli
from lingcode.pipeline import metrics
from lingcode.server import http11

W: dict[str, float] = {}

_write = http11.HeadWithBody.write


def write(self, data):
    had_head = self._head is not None  # this write sends the held head with the first body bytes
    t = time.perf_counter()
    _write(self, data)
    if had_head:
        W["first"], W["after"] = t, time.perf_counter()


http11.HeadWithBody.write = write

_protocol_class = http11.protocol_class


def protocol_class():
    class Timed(_protocol_class()):
        def data_received(self, data):
            W["recv"] = time.perf_counter()
            super().data_received(data)
            W["parsed"] = time.perf_counter()

    return Timed


http11.protocol_class = protocol_class

_call = fastapi.FastAPI.__call__


async def call(self, scope, receive, send):
    W["app"] = time.perf_counter()
    await _call(self, scope, receive, send)


fastapi.FastAPI.__call__ = call

_as_dict = metrics.Trace.as_dict


def as_dict(self):
    d = _as_dict(self)
    d["started_abs"] = self.started * 1e3
    for key in ("recv", "parsed", "app"):
        d[key + "_abs"] = W.pop(key, 0) * 1e3
    d["write_abs"] = W.pop("first", 0) * 1e3
    d["write_ms"] = W.pop("after", 0) * 1e3 - d["write_abs"]
    return d


metrics.Trace.as_dict = as_dict
sys.argv = ["lingcode", "serve", "--port", "8391", "--device", "cpu"] + sys.argv[1:]
cli.main()
