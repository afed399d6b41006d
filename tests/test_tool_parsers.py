"""Tool-call and reasoning parsers on text streams: recorded real model streams, and each format's edge cases.

The parsers are incremental; whatever the chunking (the model's own, or one character at a
time), the events must fold to the same calls and content, and the streamed argument fragments
of a call must add up to its arguments.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lingcode.text.families import Reasoning, family_of
from lingcode.agent.reasoning import ReasoningSplitter
from lingcode.agent.tool_parsers import CallArgs, CallStart, Text, Tool, make_parser

RECORDED = json.loads((Path(__file__).parent / "data" / "tool_streams.json").read_text())
WEATHER = Tool(
    "get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
)


def parse(name: str, chunks: list[str], tools=(WEATHER,)):
    """Run a parser over chunks: (text content, calls, events)."""
    parser = make_parser(name, list(tools))
    events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Text))
    return content, parser.calls, events


def check_fragments_add_up(events, calls):
    """Each call starts once (index, id, name) before its fragments, and the fragments add up to its arguments."""
    started: dict[int, str] = {}
    fragments: dict[int, str] = {}
    for event in events:
        if isinstance(event, CallStart):
            assert event.index not in started and event.index == len(started)
            started[event.index] = event.name
            fragments[event.index] = ""
        elif isinstance(event, CallArgs):
            assert event.index in started, "arguments before the call started"
            fragments[event.index] += event.fragment
    assert [started[i] for i in sorted(started)] == [c.name for c in calls]
    assert [fragments[i] for i in sorted(fragments)] == [c.arguments for c in calls]


def one_char_at_a_time(chunks: list[str]) -> list[str]:
    return list("".join(chunks))


@pytest.mark.parametrize("record", RECORDED, ids=[r["name"] for r in RECORDED])
@pytest.mark.parametrize("chunking", ["as recorded", "one character at a time"])
def test_recorded_smollm2_streams(record, chunking):
    chunks = record["chunks"] if chunking == "as recorded" else one_char_at_a_time(record["chunks"])
    tools = [Tool(**t) for t in record["tools"]]
    content, calls, events = parse(record["parser"], chunks, tools)
    check_fragments_add_up(events, calls)
    expected = record["expected_calls"]
    complete = calls[: len(expected)]
    assert [(c.name, json.loads(c.arguments)) for c in complete] == [(e["name"], e["arguments"]) for e in expected]
    assert len({c.id for c in calls}) == len(calls)
    if record["finish_reason"] == "length" and len(calls) > len(expected):
        # cut off by max_tokens inside a further call: it is returned as started, arguments as far as they came
        assert record["expected_content"].startswith("<tool_call>")
        assert len(calls) == len(expected) + 1
    else:
        assert content.strip() == record["expected_content"]


def test_recorded_streams_cover_calls_and_plain_answers():
    assert any(r["expected_calls"] for r in RECORDED) and any(not r["expected_calls"] for r in RECORDED)
    assert any(len(r["expected_calls"]) > 1 for r in RECORDED), "a parallel-call stream is recorded"


HERMES_TEXT = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome }", "days": 1}}</tool_call>'
)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_hermes_any_chunking_gives_the_same_calls(step):
    chunks = [HERMES_TEXT[i : i + step] for i in range(0, len(HERMES_TEXT), step)]
    content, calls, events = parse("hermes", chunks)
    check_fragments_add_up(events, calls)
    assert content == "Let me check.\n"
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris", "days": 3}, {"city": "Rome }", "days": 1}]


def test_hermes_streams_arguments_before_the_call_closes():
    parser = make_parser("hermes", [WEATHER])
    events = parser.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "Par')
    assert isinstance(events[0], CallStart) and events[0].name == "get_weather"
    assert "".join(e.fragment for e in events if isinstance(e, CallArgs)) == '{"city": "Par'


def test_hermes_text_is_held_back_only_while_it_could_be_a_tag():
    parser = make_parser("hermes", [WEATHER])
    assert parser.feed("Hello <tool") == [Text("Hello ")]
    assert parser.feed("box> is here") == [Text("<toolbox> is here")]
    assert parser.finish() == []


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>',  # arguments first
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',  # arguments as a string
    ],
)
def test_hermes_other_orders_are_parsed_whole(text):
    _, calls, events = parse("hermes", list(text))
    check_fragments_add_up(events, calls)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


def test_hermes_a_block_that_is_no_call_stays_text():
    text = "<tool_call>I cannot call tools</tool_call> sorry"
    content, calls, _ = parse("hermes", list(text))
    assert calls == [] and content == text


def test_hermes_cut_off_mid_call_returns_what_arrived():
    content, calls, _ = parse("hermes", ['<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'])
    assert content == "" and calls[0].name == "get_weather" and calls[0].arguments == '{"city": "Pa'


LING3_TEXT = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n</tool_call>"
)


@pytest.mark.parametrize("step", [1, 4, 9, 1000])
def test_ling3_xml_calls_with_schema_types(step):
    chunks = [LING3_TEXT[i : i + step] for i in range(0, len(LING3_TEXT), step)]
    content, calls, events = parse("ling3", chunks)
    check_fragments_add_up(events, calls)
    assert content == ""
    # days is an integer in the schema; city is a string even when it looks like a number
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris", "days": 3}, {"city": "123"}]


def test_ling3_call_without_arguments():
    _, calls, _ = parse("ling3", list("<tool_call>get_weather\n</tool_call>"))
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", "{}")]


THINK = Reasoning("<think>", "</think>", ("<tool_call>",))
LING3 = family_of("Ling-3.0-flash").reasoning  # THINK, and output that is all reasoning is the answer too


def split_all(
    tags: Reasoning, starts_inside: bool, chunks: list[str], complete: bool = True
) -> tuple[str, str, ReasoningSplitter]:
    """The streamed totals (reasoning, answer) and the splitter, for whole-reply questions."""
    splitter = ReasoningSplitter(tags, starts_inside)
    parts = [splitter.feed(chunk) for chunk in chunks] + [splitter.finish(complete)]
    return "".join(r for r, _ in parts), "".join(a for _, a in parts), splitter


def chunkings(text: str) -> list[list[str]]:
    """Whole, one character at a time, and three random chunkings."""
    out = [[text], list(text)]
    for seed in range(3):
        rng, i, chunks = random.Random(seed), 0, []
        while i < len(text):
            n = rng.randint(1, 6)
            chunks.append(text[i : i + n])
            i += n
        out.append(chunks)
    return out


@pytest.mark.parametrize(
    "starts_inside,text,reasoning,answer",
    [
        (True, "I should look it up.</think>\n\nIt is sunny.", "I should look it up.", "It is sunny."),
        (False, "<think>short</think>Answer", "short", "Answer"),
        (False, "  <think>short</think>Answer", "short", "Answer"),
        (False, "No thinking here.", "", "No thinking here."),
        (
            True,
            "Need a tool.<tool_call>get_weather\n</tool_call>",
            "Need a tool.",
            "<tool_call>get_weather\n</tool_call>",
        ),
        (True, "<think>Its own tag.</think>Answer", "Its own tag.", "Answer"),  # the prompt had opened the block
        (True, "<think></think>Answer", "", "Answer"),
        (True, "</think>Answer", "", "Answer"),
        (True, "A <think> in the middle is text.</think>Answer", "A <think> in the middle is text.", "Answer"),
        (False, "Answer, then <think>no reasoning</think>", "", "Answer, then <think>no reasoning</think>"),
        (True, "Cut off in the end tag</thi", "Cut off in the end tag</thi", ""),
    ],
)
def test_reasoning_split(starts_inside, text, reasoning, answer):
    for chunks in chunkings(text):
        assert split_all(THINK, starts_inside, chunks)[:2] == (reasoning, answer), chunks


@pytest.mark.parametrize(
    "starts_inside,text", [(True, "Still thinking when max_tokens cut"), (False, "<think>Never closed")]
)
def test_ling3_output_that_is_all_reasoning_is_the_answer_too(starts_inside, text):
    """As SGLang's ling3 parser: streamed, the reasoning and then all of it again as the answer;
    the whole reply, the answer alone. Not after an abort, and not for families without the rule."""
    thought = text.removeprefix("<think>")
    for chunks in chunkings(text):
        reasoning, answer, splitter = split_all(LING3, starts_inside, chunks)
        assert (reasoning, answer) == (thought, thought) and splitter.answer_is_reasoning
        assert splitter.reasoning == thought
        assert split_all(LING3, starts_inside, chunks, complete=False)[:2] == (thought, "")
        assert split_all(THINK, starts_inside, chunks)[:2] == (thought, "")
    # closed on an empty answer: the whole reply still gives the reasoning as the answer; a stream does not
    reasoning, answer, splitter = split_all(LING3, True, ["Done.</think>"])
    assert (reasoning, answer, splitter.answer_is_reasoning, splitter.reasoning) == ("Done.", "", True, "Done.")
    # a held-back partial end tag is answer text only, as SGLang's finish() gives it
    assert split_all(LING3, True, ["Almost</thi"])[:2] == ("Almost", "Almost</thi")


@pytest.mark.parametrize("text", ["Thinking.</think>\n\n", "Thinking.<tool_call>f\n</tool_call>"])
def test_any_answer_keeps_the_reasoning_apart(text):
    """Whitespace after </think>, or a tool call, is an answer: SGLang's rule looks for none at all."""
    *_, splitter = split_all(LING3, True, [text])
    assert not splitter.answer_is_reasoning and splitter.reasoning == "Thinking."


