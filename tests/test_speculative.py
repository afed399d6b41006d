"""Speculative decoding is lossless: greedy output identical token for token, sampling distribution unchanged."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
import torch

from lingcode.text.chat_template import render_chat
from lingcode.engine import SamplingParams
from lingcode.engine.local.sampling import RepetitionPenalty, argmax
from lingcode.engine.local.speculative import DraftLength, NGramDrafter, verify_greedy, verify_sampled
from lingcode.pipeline.generation import generate_text
from lingcode.pipeline.scheduler import Scheduler

CODE = """def add(a, b):
    return a + b


def subtract(a, b):
    return a - b
"""

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is the capital of France?",
    f"Rename the functions in this code to use a `calc_` prefix and repeat the whole code:\n```python\n{CODE}```",
    f"Repeat this code exactly:\n```python\n{CODE}```",
    "List three colors.",
    "Explain recursion in one sentence.",
]


async def run(engine, speculation: str, prompt: str, params: SamplingParams) -> tuple[list[int], dict]:
    engine.set_speculation(speculation)
    info = engine.info
    ids = info.tokenizer.encode(render_chat(info.chat_template, [{"role": "user", "content": prompt}]))
    out: list[int] = []
    async for chunk in generate_text(Scheduler(engine), info.tokenizer, f"spec-{speculation}", ids, params):
        out += chunk.token_ids
    return out, engine.stats()["last_request"]


@pytest.fixture
def restore_speculation(engine):
    before = engine.speculation if engine.speculation != "early-exit" else f"early-exit:{engine.draft_layers}"
    yield
    engine.set_speculation(before)


async def test_greedy_output_is_identical_with_every_drafter(engine, restore_speculation):
    params = SamplingParams(max_tokens=32, temperature=0.0)
    accepted = 0
    for prompt in PROMPTS:
        plain, plain_stats = await run(engine, "off", prompt, params)
        assert plain_stats["draft_tokens"] == 0
        for speculation in ("ngram", "early-exit:10"):
            spec, stats = await run(engine, speculation, prompt, params)
            assert spec == plain, f"{speculation} changed the output for {prompt!r}"
            if speculation == "ngram":
                accepted += stats["accepted_draft_tokens"]
    assert accepted > 0


async def test_greedy_output_with_a_repetition_penalty_is_identical_with_every_drafter(engine, restore_speculation):
    params = SamplingParams(max_tokens=24, temperature=0.0, repetition_penalty=1.3)
    accepted = changed = 0
    for prompt in PROMPTS[2:4]:  # code the answer copies: drafts land, and the penalty has seen every token
        plain, _ = await run(engine, "off", prompt, params)
        changed += plain != (await run(engine, "off", prompt, dataclasses.replace(params, repetition_penalty=1.0)))[0]
        for speculation in ("ngram", "early-exit:10"):
            spec, stats = await run(engine, speculation, prompt, params)
            assert spec == plain, f"{speculation} changed the penalized output for {prompt!r}"
            accepted += stats["accepted_draft_tokens"]
    assert changed and accepted > 0


async def test_a_typed_tail_is_verified_with_its_draft_in_one_step_losslessly(engine, restore_speculation):
    """Prefix reuse leaves a few new prompt tokens (a typed character, a completion's cursor moving
    on); with drafts on they are fed together with a draft of what follows, in one step. The output
    is what plain decoding gives, and the request makes no forward pass beyond its verify steps."""
    params = SamplingParams(max_tokens=24, temperature=0.0)
    text = "# utilities\n" + CODE + "\n\n" + CODE.replace("add", "plus").replace("subtract", "minus")
    ids = engine.info.tokenizer.encode(text)
    outputs, merged = {}, 0
    for speculation in ("off", "ngram"):
        engine.set_speculation(speculation)
        engine.reset_cache()
        outputs[speculation] = []
        for cut in (len(ids) - 12, len(ids) - 9, len(ids) - 4):  # then 3 new tokens, then 5
            before = engine.stats()["forward_passes"]
            out: list[int] = []
            async for chunk in engine.generate(f"tail-{speculation}-{cut}", ids[:cut], params):
                out += chunk.token_ids
            last = engine.stats()["last_request"]
            outputs[speculation].append(out)
            passes = engine.stats()["forward_passes"] - before
            if speculation == "ngram" and passes == last["decode_steps"]:  # no prefill pass: the tail
                # rode along with the first draft (plain decoding: a prefill pass, then a step a token)
                merged += 1
    assert outputs["ngram"] == outputs["off"]
    assert merged >= 2, "the new tail was not verified with a draft"


async def test_ngram_drafts_pay_off_when_the_answer_copies_the_prompt(engine, restore_speculation):
    params = SamplingParams(max_tokens=48, temperature=0.0)
    # The draft length follows the step costs timed at load, which a busy machine skews (a clean
    # clone once drafted 8 accepted tokens here, another 10): fixed for this request, so the count
    # depends on the drafter alone. Drafting as cheap as a plain step: DraftLength's own tests cover costs.
    measured = engine.step_cost, engine.step_cost_per_position
    engine.step_cost, engine.step_cost_per_position = [measured[0][0]] * len(measured[0]), [0.0] * len(measured[0])
    try:
        _, stats = await run(engine, "ngram", PROMPTS[3], params)
    finally:
        engine.step_cost, engine.step_cost_per_position = measured
    # Each verify step emitted more than one token on average: fewer target forwards than tokens.
    assert stats["accepted_draft_tokens"] >= 10
    assert stats["decode_steps"] < stats["generated_tokens"] - 1
    assert stats["accept_length"] > 1.0


async def test_sampled_speculation_runs_and_respects_max_tokens(engine, restore_speculation):
    params = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=7)
    tokens, stats = await run(engine, "ngram", PROMPTS[3], params)
    assert len(tokens) <= 20 and stats["generated_tokens"] == len(tokens)


def test_ngram_drafter_copies_what_followed_the_latest_match():
    drafter = NGramDrafter(max_n=3, min_n=2)
    drafter.start([5, 6, 7, 8, 9, 1, 5, 6])
    assert drafter.propose(3) == ([7, 8, 9], None)
    drafter.extend([7, 8, 9, 2])
    assert drafter.propose(2) == ([], None)  # (9, 2) / (8, 9, 2) never occurred before


def test_ngram_drafter_started_again_indexes_as_a_fresh_one():
    """start() winds the index back to the prefix it shares with the last sequence (from the copy
    finish() wound back to the prompt, or from the index as it is): whatever came before, the
    drafter then proposes what a new drafter started on the same tokens proposes."""
    rng = random.Random(0)
    reused = NGramDrafter()
    base = [rng.randrange(6) for _ in range(300)]
    from_copy = 0
    for _ in range(120):
        cut = rng.randrange(len(base) + 1)
        tokens = base[:cut] + [rng.randrange(6) for _ in range(rng.randrange(12))]
        from_copy += reused._at_prompt is not None and cut <= len(reused._at_prompt[0])
        reused.start(tokens)
        # generated tokens: some outputs long enough for finish() to wind a copy back
        reused.extend([rng.randrange(6) for _ in range(rng.choice([rng.randrange(5), rng.randrange(30, 80)]))])
        if rng.random() < 0.7:
            reused.finish()
        fresh = NGramDrafter()
        fresh.start(reused.tokens)
        assert reused.index == fresh.index
        fresh.recent = reused.recent  # the earlier outputs are the reused drafter's own
        assert reused.propose(4) == fresh.propose(4)
        # the next prompt: extends the output (a conversation's next turn), or shares this one's start
        r = rng.random()
        base = reused.tokens[:] if r < 0.3 else tokens if r < 0.85 else base
    assert from_copy > 10  # the copy finish() wound back was used


def test_ngram_drafter_copies_from_the_last_requests_outputs():
    """The next request's text often repeats the last suggestion (after a keystroke that left it)."""
    drafter = NGramDrafter(max_n=3, min_n=2)
    drafter.start([1, 2, 3])
    drafter.extend([40, 41, 42, 43, 44])  # the output of the first request
    drafter.start([1, 2, 3, 9, 40, 41])  # the prompt never had 40 41 42 ...
    assert drafter.propose(3) == ([42, 43, 44], None)
    drafter.start([5, 41, 7])  # an unrelated prompt: no n-gram of it is in either
    assert drafter.propose(3) == ([], None)


