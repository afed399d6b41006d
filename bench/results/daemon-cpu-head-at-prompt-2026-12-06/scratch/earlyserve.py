"""Scratch: a stream's head (and an SSE comment) sent as soon as the body is valid, before the
prompt is built; EARLY=0 leaves the daemon as it is."""
import asyncio, contextvars, os, sys, time
from lingcode.server import serving as S
from lingcode.pipeline import metrics
from lingcode.server.validation import parse, read_json

EARLY = contextvars.ContextVar("early", default=False)
if os.environ.get("EARLY") == "1":
    orig_init = S.StreamHead.__init__
    def init(self, request, shape):
        orig_init(self, request, shape)
        if EARLY.get():
            f = asyncio.get_running_loop().create_future(); f.set_result(None)
            self.task = f
    S.StreamHead.__init__ = init
    orig_handle = S.Serving.handle
    async def handle(self, request):
        trace = metrics.trace.get() or metrics.Trace()
        trace.mark("until_handler")
        clock = time.perf_counter
        started = clock()
        data = await read_json(request, self.max_body_bytes)
        read = clock()
        body = parse(self.request_model, data)
        trace.add("body", read - started)
        trace.add("validate", clock() - read)
        if getattr(body, "stream", False):
            EARLY.set(True)
            await request.send({"type": "http.response.start", "status": 200, "headers": S._SSE_HEAD})
            await request.send({"type": "http.response.body", "body": b": ok\n\n", "more_body": True})
        prepared = await self.prepare(body, request)
        response = await S.respond(request, self.run(prepared), prepared.stream, prepared.shape)
        return response
    S.Serving.handle = handle
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
