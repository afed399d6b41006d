"""The SGLang adapter: its parser on SGLang's exact wire format, and generate / abort / errors over HTTP.

The HTTP peer is tests/sglang_wire.py's replay server: it plays back event streams shaped byte for
byte as SGLang 0.5.23 writes them (it is not an engine and generates nothing).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

import sglang_wire as wire
from lingcode.engine import ContextOverflow, EngineError, EngineUnavailable, SamplingParams
from lingcode.pipeline.generation import generate_text
from lingcode.pipeline.scheduler import Scheduler
from lingcode.engine.sglang.adapter import KEEP_IDLE_S, SGLangEngine, StreamDecoder, sampling_params
from lingcode.engine.sglang.model_dir import load_model_info

EOS = 200  # <|role_end|> in the test tokenizer below
GREEDY = SamplingParams(max_tokens=64, temperature=0.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory as lingcode reads it: config.json, tokenizer.json, tokenizer_config.json,
    generation_config.json (a small word-level tokenizer stands in for Ling's 157K vocabulary)."""
    path = tmp_path_factory.mktemp("model")
    vocab = {f"w{i}": i for i in range(EOS)} | {"<|role_end|>": EOS}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|role_end|>"])
    tok.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(
        json.dumps({"architectures": ["BailingMoeV3ForCausalLM"], "max_position_embeddings": 131072})
    )
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|role_end|>", "chat_template": "{{ messages }}"})
    )
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS]}))
    return path


@pytest.fixture
def replay():
    replay = wire.Replay()
    server = wire.serve(replay)
    replay.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield replay
    server.shutdown()
    server.server_close()


def make_engine(replay, model_dir, **kwargs) -> SGLangEngine:
    info = load_model_info(model_dir, name="Ling-3.0-flash", context_length=kwargs.pop("context_length", None))
    return SGLangEngine(replay.url, info, **kwargs)


def lines(events: list[bytes]) -> list[str]:
    """The stream as httpx's aiter_lines() yields it."""
    return b"".join(events).decode().splitlines()


# --- the parser, on SGLang's bytes ----------------------------------------------------------------


def test_decoder_turns_cumulative_output_ids_into_new_tokens():
    decoder = StreamDecoder()
    chunks = [c for line in lines(wire.DSPARK_STREAM) if (c := decoder.feed(line)) is not None]
    assert [c.token_ids for c in chunks] == [[1293], [11911, 1141, 82, 1438], [198, 262, 470, 274, 156895]]
    assert [c.finish_reason for c in chunks] == [None, None, "stop"]
    assert all(c.prompt_tokens == 5 and c.cached_tokens == 3 for c in chunks)
    assert chunks[-1].spec_accept_length == pytest.approx(10 / 3)
    assert decoder.done and decoder.emitted == len(wire.DSPARK_TOKENS)
    assert decoder.meta["spec_verify_ct"] == 3


def test_decoder_with_incremental_streaming_output():
    events = [
        wire.event({"text": "a", "output_ids": [5, 6], "meta_info": wire.meta("r", 2)}),
        wire.event({"text": "b", "output_ids": [7], "meta_info": wire.meta("r", 3, {"type": "length", "length": 3})}),
    ]
    decoder = StreamDecoder(incremental=True)
    chunks = [c for line in lines(events) if (c := decoder.feed(line)) is not None]
    assert [(c.token_ids, c.finish_reason) for c in chunks] == [([5, 6], None), ([7], "length")]


def test_decoder_errors():
    decoder = StreamDecoder()
    with pytest.raises(ContextOverflow, match="context length"):
        for line in lines(wire.ERROR_STREAM):
            decoder.feed(line)
    failed = wire.aborted("r", [], "Out of memory even after retracting all other requests", 500)
    with pytest.raises(EngineError, match="Out of memory"):
        StreamDecoder().feed(failed.decode().strip())
    shed = wire.aborted("r", [], "Retracted under decode memory pressure without a KV backup. Retry later.", 503)
    with pytest.raises(EngineUnavailable):
        StreamDecoder().feed(shed.decode().strip())
    ours = StreamDecoder().feed(wire.aborted("r", [4]).decode().strip())  # aborted on request: not an error
    assert (ours.token_ids, ours.finish_reason) == ([4], "abort")