def test_ngram_drafter_indexes_an_output_when_its_request_ends_not_when_the_next_starts():
    """finish() remembers the output at once (the engine calls it after the last chunk), so the
    next request's start() has no output to index before its first token."""
    drafter = NGramDrafter(max_n=3, min_n=2)
    drafter.start([1, 2, 3])
    drafter.extend([40, 41, 42, 43, 44])
    drafter.finish()
    assert [output for output, _ in drafter.recent] == [[40, 41, 42, 43, 44]]
    drafter.start([1, 2, 3, 9, 40, 41])
    assert len(drafter.recent) == 1  # start() remembered nothing more
    assert drafter.propose(3) == ([42, 43, 44], None)


def test_the_engine_finishes_its_drafter_after_each_request(model_path):
    from lingcode.engine.local import load_engine

    engine = load_engine(model_path, device="cpu", speculation="ngram")
    try:
        ids = engine.info.tokenizer.encode("def add(a, b):\n    return")
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        engine.submit("r1", ids, params, lambda _: None).result()
        assert engine._ngram._prompt_len is None  # finished
        assert len(engine._ngram.recent) == 1  # its output, indexed before any next request
        # run() (the engine's own process) leaves it to the caller's tidy(), after the last chunk went out
        engine.run("r2", ids + [11], params, lambda _: None)
        assert engine._ngram._prompt_len is not None and len(engine._ngram.recent) == 1
        engine.tidy()
        assert engine._ngram._prompt_len is None and len(engine._ngram.recent) == 2
    finally:
        import asyncio

        asyncio.run(engine.close())


