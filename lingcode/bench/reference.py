"""`lingcode bench reference`: lingcode's logits against llama.cpp's on the same GGUF.

Both engines are fed the same token ids (lingcode's tokenizer; tests/test_tokenizer_gguf.py holds it
to llama.cpp's) and give the logits of every position (teacher-forced). Per prompt: how often the
two pick the same next token (top-1 agreement), the mean and largest KL divergence from llama.cpp's
distribution to lingcode's, and how many greedy tokens the two generate alike from the prompt's
first half. llama.cpp runs in a process of its own (worker.py, --logits-all); lingcode's native step
in this one. Prompts are code that is neither lingcode's nor a benchmark's own: the standard
library's, and short files in other languages, plain and in a chat.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from lingcode.bench import source_commit, write_result

C_FILE = """#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growable byte buffer. */
struct buf {
    char *data;
    size_t len, cap;
};

static int buf_reserve(struct buf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->len + extra)
        cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data)
        return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

int buf_append(struct buf *b, const char *s, size_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}
"""
RUST_FILE = """use std::collections::HashMap;
use std::io::{self, BufRead};

/// Counts the words read from standard input and prints the ten most frequent.
fn main() -> io::Result<()> {
    let stdin = io::stdin();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for line in stdin.lock().lines() {
        for word in line?.split_whitespace() {
            let word = word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase();
            if !word.is_empty() {
                *counts.entry(word).or_insert(0) += 1;
            }
        }
    }
    let mut pairs: Vec<_> = counts.into_iter().collect();
    pairs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (word, count) in pairs.iter().take(10) {
        println!("{count:>8} {word}");
    }
    Ok(())
}
"""
JS_ANSWER = """Here is a debounce helper:

```javascript
function debounce(fn, wait) {
  let timer = null;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}
```

Each call restarts the timer, so `fn` runs once the calls stop for `wait` milliseconds."""


def prompts(tokenizer, chat_template: str | None, tokens: int) -> dict[str, list[int]]:
    """Token ids of each prompt, at most `tokens` long."""
    from lingcode.bench.decode import held_out_code

    out = {
        "python (stdlib)": held_out_code(tokenizer, tokens)[:tokens],
        "c": tokenizer.encode(C_FILE)[:tokens],
        "rust": tokenizer.encode(RUST_FILE)[:tokens],
    }
    if chat_template:
        from lingcode.text.chat_template import render_chat

        chat = render_chat(
            chat_template,
            [
                {"role": "user", "content": "Write a debounce function in JavaScript."},
                {"role": "assistant", "content": JS_ANSWER},
            ],
        )
        out["chat"] = tokenizer.encode(chat)[:tokens]
    return out


def compare(ours, theirs) -> dict:
    """Top-1 agreement and KL(llama.cpp || lingcode) per position, from [T, V] logits."""
    import torch

    p = torch.log_softmax(torch.as_tensor(theirs, dtype=torch.float64), -1)
    q = torch.log_softmax(ours.to(torch.float64), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    return {
        "positions": int(p.shape[0]),
        "top1": float((p.argmax(-1) == q.argmax(-1)).double().mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
    }


def run(model: Path, python: str, threads: int, tokens: int, continuation: int) -> dict:
    import asyncio

    import numpy as np
    import torch

    from lingcode.bench.decode import Worker
    from lingcode.engine import SamplingParams
    from lingcode.engine.local import load_engine

    torch.set_num_threads(threads)
    engine = load_engine(model, device="cpu", speculation="off")
    info = engine.info
    texts = prompts(info.tokenizer, info.chat_template, tokens)
    worker = Worker(
        "llama.cpp",
        [
            python,
            "-I",
            str(Path(__file__).with_name("worker.py")),
            "llama.cpp",
            "--model",
            str(model),
            "--threads",
            str(threads),
            "--logits-all",
            "--context",
            str(tokens + continuation + 64),
        ],
        threads,
    )

    async def greedy(ids: list[int]) -> list[int]:
        engine.reset_cache()
        out: list[int] = []
        params = SamplingParams(max_tokens=continuation, temperature=0.0, ignore_eos=True)
        async for chunk in engine.generate(f"reference-{len(ids)}", ids, params):
            out += chunk.token_ids
        return out

    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, ids in texts.items():
                path = str(Path(tmp) / "logits.npy")
                worker.ask({"logits": {"input_ids": ids, "path": path}})
                engine.reset_cache()
                with torch.inference_mode():
                    ours = engine.step(ids, 0, all_logits=True)
                row = {"prompt": name, **compare(ours, np.load(path))}
                head = ids[: len(ids) // 2]
                theirs = worker.ask({"request": {"input_ids": head, "max_tokens": continuation, "stop_ids": []}})
                mine, theirs = asyncio.run(greedy(head)), theirs["result"]["token_ids"]
                row["greedy_same"] = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), len(mine))
                row["greedy_tokens"] = len(mine)
                rows.append(row)
    finally:
        worker.close()
    positions = sum(r["positions"] for r in rows)
    total = {
        "top1": sum(r["top1"] * r["positions"] for r in rows) / positions,
        "kl_mean": sum(r["kl_mean"] * r["positions"] for r in rows) / positions,
        "kl_max": max(r["kl_max"] for r in rows),
        "positions": positions,
    }
    return {
        "model": info.name,
        "file": model.name,
        "commit": source_commit(),
        "threads": threads,
        "engine": info.extra,
        "llama_cpp": worker.ready["versions"],
        "prompts": rows,
        "total": total,
    }


def table(result: dict) -> str:
    lines = [
        f"# lingcode vs llama.cpp logits: {result['model']} ({result['file']})",
        "",
        f"commit {result['commit']}; lingcode {result['engine'].get('step')} step; llama.cpp {result['llama_cpp']}",
        "",
        "| prompt | positions | top-1 agreement | mean KL | max KL | greedy tokens alike |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["prompts"]:
        lines.append(
            f"| {r['prompt']} | {r['positions']} | {r['top1']:.1%} | {r['kl_mean']:.4f} | {r['kl_max']:.3f} | "
            f"{r['greedy_same']}/{r['greedy_tokens']} |"
        )
    t = result["total"]
    lines.append(f"| all | {t['positions']} | {t['top1']:.1%} | {t['kl_mean']:.4f} | {t['kl_max']:.3f} | |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    from lingcode import models
    from lingcode.bench.decode import check_peer, llama_cpp_python

    model = Path(args.model) if args.model and Path(args.model).exists() else models.ensure(args.model)
    python = llama_cpp_python(args.llama_cpp_python)
    problem = check_peer("llama.cpp", python, model)
    if problem:
        print(f"lingcode bench reference: {problem}", file=sys.stderr)
        return 2
    result = run(model, python, args.threads, args.tokens, args.continuation)
    print(table(result), end="")
    write_result(args.out, result, table(result))
    if args.json:
        print(json.dumps(result["total"]))
    return 0
