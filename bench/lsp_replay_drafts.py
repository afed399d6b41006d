"""The n-gram drafter with and without the last requests' outputs, on the LSP bench's own engine calls.

Replays `lingcode bench lsp --start-line 77` in one process: the same 300 keystrokes into
lingcode/pipeline/scheduler.py, the LSP's request body (Completer._body), the daemon's prompt and cut rules,
and the typed-ahead cache, so the same 142 calls reach the engine. Each call runs twice, once with
each drafter (its own, so each sees only its own history; the order alternates), and the two
outputs must be equal (drafts are verified). Reports forward passes, which do not depend on the
machine's speed, and engine time per call.

python3 bench/lsp_replay_drafts.py     (compiles the decode step first: ~2.5 minutes on 2 cores)
"""

import asyncio
import collections
import statistics
import time
from dataclasses import replace

from lingcode import models
from lingcode.completion.cuts import CutRules
from lingcode.completion.prompt import Budgets, CompletionInput, build_prompt
from lingcode.engine import SamplingParams
from lingcode.engine.local import load_engine
from lingcode.engine.local.speculative import NGramDrafter
from lingcode.pipeline.generation import generate_text
from lingcode.lsp.completer import Completer, Cursor, Settings
from lingcode.lsp.typed_ahead import TypedAheadCache
from lingcode.pipeline.scheduler import Priority, Scheduler

FILE, START_LINE, CHARS = "lingcode/pipeline/scheduler.py", 77, 300

engine = load_engine(models.ensure(models.DEFAULT_MODEL), device="cpu", compile=True)
scheduler = Scheduler(engine)
tok = engine.info.tokenizer
newline_ids = frozenset(i for i in range(tok.vocab_size) if "\n" in tok.decode([i]))
without_recent = NGramDrafter()
without_recent.recent = collections.deque(maxlen=0)
drafters = {"without recent outputs": without_recent, "with recent outputs": NGramDrafter()}


async def complete(body: dict, drafter: NGramDrafter, request_id: str) -> tuple[str, float, int]:
    """One engine call as the daemon's completion route makes it: text, ms, forward passes."""
    engine._ngram = drafter
    prompt = build_prompt(engine.info, CompletionInput(prefix=body["prefix"], suffix=body["suffix"], path=body["path"],
                                                       language=body["language"]), Budgets())  # fmt: skip
    params = SamplingParams(body["max_tokens"], temperature=0.0)
    cut = CutRules(body["prefix"], body["suffix"], multiline=body["multiline"], time_budget_ms=body["time_budget_ms"])
    if cut.single_line:
        params = replace(params, final_token_ids=newline_ids)
    passes = engine.stats()["forward_passes"]
    started, text = time.perf_counter(), ""
    stream = generate_text(scheduler, tok, request_id, prompt.input_ids, params, cut=cut,
                           priority=Priority.COMPLETION, latest_wins="bench")  # fmt: skip
    async for chunk in stream:
        text += chunk.text
        if chunk.finish_reason is not None:
            break
    await stream.aclose()
    return text, (time.perf_counter() - started) * 1e3, engine.stats()["forward_passes"] - passes


async def main() -> None:
    engine.set_speculation("ngram")
    source = open(FILE).read()
    start = sum(len(line) for line in source.splitlines(keepends=True)[:START_LINE])
    typed = source[start : start + CHARS]
    document, offset = source[:start] + source[start + CHARS :], start
    completer, cache = Completer(None, Settings(), print), TypedAheadCache()
    ms = {name: [] for name in drafters}
    passes = dict.fromkeys(drafters, 0)
    for i, char in enumerate([""] + list(typed)):  # "" is the first request, before any keystroke
        document, offset = document[:offset] + char + document[offset:], offset + len(char)
        prefix, suffix = document[:offset], document[offset:]
        if cache.get(prefix, suffix) is not None:
            continue
        cursor = Cursor("file:///bench.py", document, offset, prefix.count("\n"), FILE, "python")
        body = completer._body(cursor)
        names = list(drafters) if i % 2 else list(drafters)[::-1]
        texts = set()
        for name in names:
            text, took, n = await complete(body, drafters[name], f"{i}-{name}")
            texts.add(text)
            passes[name] += n
            if i:  # the first (cold) call prefills the whole prompt
                ms[name].append(took)
        assert len(texts) == 1, texts
        cache.put(prefix, suffix, texts.pop())
    (a, b) = drafters
    for name in drafters:
        print(f"{name}: {len(ms[name])} engine calls, {passes[name]} forward passes, "
              f"median {statistics.median(ms[name]):.1f} ms, mean {statistics.mean(ms[name]):.1f} ms")
    print(f"{b} / {a}: forward passes {passes[b] / passes[a]:.3f}, total engine time {sum(ms[b]) / sum(ms[a]):.3f}")


asyncio.run(main())