def test_sampling_params_in_sglang_terms():
    params = SamplingParams(
        max_tokens=500, temperature=0.7, top_p=0.9, top_k=0, seed=7, stop_token_ids=(9,), repetition_penalty=1.05
    )
    assert sampling_params(params, (EOS,), room=100) == {
        "max_new_tokens": 100,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "repetition_penalty": 1.05,
        "ignore_eos": False,
        "stop_token_ids": [9, EOS],
        "sampling_seed": 7,
    }
    greedy = sampling_params(SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True), (EOS,), room=100)
    assert greedy["temperature"] == 0.0 and "stop_token_ids" not in greedy and greedy["ignore_eos"] is True


def test_model_info_from_the_directory(model_dir):
    info = load_model_info(model_dir, context_length=4096)
    assert info.context_length == 4096 and info.eos_token_ids == (EOS,) and info.eos_token == "<|role_end|>"
    assert info.chat_template == "{{ messages }}" and info.tokenizer.encode("w3 w4") == [3, 4]


# --- over HTTP ----------------------------------------------------------------------------------


async def test_generate_streams_tokens_and_reports_cache_and_acceptance(replay, model_dir):
    engine = make_engine(replay, model_dir, api_key="k3y")
    chunks = [c async for c in engine.generate("req-7", [1, 2, 3, 4, 5], GREEDY)]
    assert [t for c in chunks for t in c.token_ids] == wire.DSPARK_TOKENS
    assert chunks[-1].finish_reason == "stop" and chunks[-1].spec_accept_length == pytest.approx(10 / 3)
    body = replay.requests[0]
    assert body["rid"].startswith("req-7-") and len(body["rid"]) > len("req-7-") + 16  # unique: SGLang aborts by prefix
    assert body["input_ids"] == [1, 2, 3, 4, 5] and body["stream"] is True
    assert body["sampling_params"]["stop_token_ids"] == [EOS] and body["sampling_params"]["max_new_tokens"] == 64
    assert replay.auth == ["Bearer k3y"] and replay.aborts == []
    stats = engine.stats()
    assert (stats["finished"], stats["prompt_tokens"], stats["cached_tokens"], stats["generated_tokens"]) == (
        1,
        5,
        3,
        10,
    )
    assert stats["last_request"]["spec_verify_ct"] == 3 and stats["last_request"]["ttft_ms"] > 0
    assert stats["last_request"]["accept_length"] == pytest.approx(10 / 3)
    await engine.close()


async def test_generate_text_reports_accept_length_in_timings(replay, model_dir):
    """Through lingcode core (scheduler, detokenizer, timing), as every API route streams."""
    steps = [[5], [5, 6, 7], [5, 6, 7, 8, EOS]]
    replay.generate = lambda rid, body: [
        *(
            wire.event({"text": None, "output_ids": ids, "meta_info": wire.meta(rid, len(ids), cached_tokens=2)})
            for ids in steps[:-1]
        ),
        wire.event(
            {
                "text": "w5 w6 w7 w8",
                "output_ids": steps[-1],
                "meta_info": {
                    **wire.meta(rid, 5, {"type": "stop", "matched": EOS}, cached_tokens=2),
                    "e2e_latency": 0.01,
                    "spec_accept_rate": 0.25,
                    "spec_accept_length": 2.5,
                    "spec_num_correct_drafts": 2,
                    "spec_num_proposed_drafts": 8,
                    "spec_verify_ct": 2,
                },
            }
        ),
        wire.DONE,
    ]
    engine = make_engine(replay, model_dir)
    chunks = [c async for c in generate_text(Scheduler(engine), engine.info.tokenizer, "r1", [1, 2, 3, 4], GREEDY)]
    last = chunks[-1]
    assert "".join(c.text for c in chunks) == "w5 w6 w7 w8"  # the eos id is not text
    assert last.finish_reason == "stop" and last.usage.completion_tokens == 5 and last.usage.cached_tokens == 2
    assert last.timing.as_dict()["accept_length"] == 2.5
    await engine.close()


async def drained(engine: SGLangEngine) -> None:
    """Until the finished streams' `[DONE]`, read in the background, has returned their connections
    to the pool (at most 5 s)."""
    for _ in range(500):
        if not engine.stats()["draining"]:
            return
        await asyncio.sleep(0.01)


async def test_requests_that_end_reuse_one_connection(replay, model_dir):
    """The pipeline stops reading at the finish event; SGLang's `[DONE]` after it is read in the
    background, so the connection goes back to the pool instead of being closed (and reopened by the
    next request, before its first token)."""
    engine = make_engine(replay, model_dir)
    for n in range(3):
        chunks = [c async for c in generate_text(Scheduler(engine), engine.info.tokenizer, f"r{n}", [1, 2, 3], GREEDY)]
        assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.completion_tokens == len(wire.DSPARK_TOKENS)
        assert engine.stats()["draining"] == 1  # the answer came before the stream's end did
        await drained(engine)
    assert len(replay.requests) == 3 and replay.aborts == []
    assert replay.connections == 1
    await engine.close()


