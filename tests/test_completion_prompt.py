"""Completion prompts per model family, on the default model's real tokenizer (and a small real one for FIM)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from lingcode.completion.prompt import LINE_STRIDE, Budgets, Chunk, CompletionInput, build_prompt, completion_family
from lingcode.text.tokenizer import Tokenizer

SOURCE = (Path(__file__).parents[1] / "lingcode" / "pipeline" / "scheduler.py").read_text()


@pytest.fixture(scope="module")
def info(engine):
    return engine.info


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_smollm2_gets_the_repository_layout_it_was_trained_on(info):
    assert completion_family(info).name == "smollm2" and completion_family(info).fim is None
    request = CompletionInput(prefix="import os\n", suffix="x = 1\n", path="app/main.py", repo="demo")
    prompt = build_prompt(info, request)
    tok = info.tokenizer
    assert prompt.input_ids == tok.encode("<repo_name>demo<file_sep>app/main.py\n") + tok.encode_text("import os\n")
    assert not prompt.fim and prompt.suffix_tokens == 0  # no FIM tokens: the suffix only feeds the cut rules


def test_code_that_mentions_special_tokens_stays_text(info):
    prompt = build_prompt(info, CompletionInput(prefix='SEP = "<file_sep>"\n', path="a.py"))
    file_sep = info.tokenizer.token_to_id("<file_sep>")
    assert prompt.input_ids.count(file_sep) == 1  # the header's, not the code's


def test_the_prefix_fits_its_budget_from_a_stride_aligned_line(info):
    budgets = Budgets(prefix_tokens=300)
    prompt = build_prompt(info, CompletionInput(prefix=SOURCE, path="lingcode/pipeline/scheduler.py"), budgets)
    assert 0 < prompt.prefix_tokens <= 300
    assert prompt.prefix_start_line > 0 and prompt.prefix_start_line % LINE_STRIDE == 0
    lines = SOURCE.splitlines(keepends=True)
    kept = "".join(lines[prompt.prefix_start_line :]).rstrip()  # the cursor's whitespace is the model's to write
    assert prompt.input_ids[-prompt.prefix_tokens :] == info.tokenizer.encode_text(kept)
    # One stride earlier would not have fitted.
    earlier = info.tokenizer.encode_text("".join(lines[prompt.prefix_start_line - LINE_STRIDE :]))
    assert len(earlier) > 300


def test_typing_changes_only_the_prompts_tail(info):
    cut = SOURCE.index("    def stats(self)") + len("    def st")
    budgets = Budgets(prefix_tokens=400)
    before = build_prompt(info, CompletionInput(prefix=SOURCE[:cut], path="s.py"), budgets)
    for typed in ("a", "at", "ats("):
        after = build_prompt(info, CompletionInput(prefix=SOURCE[:cut] + typed, path="s.py"), budgets)
        assert after.prefix_start_line == before.prefix_start_line
        assert common_prefix(before.input_ids, after.input_ids) >= len(before.input_ids) - 2


def test_context_chunks_come_first_within_their_budget(info):
    chunks = (
        Chunk("util.py", "def helper():\n    return 42\n"),
        Chunk("big.py", "x = 1\n" * 400),
        Chunk("b.py", "y = 2"),
    )
    request = CompletionInput(prefix="import util\n", path="main.py", context=chunks)
    prompt = build_prompt(info, request, Budgets(context_tokens=100))
    assert prompt.context_chunks == 2  # big.py is over the budget and left out, not cut
    tok = info.tokenizer
    expected = (
        tok.encode("<file_sep>util.py\n")
        + tok.encode_text(chunks[0].text)
        + tok.encode("<file_sep>b.py\n")
        + tok.encode_text("y = 2\n")
    )
    assert prompt.input_ids[: prompt.context_tokens] == expected


def test_a_path_less_buffer_is_named_by_its_language(info):
    prompt = build_prompt(info, CompletionInput(prefix="fn main() {", language="rust"))
    assert info.tokenizer.decode(prompt.input_ids).startswith("<file_sep>untitled.rs\n")


def fim_tokenizer() -> Tokenizer:
    """A tiny real tokenizer whose vocabulary has StarCoder's FIM tokens (no model needed to test the layout)."""
    hf = HFTokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.add_special_tokens(["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<repo_name>"])
    return Tokenizer(hf)


def test_fim_families_put_the_suffix_between_their_tokens(info):
    tok = fim_tokenizer()
    model = dataclasses.replace(info, name="bigcode/starcoder2-3b", tokenizer=tok)
    assert completion_family(model).name == "starcoder2"
    prompt = build_prompt(model, CompletionInput(prefix="a", suffix="a a", path="x"))
    ids = {name: tok.token_to_id(f"<fim_{name}>") for name in ("prefix", "suffix", "middle")}
    body = prompt.input_ids[prompt.input_ids.index(ids["prefix"]) :]
    assert body == [ids["prefix"], 1, ids["suffix"], 1, 1, ids["middle"]]
    assert prompt.fim and prompt.suffix_tokens == 2


def test_an_unknown_model_with_fim_tokens_in_its_vocabulary_gets_them(info):
    model = dataclasses.replace(info, name="my-own-coder", tokenizer=fim_tokenizer())
    family = completion_family(model)
    assert family.fim == {"prefix": "<fim_prefix>", "suffix": "<fim_suffix>", "middle": "<fim_middle>"}
    assert completion_family(dataclasses.replace(info, name="my-own-model")).name == "plain"
