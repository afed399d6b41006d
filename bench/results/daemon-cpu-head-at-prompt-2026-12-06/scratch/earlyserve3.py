"""Scratch: a stream's head sent once the prompt is rendered (before tokenizing); EARLY=0 as is."""
import asyncio, contextvars, os, sys, time
from lingcode.server import serving as S
from lingcode.pipeline import metrics
from lingcode.agent.tool_prompt import render_prompt

REQ = contextvars.ContextVar("req", default=None)
SENT = contextvars.ContextVar("sent", default=False)

def drive(coro):
    try:
        coro.send(None)
    except StopIteration:
        return
    raise RuntimeError("send suspended")

if os.environ.get("EARLY") == "1":
    orig_init = S.StreamHead.__init__
    def init(self, request, shape):
        orig_init(self, request, shape)
        if SENT.get():
            f = asyncio.get_running_loop().create_future(); f.set_result(None)
            self.task = f
    S.StreamHead.__init__ = init
    orig_prepare = S.Serving.__dict__.get("prepare")
    from lingcode.server.openai.chat import ChatServing
    orig_chat_prepare = ChatServing.prepare
    async def prepare(self, body, request):
        if body.stream:
            REQ.set(request)
        return await orig_chat_prepare(self, body, request)
    ChatServing.prepare = prepare
    async def prompt_ids(self, messages, tools=(), *, param="messages", template_kwargs=None):
        started = time.perf_counter()
        text = render_prompt(self.info, self.family, messages, list(tools), template_kwargs=template_kwargs)
        request = REQ.get()
        if request is not None:
            SENT.set(True)
            drive(request.send({"type": "http.response.start", "status": 200, "headers": S._SSE_HEAD}))
            drive(request.send({"type": "http.response.body", "body": b": ok\n\n", "more_body": True}))
        ids = self.info.tokenizer.encode(text)
        if (trace := metrics.trace.get()) is not None:
            trace.add("prompt", time.perf_counter() - started)
        return ids, text
    S.Serving.prompt_ids = prompt_ids
from lingcode.cli import main
sys.exit(main(sys.argv[1:]))
