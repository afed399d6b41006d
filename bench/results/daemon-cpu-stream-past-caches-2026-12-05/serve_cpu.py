"""Scratch: `lingcode serve` (port 8391, CPU, speculation off) reporting, in `timings.trace`
(X-Lingcode-Trace), the event loop thread's CPU time (thread_time, us) from the request's bytes
arriving to points on the first token's path: uvicorn's on_headers_complete, run_asgi, the app,
the outer middlewares, the handler, the engine's submit, the first chunk, the first write.
$AB names scratch patches to apply first (variants.py); LINGCODE_EVENT_LOOP=asyncio for the
standard loop."""
import os, sys, time
from lingcode import cli
from lingcode.pipeline import metrics
from lingcode.server import http11
import fastapi

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants  # noqa: F401,E402 - applies $AB
tt = time.thread_time
pc = time.perf_counter
C = {}
_write = http11.HeadWithBody.write
def write(self, data):
    had = self._head is not None
    if had: C["write0"] = tt(); C["w_write0"] = pc()
    _write(self, data)
    if had: C["write1"] = tt()
http11.HeadWithBody.write = write
_pc = http11.protocol_class
def protocol_class():
    class Timed(_pc()):
        def data_received(self, data):
            C["recv"] = tt(); C["w_recv"] = pc(); super().data_received(data); C["recv_end"] = tt()
    return Timed
http11.protocol_class = protocol_class
from uvicorn.protocols.http import httptools_impl as hti
_ra = hti.RequestResponseCycle.run_asgi
async def run_asgi(self, app):
    C["run_asgi"] = tt()
    await _ra(self, app)
hti.RequestResponseCycle.run_asgi = run_asgi
_ohc = hti.HttpToolsProtocol.on_headers_complete
def ohc(self):
    C["ohc0"] = tt(); _ohc(self); C["ohc1"] = tt()
hti.HttpToolsProtocol.on_headers_complete = ohc
from lingcode.server import observability, access, serving as _sv
import starlette.middleware.exceptions as _sme, starlette.routing as _sr, starlette.middleware.errors as _serr
def _wrapcls(cls, key):
    orig = cls.__call__
    async def f(self, scope, receive, send):
        if scope["type"] == "http": C[key] = tt()
        await orig(self, scope, receive, send)
    cls.__call__ = f
_wrapcls(_serr.ServerErrorMiddleware, "errmw")
_wrapcls(observability.RequestObserver, "observer")
_wrapcls(access.AccessGuard, "guard")
_wrapcls(access.TokenAuth, "auth")
_wrapcls(_sme.ExceptionMiddleware, "excmw")
_wrapcls(_sr.Router, "router")
from lingcode.engine.local import engine as _le
_sub = _le.LocalEngine.submit
def submit(self, *a, **k):
    C["submit0"] = tt(); r = _sub(self, *a, **k); C["submit1"] = tt(); return r
_le.LocalEngine.submit = submit
from lingcode.engine import ChunkChannel as _CC
_wk = _CC._wake
def _wake(self):
    if "wake" not in C: C["wake"] = tt()
    _wk(self)
_CC._wake = _wake
_call = fastapi.FastAPI.__call__
async def call(self, scope, receive, send):
    C["app"] = tt(); C["w_app"] = pc(); await _call(self, scope, receive, send)
fastapi.FastAPI.__call__ = call
_mark, _add = metrics.Trace.mark, metrics.Trace.add
def mark(self, point):
    if point not in self.stages: C[point] = tt()
    _mark(self, point)
def add(self, stage, s):
    if stage == "engine_first_chunk" and stage not in self.stages: C["chunk"] = tt(); C["w_chunk"] = pc()
    if stage not in self.stages: C["add_" + stage] = tt()
    _add(self, stage, s)
metrics.Trace.mark, metrics.Trace.add = mark, add
_as = metrics.Trace.as_dict
def as_dict(self):
    d = _as(self)
    r = C.get("recv", 0)
    for k in ("ohc0", "ohc1", "run_asgi", "app", "errmw", "observer", "guard", "auth", "excmw", "router", "until_handler", "until_engine", "add_queue", "submit0", "submit1", "wake", "chunk", "write0", "write1"):
        d["cpu_" + k] = round((C.get(k, 0) - r) * 1e6, 1)
    d["cpu_recv_end"] = round((C.get("recv_end", 0) - r) * 1e6, 1); d["w_post"] = round((C.get("w_write0",0)-C.get("w_chunk",0))*1e6,1); d["w_app"] = round((C.get("w_app",0)-C.get("w_recv",0))*1e6,1)
    C.pop("wake", None)
    return d
metrics.Trace.as_dict = as_dict
sys.argv = ["lingcode", "serve", "--port", "8391", "--device", "cpu", "--speculation", "off"] + sys.argv[1:]
cli.main()
