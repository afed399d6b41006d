"""A model that codes, end to end in the embedded engine: Qwen2.5-Coder-0.5B-Instruct (qwen2: QKV
biases, GQA 14/2, Q5_0, Q8_0, Q4_K and Q6_K blocks, a 151,936-token BPE vocabulary) on the native CPU
step. It answers a coding question with code, fills in the middle of a function, drafts losslessly,
and, where the llama.cpp peer is built, gives llama.cpp's logits on the same file."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from conftest import serve, share_built_caches
from lingcode.engine import SamplingParams
from lingcode.text.chat_template import render_chat
from test_cpu_step import GO_FILE
from test_server import assert_error

REPO = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON = REPO / ".venv-llama-cpp" / "bin" / "python"


async def generate(
    engine, ids: list[int], max_tokens: int, speculation: str = "off", repetition_penalty: float = 1.0
) -> list[int]:
    engine.set_speculation(speculation)
    engine.reset_cache()
    out: list[int] = []
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, repetition_penalty=repetition_penalty)
    try:
        async for chunk in engine.generate(f"coding-{speculation}", ids, params):
            out += chunk.token_ids
    finally:
        engine.set_speculation("ngram")
    return out


def chat(engine, text: str) -> list[int]:
    return engine.info.tokenizer.encode(render_chat(engine.info.chat_template, [{"role": "user", "content": text}]))


def test_it_loads_on_the_native_step(qwen_engine):
    extra, step = qwen_engine.info.extra, qwen_engine.step
    assert extra["step"] == "native" and extra["kv_cache_dtype"] == "float16"
    cfg = qwen_engine.model.cfg
    assert (cfg.arch, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == ("qwen2", 24, 896, 14, 2, 64)
    assert qwen_engine.info.context_length == 32768
    tokenizer = qwen_engine.info.tokenizer
    assert {tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")} <= set(qwen_engine.info.eos_token_ids)
    assert step.drafts


async def test_it_answers_a_coding_question_with_code(qwen_engine):
    tokenizer = qwen_engine.info.tokenizer
    ids = chat(qwen_engine, "Write a Python function that checks whether a string is a palindrome.")
    text = tokenizer.decode(await generate(qwen_engine, ids, 80))
    assert "def " in text and "palindrome" in text, text


async def test_it_fills_in_the_middle(qwen_engine):
    tokenizer = qwen_engine.info.tokenizer
    prompt = (
        "<|fim_prefix|>def fib(n):\n    if n < 2:\n        return n\n<|fim_suffix|>\n\nprint(fib(10))\n<|fim_middle|>"
    )
    text = tokenizer.decode(await generate(qwen_engine, tokenizer.encode(prompt), 16))
    assert "fib(n-1) + fib(n-2)" in text.replace(" - ", "-"), text


async def test_greedy_drafts_equal_plain_decoding(qwen_engine):
    """A code edit copies most of its prompt: n-gram drafts are verified and kept, and the tokens are
    plain decoding's, one for one."""
    ids = chat(qwen_engine, f"Rename parseConfig to loadConfig and output the whole file:\n```go\n{GO_FILE}```")
    before = qwen_engine.stats()["accepted_draft_tokens"]
    plain = await generate(qwen_engine, ids, 96)
    assert await generate(qwen_engine, ids, 96, "ngram") == plain
    assert qwen_engine.stats()["accepted_draft_tokens"] - before >= 20


async def test_the_repetition_penalty_keeps_greedy_decoding_out_of_a_repeat(qwen_engine):
    """Greedy, the 0.5B model writes one line of its haiku three times; with the family's penalty
    (lingcode/data/families.toml) it writes three different lines."""
    tokenizer = qwen_engine.info.tokenizer
    ids = chat(qwen_engine, "Write a haiku about the sea.")

    def lines(tokens: list[int]) -> list[str]:
        return tokenizer.decode(tokens).removesuffix("<|im_end|>").splitlines()

    plain = lines(await generate(qwen_engine, ids, 20))
    assert plain[:3] == ["Whispers of the sea,"] * 2 + ["Whispers of the sea."], plain
    penalized = lines(await generate(qwen_engine, ids, 20, repetition_penalty=1.05))
    assert len(penalized) >= 3 and len({line.rstrip(",.") for line in penalized[:3]}) == 3, penalized


async def test_greedy_drafts_equal_plain_decoding_with_a_repetition_penalty(qwen_engine):
    """Each position of a verify step is penalized for the sequence up to it (the prompt, the
    tokens so far, the drafts before it): drafted or not, the same tokens."""
    ids = chat(qwen_engine, f"Rename parseConfig to loadConfig and output the whole file:\n```go\n{GO_FILE}```")
    before = qwen_engine.stats()["accepted_draft_tokens"]
    plain = await generate(qwen_engine, ids, 48, repetition_penalty=1.05)
    assert plain != await generate(qwen_engine, ids, 48)  # the penalty changed the answer
    assert await generate(qwen_engine, ids, 48, "ngram", repetition_penalty=1.05) == plain
    assert qwen_engine.stats()["accepted_draft_tokens"] - before >= 10


