"""Stop strings and incremental detokenization: the text layer every engine streams through."""

from __future__ import annotations

from lingcode.pipeline.generation import IncrementalDetokenizer, StopMatcher


def feed_all(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out = []
    for piece in pieces:
        text, hit = matcher.feed(piece)
        out.append(text)
        if hit:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_string_split_across_pieces():
    assert feed_all(StopMatcher(["</end>"]), ["hello </", "en", "d> world"]) == ("hello ", True)


def test_text_is_held_back_only_while_it_could_start_a_stop():
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("abc ST") == ("abc ", False)
    assert matcher.feed("AR") == ("STAR", False)  # not a stop after all: released at once


def test_earliest_of_several_stops_wins():
    assert feed_all(StopMatcher(["b", "a"]), ["xxab"]) == ("xx", True)


def test_no_stop_means_nothing_held():
    assert StopMatcher([]).feed("abc") == ("abc", False)
    assert feed_all(StopMatcher(["zz"]), ["a z", "b"]) == ("a zb", False)


def test_detokenizer_never_emits_half_a_character(engine):
    tok = engine.info.tokenizer
    text = "emoji 🙂 and 漢字 done"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add([i]) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_detokenizer_skips_end_ids(engine):
    tok = engine.info.tokenizer
    detok = IncrementalDetokenizer(tok, skip_ids=frozenset({2}))
    assert detok.add(tok.encode("Paris.") + [2]) + detok.flush() == "Paris."