def test_greedy_verify_keeps_the_matching_prefix_then_the_targets_token():
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 4, 9, 1]):
        logits[row, best] = 5.0
    assert verify_greedy(logits, [3, 4, 5]) == [3, 4, 9]
    assert verify_greedy(logits[:3], [3, 4]) == [3, 4, 9]  # all accepted: the bonus token
    assert verify_greedy(logits[:2], [0]) == [3]


def test_the_cpu_argmax_picks_the_ids_torch_picks():
    """Greedy decoding and verification read their ids through sampling.argmax (numpy's on the
    CPU): the same ids as torch's argmax, ties to the first, NaN taken as the largest."""
    generator = torch.Generator().manual_seed(0)
    wide = torch.randn(5, 49152, generator=generator)
    cases = [
        wide[0],
        wide,
        wide[1:4],
        wide.t()[:7],  # a row, a batch, a slice, strided columns
        torch.tensor([1.0, 3.0, 3.0, 2.0]),
        torch.tensor([[2.0, 2.0], [1.0, 2.0]]),  # ties
        torch.tensor([1.0, float("nan"), 5.0, float("nan")]),
        torch.tensor([float("-inf"), float("-inf")]),
        torch.randn(8, generator=generator).to(torch.bfloat16),  # not float32: torch's own
    ]
    with torch.inference_mode():  # as the engine calls it
        for logits in cases:
            ours, torchs = argmax(logits), logits.argmax(dim=-1)
            assert ours.dtype == torchs.dtype and ours.shape == torchs.shape and torch.equal(ours, torchs)


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_once_per_seen_id():
    penalty = RepetitionPenalty([0, 1, 1], 2.0, torch.device("cpu"))  # id 1 twice: penalized once
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])
    penalty.apply(logits)
    assert logits.tolist() == [1.0, -2.0, 0.5, 3.0, -2.0]
    penalty.add([3])
    penalty.add(torch.tensor([3]))  # a token seen again (or one left on the device): no more than once
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])
    penalty.apply(logits)
    assert logits.tolist() == [1.0, -2.0, 0.5, 1.5, -2.0]
    # A verify step's rows: row i is for the sequence with the draft's first i tokens.
    rows = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]] * 3)
    penalty.apply(rows, [2, 4])
    assert rows.tolist() == [
        [1.0, -2.0, 0.5, 1.5, -2.0],
        [1.0, -2.0, 0.25, 1.5, -2.0],
        [1.0, -2.0, 0.25, 1.5, -4.0],
    ]


