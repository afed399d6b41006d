"""Scratch: read_json and parse() of cpu_client.py's request body, warm (in a loop, in process); us a call."""
import asyncio
import json
import time

from starlette.requests import Request

from lingcode.server.openai.protocol import ChatCompletionRequest
from lingcode.server.validation import parse, read_json

msgs = [{"role": "user", "content": "Write a Python function that parses an ISO 8601 duration like P3DT4H into seconds."}]
raw = json.dumps({"model": "x", "messages": msgs, "max_tokens": 4, "ignore_eos": True, "temperature": 0, "stream": True}).encode()
headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]


async def main(n: int = 3000) -> None:
    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    started = time.perf_counter()
    for _ in range(n):
        data = await read_json(Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive))
    print(f"read_json {(time.perf_counter() - started) / n * 1e6:.1f} us")
    started = time.perf_counter()
    for _ in range(n):
        parse(ChatCompletionRequest, data)
    print(f"parse {(time.perf_counter() - started) / n * 1e6:.1f} us")


asyncio.run(main())
