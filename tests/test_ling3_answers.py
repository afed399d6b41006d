"""Ling-3.0 answers through lingcode as SGLang 0.5.23's own server gives them: reasoning, tool calls, thinking switches.

With `--engine sglang` lingcode renders the prompt and parses the output itself, so these are the
production path of every agent turn. The oracle is SGLang's own code (tests/sglang_ling3_oracle.py:
its ling3 reasoning and tool-call parsers, run as its OpenAI server runs them), on a corpus of
Ling-3.0 outputs. lingcode's side is the real thing: one `lingcode serve --engine sglang` daemon,
attached to tests/sglang_wire.py's replay server, which streams each output as token ids in
SGLang's wire format, in random steps of 1 to 9 tokens (what a DSpark verify step accepts); the
answers come through the official openai and anthropic clients: OpenAI chat, Anthropic Messages
and Responses, each whole and streamed, each with that API's own thinking switch.

Compared: the reasoning exactly; the answer text without the whitespace at its ends (lingcode
drops the answer's leading whitespace after `</think>`, and whitespace alone around calls); the
tool calls' names and arguments. Where lingcode keeps a rule of its own, the case says so:
a call cut off by max_tokens is returned with the arguments that arrived whole (SGLang's whole
reply drops it, keeping its raw text as the answer if no call completed; its stream gives the
arguments cut mid-value).

The model directory is made here: a byte-level tokenizer with Ling-3.0's tags as tokens, and a
Ling-3.0-shaped chat template written for this test (the real one comes with the checkpoint):
the parts that matter are its thinking switch (`enable_thinking`, else its own `thinking_option`,
"on" by default) and its generation prompt, which opens `<think>` when thinking is on and writes
`<think></think>` when it is off.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

import sglang_wire as wire

ORACLE = Path(__file__).with_name("sglang_ling3_oracle.py")
EOS = "<|role_end|>"
TAGS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<role>",
    "</role>",
]

TEMPLATE = (
    "{%- if enable_thinking is defined %}{% set thinking_option = 'on' if enable_thinking else 'off' %}"
    "{%- elif thinking_option is not defined %}{% set thinking_option = 'on' %}{% endif %}"
    "{{- '<role>SYSTEM</role>' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\n' }}{% endif %}"
    "{%- if tools %}{{ '# Tools\n\nYou may call one or more functions.\n<tools>' }}"
    "{%- for tool in tools %}{{ '\n' + tool | tojson }}{% endfor %}"
    "{{- '\n</tools>\nCall a function as:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n...\n</tool_call>\n' }}{% endif %}"
    "{{- 'detailed thinking ' + thinking_option + '<|role_end|>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{ '<role>HUMAN</role>' + message.content + '<|role_end|>' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<role>ASSISTANT</role>\n<think>' + (message.reasoning_content or '') + '</think>' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}{{ '\n<tool_call>' + call.function.name + '\n' }}"
    "{%- for k, v in call.function.arguments.items() %}"
    "{{ '<arg_key>' + k + '</arg_key>\n<arg_value>' + (v if v is string else v | tojson) + '</arg_value>\n' }}"
    "{%- endfor %}{{ '</tool_call>' }}{% endfor %}{{ '<|role_end|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<role>OBSERVATION</role>\n<tool_response>\n' + message.content + '\n</tool_response><|role_end|>' }}"
    "{%- endif %}{% endfor %}"
    "{%- if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}"
    "{%- if thinking_option == 'on' %}{{ '\n<think>' }}{% elif thinking_option == 'off' %}{{ '\n<think></think>' }}{% endif %}"
    "{%- endif %}"
)

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
}
FILES = {
    "name": "list_files",
    "description": "The files under a path",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "recursive": {"type": "boolean"}}},
}
TOOLS = [WEATHER, FILES]


def call(name: str, **args) -> str:
    return (
        f"<tool_call>{name}\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items())
        + "</tool_call>"
    )


PARIS, SRC = call("get_weather", city="Paris", days=3), call("list_files", path="src/", recursive="true")


@dataclass(frozen=True)
class Case:
    name: str
    text: str  # what the model writes after the prompt
    thinking: bool = True  # whether the request leaves thinking on
    tools: bool = False  # whether the request offers TOOLS
    finish: str = "stop"  # "length": max_tokens cut it
    cut_call: tuple[str, dict] | None = None  # the call max_tokens cut off, as lingcode gives it


CORPUS = [
    Case("answer after thinking", "The user asks for 6*7. That is 42.</think>The answer is 42."),
    Case("newlines around the answer", "Simple arithmetic.\n</think>\n\nThe answer is **42**.\n"),
    Case("thinking, no call though tools are offered", "No tool is needed.</think>Paris is in France.", tools=True),
    Case("call after </think>", "I need the weather in Paris.</think>\n" + PARIS, tools=True),
    Case("call without </think>", "I need the weather in Paris.\n" + PARIS, tools=True),
    Case("text then two calls", "Two lookups.</think>Let me check both.\n" + PARIS + "\n" + SRC, tools=True),
    Case("two calls without </think>", "Two lookups needed.\n" + PARIS + "\n" + SRC, tools=True),
    Case("call without arguments", "List them.</think>\n<tool_call>list_files\n</tool_call>", tools=True),
    Case("non-ASCII", "Der Nutzer fragt nach 東京 🌧.</think>\n" + call("get_weather", city="東京", days=2), tools=True),
    Case("only thinking, cut off", "Let me think about this carefully. First, the loop runs n times, so", finish="length"),
    Case("only thinking, ended", "I am not sure what the user means."),
    Case("only thinking, tools offered, cut off", "I should look at the files first, then", tools=True, finish="length"),
    Case("thinking closed on an empty answer", "Nothing more to say.</think>"),
    Case("cut off inside </think>", "Almost done</thi", finish="length"),
    Case("its own <think> although the prompt opened one", "<think>Hmm, recursion.</think>Use a stack instead."),
    Case("<think></think> then the answer", "<think></think>Plain answer without reasoning."),
    Case("</think> at once", "</think>Straight to the answer."),
    Case("cut off inside a call", "Weather first.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
         tools=True, finish="length", cut_call=("get_weather", {})),
    Case("cut off after one call", "Both.</think>\n" + PARIS + "\n<tool_call>list_files\n<arg_key>path</arg_key>\n<arg_value>src/"
         "</arg_value>\n<arg_key>recur", tools=True, finish="length", cut_call=("list_files", {"path": "src/"})),
    Case("thinking off: answer", "The answer is 42.", thinking=False),
    Case("thinking off: answer, tools offered", "Paris is in France.", thinking=False, tools=True),
    Case("thinking off: call", PARIS, thinking=False, tools=True),
    Case("thinking off: text then calls", "Checking.\n" + PARIS + "\n" + SRC, thinking=False, tools=True),
    Case("thinking off: cut off", "The answer is", thinking=False, finish="length"),
    Case("thinking off, yet a <think> block of its own", "<think>Quick check.</think>Fine.", thinking=False),
    Case("thinking off: cut off inside a call", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Os",
         thinking=False, tools=True, finish="length", cut_call=("get_weather", {})),
]  # fmt: skip
SEEDS = (0, 1)  # two chunkings of each output; each seed also picks which form of each API's switch is sent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "Ling-3.0-flash"
    path.mkdir()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens([AddedToken(tag, normalized=False) for tag in TAGS])
    tokenizer.add_special_tokens([EOS])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(
        json.dumps({"architectures": ["BailingMoeV3ForCausalLM"], "max_position_embeddings": 32768})
    )
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "chat_template": TEMPLATE}))
    return path


@pytest.fixture(scope="module")
def tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def replay():
    replay = wire.Replay(step_s=0)
    server = wire.serve(replay)
    replay.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield replay
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def daemon(model_dir, replay, tmp_path_factory):
    """`lingcode serve --engine sglang` attached to the replay server: (url, token)."""
    home = tmp_path_factory.mktemp("home")
    log = home / "daemon.log"
    command = [
        sys.executable,
        "-m",
        "lingcode",
        "serve",
        "--engine",
        "sglang",
        "--engine-url",
        replay.url,
        "--model",
        str(model_dir),
        "--port",
        "0",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, env={**os.environ, "LINGCODE_HOME": str(home)}, stdout=out, stderr=subprocess.STDOUT
        )
    record = home / "state" / "daemon.json"
    try:
        wait_for_file(record, process, log)
        daemon = json.loads(record.read_text())
        yield daemon["url"], Path(daemon["token_file"]).read_text().strip()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()


def wait_for_file(path: Path, process: subprocess.Popen, log: Path) -> None:
    for _ in range(600):
        if path.exists():
            return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    pytest.fail(f"the daemon did not get ready:\n{log.read_text()}")


def plan(case: Case, seed: int, tokenizer: Tokenizer) -> tuple[list[bytes], list[str], int]:
    """The replay's events for the output (cumulative output_ids, as SGLang streams them), the text
    deltas SGLang's server would see at the same steps, and the output's length in tokens."""
    ids = tokenizer.encode(case.text, add_special_tokens=False).ids
    rng = random.Random(zlib.crc32(f"{case.name}/{seed}".encode()))
    ends, end = [], 0
    while end < len(ids):
        end = min(len(ids), end + rng.randint(1, 9))
        ends.append(end)
    eos = tokenizer.token_to_id(EOS)
    events, deltas, shown = [], [], ""
    for i, end in enumerate(ends):
        out = ids[:end]
        text = tokenizer.decode(out).rstrip("\ufffd")  # a character still partial is held back
        deltas.append(text[len(shown) :])
        shown = text
        finish = None
        if i == len(ends) - 1:
            if case.finish == "length":
                finish = {"type": "length", "length": len(ids)}
            else:
                out, finish = out + [eos], {"type": "stop", "matched": eos}
        events.append(wire.event({"text": text, "output_ids": out, "meta_info": wire.meta("r", len(out), finish)}))
    return events + [wire.DONE], deltas, len(ids)


@pytest.fixture(scope="module")
def oracle(tokenizer) -> dict[tuple[str, int], dict]:
    """SGLang's answers for every case and chunking, from one child process."""
    keys = [(case, seed) for case in CORPUS for seed in SEEDS]
    cases = [
        {
            "deltas": plan(case, seed, tokenizer)[1],
            "thinking": case.thinking,
            "tools": TOOLS if case.tools else [],
            "finish": case.finish,
        }
        for case, seed in keys
    ]
    done = subprocess.run(
        [sys.executable, str(ORACLE)], input=json.dumps(cases), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {(case.name, seed): answer for (case, seed), answer in zip(keys, json.loads(done.stdout))}


@dataclass
class Answer:
    reasoning: str = ""
    content: str = ""
    calls: list = None

    def __post_init__(self):
        self.calls = self.calls if self.calls is not None else []

    def compared(self) -> tuple:
        return self.reasoning, self.content.strip(), [(name, args) for name, args in self.calls]


def expected(case: Case, answer: dict) -> tuple:
    content, calls = answer["content"], [(name, args) for name, args in answer["calls"]]
    if case.cut_call:  # lingcode's own rule: the call as far as it came, its raw text not in the answer
        content, calls = content.split("<tool_call>")[0], calls + [case.cut_call]
    return answer["reasoning"], content.strip(), calls


# --- the three APIs, each with its own thinking switch; seed picks which form is sent --------------------------


def openai_chat(client: openai.OpenAI, case: Case, seed: int, max_tokens: int, stream: bool) -> Answer:
    switch = {}
    if not case.thinking:
        switch = (
            {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
            if seed == 0
            else {"reasoning_effort": "none"}
        )
    elif seed == 1:
        switch = {"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}}
    tools = {"tools": [{"type": "function", "function": t} for t in TOOLS]} if case.tools else {}
    reply = client.chat.completions.create(
        model="ling-3",
        messages=[{"role": "user", "content": "Question?"}],
        max_tokens=max_tokens,
        stream=stream,
        **tools,
        **switch,
    )
    if not stream:
        message = reply.choices[0].message
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        return Answer((message.model_extra or {}).get("reasoning_content") or "", message.content or "", calls)
    answer, calls = Answer(), {}
    for chunk in reply:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        answer.reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        answer.content += delta.content or ""
        for part in delta.tool_calls or []:
            name, args = calls.get(part.index, ("", ""))
            calls[part.index] = (name + (part.function.name or ""), args + (part.function.arguments or ""))
    answer.calls = [(name, json.loads(args)) for _, (name, args) in sorted(calls.items())]
    return answer


def anthropic_messages(client: anthropic.Anthropic, case: Case, seed: int, max_tokens: int, stream: bool) -> Answer:
    switch = {}
    if not case.thinking:
        switch = {"thinking": {"type": "disabled"}}
    elif seed == 1:
        switch = {"thinking": {"type": "enabled", "budget_tokens": 2048}}
    tools = {
        "tools": [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]
    }
    reply = client.messages.create(
        model="claude-ling",
        messages=[{"role": "user", "content": "Question?"}],
        max_tokens=max_tokens,
        stream=stream,
        **(tools if case.tools else {}),
        **switch,
    )
    answer = Answer()
    if not stream:
        for block in reply.content:
            if block.type == "thinking":
                answer.reasoning += block.thinking
            elif block.type == "text":
                answer.content += block.text
            elif block.type == "tool_use":
                answer.calls.append((block.name, block.input))
        return answer
    inputs: dict[int, list] = {}
    for event in reply:
        if event.type == "content_block_start" and event.content_block.type == "tool_use":
            inputs[event.index] = [event.content_block.name, ""]
        elif event.type == "content_block_delta":
            delta = event.delta
            if delta.type == "thinking_delta":
                answer.reasoning += delta.thinking
            elif delta.type == "text_delta":
                answer.content += delta.text
            elif delta.type == "input_json_delta":
                inputs[event.index][1] += delta.partial_json
    answer.calls = [(name, json.loads(args)) for _, (name, args) in sorted(inputs.items())]
    return answer


def responses(client: openai.OpenAI, case: Case, seed: int, max_tokens: int, stream: bool) -> Answer:
    switch = {}
    if not case.thinking:
        switch = (
            {"reasoning": {"effort": "none"}}
            if seed == 0
            else {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
        )
    elif seed == 1:
        switch = {"reasoning": {"effort": "high"}}
    tools = {"tools": [{"type": "function", **t} for t in TOOLS]} if case.tools else {}
    reply = client.responses.create(
        model="ling-3", input="Question?", max_output_tokens=max_tokens, stream=stream, **tools, **switch
    )
    answer = Answer()
    if not stream:
        for item in reply.output:
            if item.type == "reasoning":
                answer.reasoning += "".join(part.text for part in item.content or [])
            elif item.type == "message":
                answer.content += "".join(part.text for part in item.content)
            elif item.type == "function_call":
                answer.calls.append((item.name, json.loads(item.arguments)))
        return answer
    calls: dict[int, list] = {}
    for event in reply:
        if event.type == "response.reasoning_text.delta":
            answer.reasoning += event.delta
        elif event.type == "response.output_text.delta":
            answer.content += event.delta
        elif event.type == "response.output_item.added" and event.item.type == "function_call":
            calls[event.output_index] = [event.item.name, ""]
        elif event.type == "response.function_call_arguments.delta":
            calls[event.output_index][1] += event.delta
    answer.calls = [(name, json.loads(args)) for _, (name, args) in sorted(calls.items())]
    return answer


@pytest.fixture(scope="module")
def clients(daemon):
    url, token = daemon
    return (
        openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=60),
        anthropic.Anthropic(base_url=url, api_key=token, max_retries=0, timeout=60),
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_answers_are_sglangs(case, seed, clients, replay, tokenizer, oracle):
    chat, messages = clients
    events, _, n_tokens = plan(case, seed, tokenizer)
    replay.generate = lambda rid, body: events
    max_tokens = n_tokens if case.finish == "length" else 1024
    sglang = oracle[(case.name, seed)]
    for api, ask, client in (
        ("openai chat", openai_chat, chat),
        ("anthropic messages", anthropic_messages, messages),
        ("responses", responses, chat),
    ):
        for stream in (False, True):
            got = ask(client, case, seed, max_tokens, stream)
            prompt = tokenizer.decode(replay.requests[-1]["input_ids"], skip_special_tokens=False)
            assert prompt.endswith("<role>ASSISTANT</role>\n<think>" + ("" if case.thinking else "</think>")), (
                api,
                prompt[-80:],
            )
            want = expected(case, sglang["stream" if stream else "whole"])
            assert got.compared() == want, f"{api}, {'streamed' if stream else 'whole'}"


def test_the_corpus_covers_what_sglang_treats_apart(oracle):
    """A guard on the corpus: the SGLang rules this contract is about do show in its answers."""
    whole = {name: answer["whole"] for (name, seed), answer in oracle.items() if seed == 0}
    stream = {name: answer["stream"] for (name, seed), answer in oracle.items() if seed == 0}
    only = "only thinking, cut off"
    assert whole[only]["reasoning"] == "" and whole[only]["content"].startswith("Let me think")  # the fallback
    assert stream[only]["reasoning"] == stream[only]["content"]  # streamed: reasoning, then the same as answer
    assert whole["<think></think> then the answer"] == {
        "reasoning": "",
        "content": "Plain answer without reasoning.",
        "calls": [],
    }
    assert (
        whole["call without </think>"]["calls"] and whole["two calls without </think>"]["calls"][1][0] == "list_files"
    )
    # thinking off: the output is the answer from its first token, unless the model opens a block itself
    assert [c.name for c in CORPUS if not c.thinking and whole[c.name]["reasoning"]] == [
        "thinking off, yet a <think> block of its own"
    ]


def post(daemon, path: str, body: dict) -> httpx.Response:
    url, token = daemon
    return httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def test_ling3s_own_thinking_option(daemon, replay, tokenizer):
    """`thinking_option: "off"`, the template's own switch: the prompt says off, and the output is read
    as an answer from its first token (SGLang's server goes by enable_thinking alone, so it would
    stream this answer as reasoning)."""
    events, _, _ = plan(Case("x", "No thinking here."), 0, tokenizer)
    replay.generate = lambda rid, body: events
    reply = post(
        daemon,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Q"}],
            "stream": True,
            "chat_template_kwargs": {"thinking_option": "off"},
        },
    )
    prompt = tokenizer.decode(replay.requests[-1]["input_ids"], skip_special_tokens=False)
    assert "detailed thinking off" in prompt and prompt.endswith("<think></think>")
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    assert "".join(d.get("content") or "" for d in deltas) == "No thinking here."
    assert not any(d.get("reasoning_content") for d in deltas)


def test_count_tokens_renders_the_thinking_switch(daemon):
    body = {"model": "m", "messages": [{"role": "user", "content": "Q"}]}
    on = post(daemon, "/v1/messages/count_tokens", body).json()["input_tokens"]
    off = post(daemon, "/v1/messages/count_tokens", {**body, "thinking": {"type": "disabled"}}).json()["input_tokens"]
    assert off == on + 2  # "off" is a byte longer than "on" (a token a byte here), and `</think>` is one token


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/chat/completions", {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ("/v1/chat/completions", {"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs"),
        ("/v1/chat/completions", {"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        ("/v1/chat/completions", {"reasoning_effort": "extreme"}, "reasoning_effort"),
        ("/v1/responses", {"reasoning": {"effort": "max"}}, "reasoning.effort"),
        ("/v1/messages", {"thinking": {"type": "enabled"}}, "thinking"),
        ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
        ("/v1/messages", {"thinking": {"type": "disabled", "budget_tokens": 2048}}, "thinking"),
    ],
)
def test_bad_thinking_switches_are_400s_that_name_the_field(daemon, path, body, param):
    base = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Q"}]}
    if path == "/v1/responses":
        base = {"input": "Q"}
    reply = post(daemon, path, {**base, **body})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["message"].startswith(param + ":"), error
    assert error["type"] == "invalid_request_error"


def test_the_server_code_the_oracle_mirrors_is_still_sglangs():
    """A tripwire for SGLang upgrades: the lines of its server that tests/sglang_ling3_oracle.py runs as."""
    import importlib.util

    root = Path(importlib.util.find_spec("sglang").origin).parent / "srt"
    chat = (root / "entrypoints" / "openai" / "serving_chat.py").read_text()
    for line in (
        "reasoning_text, text = parser.parse_non_stream(text)",
        'if finish_reason_type is not None and finish_reason_type != "abort":',
        "end_reasoning_text, end_normal_text = reasoning_parser.parse_stream_end()",
        'if mode in ("thinking", "enable_thinking"):',
        "chat_template_kwargs[toggle_param] = enabled",
    ):
        assert line in chat, line
    parsers = (root / "parser" / "reasoning_parser.py").read_text()
    assert '"ling3": Ling3Detector,' in parsers and 'reasoning_default="enable_thinking"' in parsers
    anthropic_serving = (root / "entrypoints" / "anthropic" / "serving.py").read_text()
    assert 'enabled = anthropic_request.thinking.type != "disabled"' in anthropic_serving
