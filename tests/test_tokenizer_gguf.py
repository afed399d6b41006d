"""The tokenizer built from a GGUF gives llama.cpp's ids: Qwen2.5-Coder's ("qwen2") and SmolLM2's ("smollm").

llama.cpp's ids come from tests/data/qwen2_tokens.json (recorded by tests/data/record_qwen2_tokens.py
with llama-cpp-python 0.3.36), and live from llama.cpp itself where .venv-llama-cpp holds it.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "qwen2_tokens.json"
RECORDER = ROOT / "tests" / "data" / "record_qwen2_tokens.py"
LLAMA_PYTHON = ROOT / ".venv-llama-cpp" / "bin" / "python"

QWEN_SPECIAL = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
    "</tool_call>": 151658, "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662, "<|repo_name|>": 151663, "<|file_sep|>": 151664,
}  # fmt: skip


def gguf_tokenizer(path: Path):
    """The tokenizer from the GGUF's metadata alone, read as lingcode.engine.local.weights reads it."""
    from gguf import GGUFReader

    from lingcode.engine.local.weights import _gguf_field
    from lingcode.text.tokenizer import Tokenizer

    reader = GGUFReader(str(path))
    fields = {key: _gguf_field(reader, key) for key in reader.fields if key.startswith("tokenizer.ggml.")}
    return Tokenizer.from_gguf_fields(fields)


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_path):
    return gguf_tokenizer(qwen_path)


@pytest.fixture(scope="module")
def recorded() -> list[dict]:
    return json.loads(DATA.read_text(encoding="utf-8"))["texts"]


def mismatches(tokenizer, texts: list[str], expected: list[list[int]]) -> list[str]:
    """A line per text whose ids differ, with the first token where they part."""
    lines = []
    for text, want in zip(texts, expected, strict=True):
        got = tokenizer.encode(text)
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            pieces = lambda ids: [tokenizer.id_to_token(i) for i in ids[max(0, at - 2) : at + 3]]  # noqa: E731
            lines.append(f"{text[:60]!r}: token {at}: lingcode {pieces(got)}, llama.cpp {pieces(want)}")
    return lines


def test_qwen2_gguf_tokenizer_gives_llama_cpps_recorded_ids(qwen_tokenizer, recorded):
    assert qwen_tokenizer.vocab_size == 151_936
    texts, ids = [r["text"] for r in recorded], [r["ids"] for r in recorded]
    assert sum(map(len, ids)) > 3000
    assert mismatches(qwen_tokenizer, texts, ids) == []


def test_qwen2_special_tokens_are_single_ids_in_encode_and_text_in_encode_text(qwen_tokenizer):
    tok = qwen_tokenizer
    for name, token_id in QWEN_SPECIAL.items():
        assert tok.token_to_id(name) == token_id
        assert tok.encode(f"a{name}b") == [*tok.encode("a"), token_id, *tok.encode("b")]
        # User content keeps control tokens' text as text; <tool_call> and </tool_call> are the GGUF's
        # user-defined tokens, which llama.cpp takes as tokens even then (special=False), and so does encode_text.
        user_defined = name in ("<tool_call>", "</tool_call>")
        assert (token_id in tok.encode_text(f"a {name} b")) == user_defined
        assert (token_id in tok.special_ids) == (not user_defined)
    prompt = "<|fim_prefix|>def f():\n    <|fim_suffix|>\n<|fim_middle|>"
    assert [i for i in tok.encode(prompt) if i in tok.special_ids] == [151659, 151661, 151660]


def test_qwen2_ids_decode_back_to_the_text(qwen_tokenizer, recorded):
    tok = qwen_tokenizer
    table = tok.token_bytes
    assert table is not None and len(table) == 151_936
    assert table[151659] == b"<|fim_prefix|>" and table[tok.encode(" the")[0]] == b" the"
    for text in (r["text"] for r in recorded):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert b"".join(table[i] for i in ids).decode() == text


def test_qwen2_tokenizer_pickled_or_copied_keeps_llama_cpps_ids(qwen_tokenizer, recorded):
    """A prepared model pickles its tokenizer, and encode_text copies it through tokenizers' JSON:
    both keep the pre-tokenizer (its onig classes) and so the ids."""
    import pickle

    copy = pickle.loads(pickle.dumps(qwen_tokenizer))
    control = [qwen_tokenizer.id_to_token(i) for i in qwen_tokenizer.special_ids]
    for r in recorded:
        assert copy.encode(r["text"]) == r["ids"]
        if not any(name in r["text"] for name in control):
            assert qwen_tokenizer.encode_text(r["text"]) == r["ids"]


def random_texts(seed: int, count: int) -> list[str]:
    """Strings of code, whitespace, contractions, special-token text and any code point at all."""
    rng = random.Random(seed)
    pool = [
        "a",
        "Z",
        "hello",
        " world",
        "def",
        "'s",
        "'S",
        "'LL",
        "'re",
        "'Ve",
        "'",
        "''",
        "7",
        "12",
        "2024",
        " ",
        "  ",
        "\t",
        "\n",
        "\n\n",
        "\r",
        "\r\n",
        "\x0b",
        "\x0c",
        "\x85",
        "\xa0",
        "\u3000",
        "\u2028",
        "\x04",
        "\x1d",
        "(",
        ")",
        "{}",
        "...",
        "->",
        "==",
        "#",
        '"',
        "`",
        "中文",
        "日本",
        "한",
        "😀",
        "👨\u200d👩\u200d👧",
        "🇫🇷",
        "e\u0301",
        "\u0301",
        "ال",
        "١٢",
        "²",
        "Ⅻ",
        "ſ",
        "\U00013460",
        "\U00016d70",
        "<|im_start|>",
        "<|im_end|>",
        "<|fim_middle|>",
        "<tool_call>",
        "<|im_",
        "|>",
        "<|endoftext|>",
    ]
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(1, 24)):
            if rng.random() < 0.25:
                cp = rng.randrange(0x110000 if rng.random() < 0.3 else 0x30000)
                parts.append(chr(cp) if not 0xD800 <= cp < 0xE000 else "\ufffd")
            else:
                parts.append(rng.choice(pool))
        texts.append("".join(parts))
    return texts


def code_point_probes() -> list[str]:
    """Each code point of planes 0-3 and of 14's start (all that Unicode assigns, bar planes 15-16's
    private use) as "a{c}'s ": split as a letter, a digit, a space or none of those, it gives other
    ids. In texts of 4096 probes, so that a mismatch names the block it is in."""
    points = [c for c in range(0x40000) if not 0xD800 <= c < 0xE000] + list(range(0xE0000, 0xE1000))
    return ["".join(f"a{chr(c)}'s " for c in points[i : i + 4096]) for i in range(0, len(points), 4096)]


@pytest.mark.skipif(not LLAMA_PYTHON.exists(), reason="no llama.cpp to compare with: .venv-llama-cpp/bin/python")
@pytest.mark.parametrize("model", ["qwen", "smollm"])
def test_gguf_tokenizer_gives_llama_cpps_ids_live(model, request, recorded):
    if model == "qwen":
        path, tokenizer = request.getfixturevalue("qwen_path"), request.getfixturevalue("qwen_tokenizer")
    else:
        path = request.getfixturevalue("model_path")
        tokenizer = gguf_tokenizer(path)
    texts = [r["text"] for r in recorded] + random_texts(seed=20241206, count=1500) + code_point_probes()
    done = subprocess.run(
        [str(LLAMA_PYTHON), str(RECORDER), "--stdin", str(path)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout)
    assert len(expected) == len(texts)
    assert mismatches(tokenizer, texts, expected) == []
