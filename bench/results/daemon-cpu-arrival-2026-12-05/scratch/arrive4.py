"""Scratch: data_received -> until_handler / until_engine; STRIP=1 drops FastAPI's extra layers."""
import sys, time, json, os
from uvicorn.protocols.http import httptools_impl as H
from lingcode.pipeline import metrics
pc = time.perf_counter
T = {}
rows = []
if os.environ.get("STRIP") == "1":
    import fastapi.applications as FA
    orig_build = FA.FastAPI.build_middleware_stack
    def build(self):
        from starlette.middleware.errors import ServerErrorMiddleware
        from starlette.middleware.exceptions import ExceptionMiddleware
        error_handler, handlers = None, {}
        for k, v in self.exception_handlers.items():
            if k in (500, Exception): error_handler = v
            else: handlers[k] = v
        app = ExceptionMiddleware(self.router, handlers=handlers, debug=self.debug)
        for m in reversed(self.user_middleware):
            app = m.cls(app, *m.args, **m.kwargs)
        return ServerErrorMiddleware(app, handler=error_handler, debug=self.debug)
    FA.FastAPI.build_middleware_stack = build
orig = H.HttpToolsProtocol.data_received
def data_received(self, data):
    if data[:5] == b"POST ":
        T.clear(); T["recv"] = pc()
    return orig(self, data)
H.HttpToolsProtocol.data_received = data_received
orig_mark = metrics.Trace.mark
def mark(self, point):
    orig_mark(self, point)
    if point in ("until_handler", "until_engine") and "recv" in T:
        T[point] = pc()
    if point == "until_engine" and "recv" in T:
        t0 = T["recv"]
        rows.append({k: round((v - t0) * 1e3, 3) for k, v in T.items()})
        with open(os.environ["OUTF"], "w") as f: json.dump(rows, f)
metrics.Trace.mark = mark
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