def test_families_from_data():
    assert family_of("Smollm2 135M 8k Lc100K Mix1 Ep2").tool_parser == "hermes"
    ling = family_of("inclusionAI/Ling-3.0-flash")
    assert (
        ling.tool_parser == "ling3"
        and ling.reasoning.start == "<think>"
        and "<tool_call>" in ling.reasoning.also_ends_at
    )
    assert ling.reasoning.nonempty_content and not family_of("Qwen3-8B").reasoning.nonempty_content
    assert family_of("some-model", architecture="BailingMoeV3ForCausalLM").name == "ling3"
    assert family_of("unknown-model").name == "default"


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_a_call_that_repeats_an_earlier_one_is_dropped_and_ends_the_turn(step):
    """lingcode.pipeline.turns' call filter: a repeat of any earlier call is held while it matches,
    dropped when it completes identical; a call that differs is released as soon as it does (none
    is lost)."""
    from lingcode.pipeline.turns import _CallFilter

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>\n'
    cases = {
        ("Paris", "Paris"): ["Paris"],
        ("Paris", "Parma"): ["Paris", "Parma"],
        ("Paris", "Paris2"): ["Paris", "Paris2"],
        ("Paris", "Rome", "Paris", "Rome"): ["Paris", "Rome"],
        ("Paris", "Rome", "Parma"): ["Paris", "Rome", "Parma"],
    }
    for cities, expected in cases.items():
        calls = _CallFilter(make_parser("hermes", [Tool("get_weather")]))
        text, events = "".join(call % c for c in cities), []
        for i in range(0, len(text), step):
            events += calls.feed(text[i : i + step])
        events += calls.finish()
        assert [json.loads(c.arguments)["city"] for c in calls.calls] == expected
        assert calls.repeated == (len(expected) < len(cities))
        streamed = "".join(e.fragment for e in events if isinstance(e, CallArgs) and e.index == len(expected) - 1)
        assert streamed == calls.calls[-1].arguments  # what was streamed is exactly the calls reported