def test_the_daemon_fills_in_the_familys_sampling_defaults(qwen_path, tmp_path):
    """Qwen2.5-Coder's card (lingcode/data/families.toml): temperature 0.7, top_p 0.8, top_k 20 and
    a repetition penalty of 1.05 for what a request leaves out; a penalty out of (0, 2] is a 400."""
    daemon = serve(qwen_path, share_built_caches(tmp_path / "home"))
    haiku = [{"role": "user", "content": "Write a haiku about the sea."}]
    try:
        with httpx.Client(
            base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"}, timeout=120
        ) as http:

            def answer(route: str, **body) -> str:
                response = http.post(route, json=body)
                assert response.status_code == 200, response.text
                data = response.json()
                if route == "/v1/messages":
                    return data["content"][0]["text"]
                choice = data["choices"][0]
                return choice["message"]["content"] if route == "/v1/chat/completions" else choice["text"]

            chat = "/v1/chat/completions"
            # Greedy, the penalty left out is the family's: the haiku's lines differ (penalty 1: one line thrice).
            for route, extra in ((chat, {}), ("/v1/messages", {"model": "m"})):
                lines = answer(route, messages=haiku, max_tokens=20, temperature=0, **extra).splitlines()
                assert len(set(lines[:3])) == 3, (route, lines)
            repeated = answer(chat, messages=haiku, max_tokens=20, temperature=0, repetition_penalty=1).splitlines()
            assert len(set(line.rstrip(",.") for line in repeated[:3])) == 1, repeated
            # Seeded, the fields left out sample as the card's values sent.
            sent = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
            assert answer(chat, messages=haiku, max_tokens=12, seed=5) == answer(
                chat, messages=haiku, max_tokens=12, seed=5, **sent
            )
            response = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2})
            assert (response.json()["temperature"], response.json()["top_p"]) == (0.7, 0.8)
            for route, body in ((chat, {"messages": haiku}), ("/v1/responses", {"input": "hi"})):
                for bad in (0, -1, 2.5, "1.1"):
                    response = http.post(route, json={**body, "repetition_penalty": bad})
                    assert_error(response, 400, param="repetition_penalty")
    finally:
        daemon.process.send_signal(signal.SIGTERM)
        daemon.process.wait(timeout=30)


@pytest.mark.skipif(not LLAMA_CPP_PYTHON.exists(), reason="the llama.cpp peer is not built here (make llama-cpp-peer)")
def test_it_gives_llama_cpps_logits_on_the_same_file(qwen_path):
    """Teacher-forced over held-out code and a chat: the same next token at >= 98 % of positions and a
    mean KL divergence from llama.cpp's distribution <= 0.01 (lingcode bench reference)."""
    from lingcode.bench import reference

    result = reference.run(qwen_path, str(LLAMA_CPP_PYTHON), threads=2, tokens=240, continuation=24)
    total = result["total"]
    assert total["top1"] >= 0.98 and total["kl_mean"] <= 0.01, reference.table(result)


# --- through the daemon, as a client sees it -----------------------------------------------------


def fenced_python(text: str) -> str:
    """The first ```python block's code."""
    assert "```python\n" in text, text
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_daemon_answers_with_working_code(qwen_daemon):
    """The openai SDK, sampling left to the model's defaults (seeded): the answer's code block runs."""
    import openai

    client = openai.OpenAI(base_url=qwen_daemon.url + "/v1", api_key=qwen_daemon.token, max_retries=0, timeout=300)
    ask = "Write a Python function is_palindrome(s) that ignores case. Only the code, in one code block."
    answer = client.chat.completions.create(
        model="qwen2.5-coder-0.5b-instruct", messages=[{"role": "user", "content": ask}], seed=7, max_tokens=400
    )
    assert answer.model == "qwen2.5-coder-0.5b-instruct" and answer.choices[0].finish_reason == "stop"
    scope: dict = {}
    exec(fenced_python(answer.choices[0].message.content), scope)
    assert scope["is_palindrome"]("Level") and not scope["is_palindrome"]("lingcode")


def test_a_suffix_fills_in_the_middle_and_stops_at_a_control_token(qwen_daemon):
    """/v1/completions with `suffix`: Qwen's PSM prompt; the middle ends where the model ends it."""
    import openai

    client = openai.OpenAI(base_url=qwen_daemon.url + "/v1", api_key=qwen_daemon.token, max_retries=0, timeout=300)
    answer = client.completions.create(
        model="qwen2.5-coder-0.5b-instruct",
        prompt="def fib(n):\n    if n < 2:\n        return n\n",
        suffix="\n\nprint(fib(10))\n",
        temperature=0,
        max_tokens=64,
    )
    choice = answer.choices[0]
    assert "fib(n-1) + fib(n-2)" in choice.text.replace(" - ", "-"), choice.text
    assert choice.finish_reason == "stop" and "<|" not in choice.text and answer.usage.completion_tokens < 64
