"""Warm costs quoted in the engine notes: the chat template rendered in Jinja's sandbox and
without it, and a body parsed by json.loads then validated against pydantic's model_validate_json.
Run with the default model in the cache: python warm_timings.py"""

import argparse
import inspect
import json
import os
import time

import gguf
import jinja2

from lingcode.server.openai.protocol import ChatCompletionRequest
from lingcode.server.validation import _float, _int, _not_json, parse
from lingcode.text import chat_template


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


path = os.path.expanduser("~/.cache/lingcode/models/SmolLM2-135M-Instruct.Q4_1.gguf")
field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
template = bytes(field.parts[field.data[0]]).decode()
messages = [{"role": "user", "content": "What is a hash map? Answer briefly."}]
variables = dict(messages=messages, add_generation_prompt=True, bos_token="", eos_token="", tools=None)
sandboxed = chat_template._compile(template)
plain = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]).from_string(template)
print(f"render: sandbox {per_call_us(lambda: sandboxed.render(**variables)):.1f} us, "
      f"plain {per_call_us(lambda: plain.render(**variables)):.1f} us")

short = json.dumps({"model": "x", "messages": messages, "max_tokens": 32, "stream": True, "temperature": 0}).encode()
source = inspect.getsource(argparse)
long_messages = [{"role": "system", "content": "You are a coding agent."}]
for i in range(18):
    long_messages += [{"role": "user", "content": source[i * 1500:(i + 1) * 1500]},
                      {"role": "assistant", "content": source[i * 1500:i * 1500 + 300]}]
long = json.dumps({"model": "x", "messages": long_messages, "max_tokens": 4, "stream": True}).encode()
for name, body in (("short", short), (f"{len(long) // 1024} KB", long)):
    loads = per_call_us(lambda: json.loads(body, parse_constant=_not_json, parse_int=_int, parse_float=_float), 500)
    both = per_call_us(lambda: parse(ChatCompletionRequest, json.loads(body, parse_constant=_not_json, parse_int=_int,
                                                                        parse_float=_float)), 500)
    rust = per_call_us(lambda: ChatCompletionRequest.model_validate_json(body), 500)
    print(f"{name}: json.loads {loads:.1f} us, then validated {both:.1f} us; model_validate_json {rust:.1f} us")
