"""The Engine interface over SGLang's native HTTP API: `POST /generate` (streamed) and `POST /abort_request`.

Token ids go in and come out, so chat templates, sessions, stop strings and tool parsing stay in
lingcode core and behave the same on the local engine and on SGLang.

The wire format, from SGLang 0.5.23's source (entrypoints/http_server.py `generate_request`,
managers/tokenizer_manager.py `_handle_batch_output`): the response is `text/event-stream`;
each event is `b"data: " + orjson(out) + b"\\n\\n"` and the stream ends with `data: [DONE]`.
`out` is `{"text": ..., "output_ids": [...], "meta_info": {...}}`; `output_ids` holds every
token so far (only the new ones with --incremental-streaming-output) and includes a matched
stop token. `meta_info` has `id` (the rid), `finish_reason` (null, or `{"type": "stop",
"matched": ...}`, `{"type": "length", "length": n}`, `{"type": "abort", "message": ...,
"status_code": ...}`), `prompt_tokens`, `completion_tokens`, `cached_tokens`; the final event
adds `e2e_latency` and, under speculative decoding, `spec_accept_length`, `spec_accept_rate`,
`spec_verify_ct`. A failure mid-stream is one event `{"error": {"message": ..., "code": ...}}`.
SGLang aborts every request whose rid *starts with* the aborted rid, so each rid ends in a
random suffix.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import AsyncIterator, Callable

import aiohttp

from lingcode.engine import (
    ContextOverflow,
    EngineError,
    EngineUnavailable,
    ModelInfo,
    SamplingParams,
    TokenChunk,
    handed_over,
    merge_chunks,
)

SPEC_FIELDS = ("spec_accept_length", "spec_accept_rate", "spec_verify_ct", "spec_num_correct_drafts")
ABORT_TIMEOUT_S = 5.0


def sampling_params(params: SamplingParams, eos_ids: tuple[int, ...], room: int) -> dict:
    """lingcode's SamplingParams as SGLang's `sampling_params` (api/v1 SamplingParams: unknown keys
    are rejected). max_new_tokens is cut to the room left in the context, as the local engine does."""
    stop_ids = list(params.stop_token_ids) + ([] if params.ignore_eos else list(eos_ids))
    body = {
        "max_new_tokens": max(1, min(params.max_tokens, room)),
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # -1: the whole vocabulary
        "repetition_penalty": params.repetition_penalty,
        "ignore_eos": params.ignore_eos,
    }
    if stop_ids:
        body["stop_token_ids"] = list(dict.fromkeys(stop_ids))
    if params.seed is not None:
        body["sampling_seed"] = params.seed
    return body


def generate_body(rid: str, input_ids: list[int], params: SamplingParams, eos_ids: tuple[int, ...], room: int) -> dict:
    """The JSON body of POST /generate for one streamed request (SGLang's GenerateReqInput)."""
    return {
        "rid": rid,
        "input_ids": list(input_ids),
        "stream": True,
        "sampling_params": sampling_params(params, eos_ids, room),
    }


def _error(status: int | None, message: str) -> EngineError | ContextOverflow:
    if "context length" in message:
        return ContextOverflow(message)
    if status == 503:
        return EngineUnavailable(f"SGLang is unavailable: {message}")
    return EngineError(f"SGLang: {message}")


def _finish(reason) -> str | None:
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    if kind in ("stop", "length"):
        return kind
    if kind == "abort":
        status = reason.get("status_code") if isinstance(reason, dict) else None
        if status is not None and int(status) >= 400:  # aborted by SGLang for a reason: an error
            raise _error(int(status), str(reason.get("message") or "request aborted"))
        return "abort"  # aborted on request (ours)
    raise EngineError(f"SGLang: unknown finish reason {reason!r}")


class StreamDecoder:
    """SGLang's /generate SSE lines -> TokenChunks carrying only the new token ids."""

    def __init__(self, incremental: bool = False):
        self.incremental = incremental  # the server runs with --incremental-streaming-output
        self.emitted = 0
        self.done = False  # `data: [DONE]` seen
        self.meta: dict = {}  # the latest meta_info
        self._pending = b""  # bytes of an event not complete yet

    def feed_bytes(self, data: bytes) -> TokenChunk | None:
        """What arrived from the network (any number of events, the last maybe partial), as one
        chunk. Without incremental output every event repeats the ids before it, so of the events
        that arrived together only the last is decoded: the cost stays per read, not per token."""
        self._pending += data
        end = self._pending.rfind(b"\n\n")
        if end < 0:
            return None
        events, self._pending = self._pending[:end].split(b"\n\n"), self._pending[end + 2 :]
        lines = [e.decode() for e in events if e.startswith(b"data:")]
        if lines and lines[-1][5:].strip() == "[DONE]":
            self.done = True
            lines.pop()
        if not self.incremental:
            lines = lines[-1:]
        chunks = [c for line in lines if (c := self.feed(line)) is not None]
        return merge_chunks(chunks) if chunks else None

    def feed(self, line: str) -> TokenChunk | None:
        if not line.startswith("data:"):
            return None  # the blank line between events
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return None
        out = json.loads(payload)
        if "error" in out:
            error = out["error"]
            message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
            raise _error(error.get("code") if isinstance(error, dict) else None, message)
        meta = out.get("meta_info") or {}
        self.meta = meta
        ids = out.get("output_ids") or []
        new = list(ids) if self.incremental else list(ids[self.emitted :])
        self.emitted += len(new)
        finish = _finish(meta.get("finish_reason"))
        if not new and finish is None:
            return None
        return TokenChunk(
            new,
            finish,
            int(meta.get("prompt_tokens") or 0),
            int(meta.get("cached_tokens") or 0),
            meta.get("spec_accept_length"),
        )


async def _http_error(response: aiohttp.ClientResponse) -> EngineError | ContextOverflow:
    body = (await response.read()).decode("utf-8", "replace")
    try:
        data = json.loads(body)
        error = data.get("error", data.get("message", data.get("detail", body)))
        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        message = body.strip() or response.reason or ""
    if response.status in (401, 403):
        return EngineError(f"SGLang refused lingcode's API key ({response.status}): check [sglang] api_key")
    return _error(response.status, f"{response.status} {message}")


# What a request to SGLang raises when the server is not there (or went away mid-stream).
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
DRAIN_TIMEOUT_S = 5.0  # a finished stream's rest (`[DONE]`) comes at once; a server that holds it loses the connection
# SGLang's server closes a connection idle for 5 s (uvicorn's timeout_keep_alive in launch_server);
# a request sent on it just then is lost. The pool reuses one idle for less, so it closes first.
KEEP_IDLE_S = 4.0


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read a finished stream to its end, then put its connection back in the pool."""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            await response.content.read()
    except TRANSPORT_ERRORS:
        response.close()
    except asyncio.CancelledError:
        response.close()
        raise
    else:
        response.release()


class SGLangEngine:
    """Streams requests to one SGLang server. `availability()` says why it cannot take requests
    right now (None when it can): the supervisor's state while SGLang (re)starts."""

    def __init__(
        self,
        url: str,
        info: ModelInfo,
        *,
        api_key: str | None = None,
        incremental: bool = False,
        availability: Callable[[], str | None] = lambda: None,
        status: Callable[[], dict] = dict,
        on_close: Callable[[], None] | None = None,
    ):
        self.url = url.rstrip("/")
        self.info = info
        self.head_before_submit = (
            False  # SGLang may refuse a request (starting, overloaded): the head waits for its 200
        )
        self.incremental = incremental
        self._availability = availability
        self._status = status
        self._on_close = on_close
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None  # made on the event loop, by the first request
        self._rids: dict[str, str] = {}  # lingcode request id -> SGLang rid
        self._counters = dict.fromkeys(
            (
                "requests",
                "finished",
                "aborted",
                "errors",
                "unavailable",
                "prompt_tokens",
                "cached_tokens",
                "generated_tokens",
            ),
            0,
        )
        self._last: dict = {}
        self._drains: set[asyncio.Task] = set()  # streams read to their end in the background

    async def generate(
        self, request_id: str, input_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        if not input_ids:
            raise ValueError("input_ids is empty")
        room = self.info.context_length - len(input_ids)
        if room <= 0:
            raise ContextOverflow(
                f"{len(input_ids)} input tokens leave no room in the model's context of "
                f"{self.info.context_length} tokens"
            )
        if params.constraint is not None:  # an in-process logits mask cannot reach SGLang's sampler
            raise EngineError(
                "the SGLang engine does not apply in-process token constraints (constrained decoding "
                "runs on the local engine)"
            )
        if (reason := self._availability()) is not None:
            self._counters["unavailable"] += 1
            raise EngineUnavailable(reason)
        rid = f"{request_id}-{uuid.uuid4().hex}"
        body = generate_body(rid, input_ids, params, self.info.eos_token_ids, room)
        decoder = StreamDecoder(self.incremental)
        self._rids[request_id] = rid
        self._counters["requests"] += 1
        started, first_at, finish, failed = time.perf_counter(), None, None, False
        response = None
        try:
            response = await self._http().post(f"{self.url}/generate", json=body)
            if response.status != 200:
                raise await _http_error(response)
            handed_over()
            async for data in response.content.iter_any():
                chunk = decoder.feed_bytes(data)
                if chunk is None:
                    if decoder.done:
                        break
                    continue
                if first_at is None and chunk.token_ids:
                    first_at = time.perf_counter()
                finish = chunk.finish_reason
                yield chunk
                if finish is not None:
                    break
            if finish is None:
                raise EngineError("SGLang ended the stream without a finish reason")
        except TRANSPORT_ERRORS as exc:
            failed = True
            self._counters["unavailable"] += 1
            raise EngineUnavailable(
                self._availability() or f"lost SGLang at {self.url} mid-request ({type(exc).__name__})"
            ) from exc
        except (EngineError, ContextOverflow):
            failed = True
            self._counters["errors"] += 1
            raise
        finally:
            self._rids.pop(request_id, None)
            if response is not None:
                self._finish_response(response, ended=finish is not None)  # a failure leaves finish None
            if finish is None:  # the client left, or it failed: free SGLang's slot at once
                await self._abort_rid(rid)
            self._record(rid, decoder, finish, failed, started, first_at)

    def _finish_response(self, response: aiohttp.ClientResponse, ended: bool) -> None:
        """Give the connection back. A stream read to its finish event still holds SGLang's `[DONE]`:
        aiohttp closes a half-read response's connection, and the next request would open another
        before its first token, so the rest is read in the background instead (the caller, which
        stops reading at the finish event, waits for none of it)."""
        if not ended:
            response.close()
        elif response.content.at_eof():
            response.release()
        else:
            task = asyncio.get_running_loop().create_task(_drain(response))
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)

    async def abort(self, request_id: str) -> None:
        rid = self._rids.get(request_id)
        if rid is not None:
            await self._abort_rid(rid)  # the stream then ends with finish_reason "abort"

    async def _abort_rid(self, rid: str) -> None:
        try:
            async with self._http().post(
                f"{self.url}/abort_request", json={"rid": rid}, timeout=aiohttp.ClientTimeout(total=ABORT_TIMEOUT_S)
            ):
                pass
        except TRANSPORT_ERRORS:
            pass  # SGLang is gone or restarting: nothing left to abort

    def _http(self) -> aiohttp.ClientSession:
        """The connection pool to SGLang. aiohttp, not httpx: httpx's own work per request, on the
        event loop before the first token, is several times aiohttp's (docs/engine-notes.md)."""
        if self._session is None:
            # No read timeout worth the name: a long prefill sends nothing for a while. A dead server
            # breaks the connection instead, and the supervisor restarts it.
            timeout = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=600.0)
            connector = aiohttp.TCPConnector(keepalive_timeout=KEEP_IDLE_S)
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=timeout, connector=connector)
        return self._session

    def _record(
        self, rid: str, decoder: StreamDecoder, finish: str | None, failed: bool, started: float, first_at: float | None
    ) -> None:
        meta, c = decoder.meta, self._counters
        if not failed:
            c["finished" if finish in ("stop", "length") else "aborted"] += 1
        c["prompt_tokens"] += int(meta.get("prompt_tokens") or 0)
        c["cached_tokens"] += int(meta.get("cached_tokens") or 0)
        c["generated_tokens"] += decoder.emitted
        self._last = {
            "rid": rid,
            "finish_reason": finish,
            "prompt_tokens": meta.get("prompt_tokens"),
            "cached_tokens": meta.get("cached_tokens"),
            "completion_tokens": decoder.emitted,
            "ttft_ms": None if first_at is None else round((first_at - started) * 1e3, 3),
            "total_ms": round((time.perf_counter() - started) * 1e3, 3),
            "e2e_latency_s": meta.get("e2e_latency"),
            "accept_length": meta.get("spec_accept_length"),  # the key `lingcode bench` reads, as on the local engine
            **{key: meta[key] for key in SPEC_FIELDS if key in meta},
        }

    def stats(self) -> dict:
        return {
            **self._counters,
            "running": list(self._rids),
            "draining": len(self._drains),
            "url": self.url,
            "last_request": dict(self._last),
            "server": self._status(),
        }

    async def close(self) -> None:
        for task in list(self._drains):
            task.cancel()
        if self._session is not None:
            await self._session.close()
        if self._on_close is not None:
            await asyncio.to_thread(self._on_close)  # stopping SGLang takes seconds
