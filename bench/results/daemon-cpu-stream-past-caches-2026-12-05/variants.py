"""Scratch: the smaller changes tried, as patches applied before `lingcode serve` builds its app.
serve_cpu.py applies the ones named in $AB (comma-separated); none is in the product.

    notg  stream the rest of a response without Starlette's task group (disconnects go unseen)
    lean  Serving routes called without FastAPI's two AsyncExitStacks and route-level handlers
"""
import os

from starlette.requests import Request

from lingcode.server import serving


def apply(names: str) -> None:
    if "notg" in names:
        async def call(self, scope, receive, send):
            try:
                first = await anext(self.body_iterator, "")
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                await send({"type": "http.response.body", "body": first.encode(), "more_body": True})
            except BaseException:
                await serving.aclose(self.body_iterator)
                raise
            await self.stream_response(send)

        serving.EventStream.__call__ = call
    if "lean" in names:
        init = serving.RequestRoute.__init__

        def lean_init(self, *args, **kwargs):
            init(self, *args, **kwargs)

            async def app(scope, receive, send):
                response = await self.endpoint(Request(scope, receive, send))
                await response(scope, receive, send)

            self.app = app

        serving.RequestRoute.__init__ = lean_init


apply(os.environ.get("AB", ""))
