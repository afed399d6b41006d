"""Scratch: first bytes -> handler / engine, with LEAN=1 skipping FastAPI's and Starlette's layers and router for one route."""
import sys, time, json, os
from uvicorn.protocols.http import httptools_impl as H
from lingcode.pipeline import metrics
pc = time.perf_counter
T = {}
rows = []
if os.environ.get("LEAN") == "1":
    import fastapi.applications as FA
    orig_call = FA.FastAPI.__call__
    chains = {}
    async def call(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions" and scope["method"] == "POST":
            chain = chains.get(id(self))
            if chain is None:
                route = next(r for r in self.router.routes if getattr(r, "path", None) == "/v1/chat/completions")
                chain = route.app
                for m in reversed(self.user_middleware):
                    chain = m.cls(chain, *m.args, **m.kwargs)
                chains[id(self)] = chain
            scope["app"] = self
            return await chain(scope, receive, send)
        return await orig_call(self, scope, receive, send)
    FA.FastAPI.__call__ = call
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
