"""Scratch: split data_received -> until_engine by layer."""
import sys, time, json
from uvicorn.protocols.http import httptools_impl as H
from lingcode.pipeline import metrics
from lingcode.server import access, observability, serving
pc = time.perf_counter
T = {}
rows = []
def wrap_call(cls, name):
    orig = cls.__call__
    async def call(self, scope, receive, send):
        T.setdefault(name, pc())
        return await orig(self, scope, receive, send)
    cls.__call__ = call
wrap_call(access.AccessGuard, "guard"); wrap_call(access.TokenAuth, "token"); wrap_call(observability.RequestObserver, "observer")
import starlette.middleware.errors as E, starlette.middleware.exceptions as X, starlette.routing as R, fastapi.applications as FA
wrap_call(E.ServerErrorMiddleware, "errors"); wrap_call(X.ExceptionMiddleware, "exceptions"); wrap_call(R.Router, "router"); wrap_call(FA.FastAPI, "fastapi")
orig = H.HttpToolsProtocol.data_received
def data_received(self, data):
    if data[:5] == b"POST ":
        T.clear(); T["recv"] = pc()
        r = orig(self, data)
        T["recv_done"] = pc()
        return r
    return orig(self, data)
H.HttpToolsProtocol.data_received = data_received
orig_start = H.HttpToolsProtocol._start_asgi_task
def start(self, cycle, app):
    T["start_task"] = pc()
    return orig_start(self, cycle, app)
H.HttpToolsProtocol._start_asgi_task = start
orig_run = H.RequestResponseCycle.run_asgi
async def run_asgi(self, app):
    T["run_asgi"] = pc()
    return await orig_run(self, app)
H.RequestResponseCycle.run_asgi = run_asgi
orig_mark = metrics.Trace.mark
def mark(self, point):
    orig_mark(self, point)
    if point in ("until_handler", "until_engine") and "recv" in T:
        T[point] = pc()
    if point == "until_engine" and "recv" in T:
        t0 = T["recv"]
        rows.append({k: round((v - t0) * 1e3, 3) for k, v in T.items()})
        with open("/tmp/s25/arrive3.json", "w") as f: json.dump(rows, f)
metrics.Trace.mark = mark
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