@pytest.mark.parametrize("draft_has_probs", [False, True])
def test_rejection_sampling_keeps_the_target_distribution(draft_has_probs):
    """On a 5-token vocabulary: the first two emitted tokens must be distributed as p0 x p1."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[1.0, 0.2, -0.5, 0.7, 0.0], [0.1, 1.5, 0.3, -1.0, 0.4], [0.0, 0.0, 0.9, 0.3, -0.2]])
    params = SamplingParams(max_tokens=8, temperature=0.9)
    p = torch.softmax(logits / params.temperature, dim=-1)
    q = torch.softmax(torch.tensor([[0.5, 1.0, 0.0, 0.0, 0.2], [1.0, 0.0, 0.2, 0.1, 0.0]]), dim=-1)
    trials = 20000
    counts: Counter = Counter()
    for _ in range(trials):
        if draft_has_probs:  # a draft model's sample from q
            draft = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
            out = verify_sampled(logits, draft, q, params, gen)
        else:  # a deterministic drafter (n-gram): always proposes 3, 1
            out = verify_sampled(logits, [3, 1], None, params, gen)
        if len(out) == 1:  # the next step would draw position 1 from p1 (same context here)
            out.append(int(torch.multinomial(p[1], 1, generator=gen)))
        counts[tuple(out[:2])] += 1
    worst = 0.0
    for a in range(5):
        for b in range(5):
            expected = float(p[0, a] * p[1, b])
            sigma = (expected * (1 - expected) / trials) ** 0.5
            worst = max(worst, abs(counts[(a, b)] / trials - expected) / sigma)
    assert worst < 4.5, f"an outcome is {worst:.1f} standard deviations off the target distribution"


def test_draft_length_adapts_to_acceptance_and_step_cost():
    cpu = [20.4, 24.8, 29.7, 32.1, 38.0, 44.3, 43.0, 41.6, 41.6]  # ms a step verifying k drafts (2 cores)
    k = DraftLength(cpu)
    for _ in range(10):
        k.update(max(k.k, 1), 0)  # nothing lands: drafting only costs
    assert k.k == 0 and k.rate < 0.1
    for _ in range(30):
        k.update(0, 0)  # steps without drafts: back toward the prior, so drafting is tried again
    assert k.k > 0
    for _ in range(10):
        k.update(k.k, k.k)  # everything lands: the longest draft pays most
    assert k.k == 8
    for _ in range(30):
        k.update(8, 1)  # one token a draft lands (a = 1/2): a short draft is the best buy at these costs
    assert 1 <= k.k <= 3, k.k


def test_draft_length_shortens_drafts_as_the_context_grows():
    """Attention reads every cached key for every token a step feeds: far into a long context an
    8-token step costs several times a 1-token one (SmolLM2 on 2 cores), so the same acceptance buys
    a shorter draft there, or none."""
    at_start = [4.3, 4.6, 4.9, 5.2, 5.5, 5.8, 6.1, 6.4, 6.7]  # ms a step verifying k drafts at position 0
    per_position = [0.0012 * (k + 1) for k in range(9)]  # and what each position of context adds
    k = DraftLength(at_start, per_position)
    for _ in range(20):
        k.update(4, 2)  # two of four drafts land: a = 2/3
    assert k.at(0) >= 3
    assert k.at(8000) < k.at(0)
    for _ in range(20):
        k.update(4, 1)
    assert k.at(8000) == 0


def test_draft_length_never_picks_a_longer_draft_at_the_same_cost():
    """GPU graphs are captured at widths 1, 2, 4, 8: 2 and 3 drafts both pay for a width-4 step."""
    widths = [0.42, 0.55, 0.72, 0.72, 1.0, 1.0, 1.0, 1.0]  # step ms for k = 0..7
    k = DraftLength(widths)
    for rate_steps in range(40):
        k.update(max(k.k, 1), (rate_steps % 3 > 0) * max(k.k, 1))
        assert k.k not in (2, 4, 5, 6), k.k