async def test_a_connection_idle_for_sglangs_keep_alive_is_not_reused(replay, model_dir):
    """SGLang closes a connection idle for 5 s. aiohttp's pool kept one 15 s, so a request sent
    as SGLang closed it was lost (a 503 for the user's turn). The adapter's pool lets one go sooner."""
    replay.idle_close_s = KEEP_IDLE_S + 0.5
    engine = make_engine(replay, model_dir)
    for n in range(2):
        chunks = [c async for c in generate_text(Scheduler(engine), engine.info.tokenizer, f"r{n}", [1, 2, 3], GREEDY)]
        assert chunks[-1].finish_reason == "stop"
        await drained(engine)
        if n == 0:
            await asyncio.sleep(replay.idle_close_s + 0.1)
    assert replay.idle_closed == 0 and replay.connections == 2 and len(replay.requests) == 2
    await engine.close()


async def test_abort_ends_the_stream_within_a_step(replay, model_dir):
    replay.generate = lambda rid, body: "endless"
    engine = make_engine(replay, model_dir)
    got = []
    async with aclosing(engine.generate("slow", [1, 2, 3], GREEDY)) as stream:
        async for chunk in stream:
            got.append(chunk)
            if len(got) == 3:
                await engine.abort("slow")
    assert got[-1].finish_reason == "abort" and got[-1].token_ids == []
    assert replay.aborts == [replay.requests[0]["rid"]]
    assert engine.stats()["aborted"] == 1 and engine.stats()["running"] == []
    await engine.close()


async def test_a_client_that_goes_away_aborts_in_sglang(replay, model_dir):
    replay.generate = lambda rid, body: "endless"
    engine = make_engine(replay, model_dir)
    async with aclosing(engine.generate("gone", [1, 2, 3], GREEDY)) as stream:
        async for _ in stream:
            break  # the consumer stops reading: closing the stream must free SGLang's slot
    assert await asyncio.to_thread(replay.aborted.wait, 5)
    assert replay.aborts == [replay.requests[0]["rid"]]
    await engine.close()


async def test_http_errors(replay, model_dir):
    engine = make_engine(replay, model_dir)
    replay.status, replay.status_body = 400, b'{"error":"sampling_params.top_k: expected int"}'
    with pytest.raises(EngineError, match="400 sampling_params.top_k"):
        [c async for c in engine.generate("a", [1], GREEDY)]
    replay.status, replay.status_body = 401, b'{"error":"Unauthorized"}'
    with pytest.raises(EngineError, match="API key"):
        [c async for c in engine.generate("b", [1], GREEDY)]
    replay.status = 200
    replay.generate = lambda rid, body: wire.ERROR_STREAM
    with pytest.raises(ContextOverflow):
        [c async for c in engine.generate("c", [1], GREEDY)]
    assert engine.stats()["errors"] == 3
    await engine.close()


async def test_a_dying_server_is_a_clear_503(replay, model_dir):
    engine = make_engine(replay, model_dir)
    replay.generate = lambda rid, body: "drop"
    with pytest.raises(EngineUnavailable, match="lost SGLang"):
        [c async for c in engine.generate("a", [1], GREEDY)]
    down = make_engine(replay, model_dir, availability=lambda: "SGLang exited with code -9 and is restarting")
    with pytest.raises(EngineUnavailable, match="restarting"):
        [c async for c in down.generate("b", [1], GREEDY)]
    assert len(replay.requests) == 1  # the second never reached the server
    await engine.close()
    await down.close()


async def test_nothing_listening(model_dir):
    engine = SGLangEngine("http://127.0.0.1:9", load_model_info(model_dir))
    with pytest.raises(EngineUnavailable):
        [c async for c in engine.generate("a", [1], GREEDY)]
    await engine.close()


async def test_context_overflow_is_refused_before_sending(replay, model_dir):
    engine = make_engine(replay, model_dir, context_length=8)
    with pytest.raises(ContextOverflow):
        [c async for c in engine.generate("a", list(range(8)), GREEDY)]
    [c async for c in engine.generate("b", list(range(5)), SamplingParams(max_tokens=100))]
    assert replay.requests[0]["sampling_params"]["max_new_tokens"] == 3  # cut to the room left
    await engine.close()
