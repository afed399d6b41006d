"""The embedded engine: one Llama-family model in torch, batch 1, on the CPU or one GPU.

The decode loop runs on one worker thread (torch releases the GIL inside its kernels), so the
daemon's event loop stays free to accept requests and aborts while a request runs. Tokens go
back to the loop one chunk per step; an abort is checked between steps, so it takes effect
within one step.

Prefix reuse: the KV cache keeps the tokens it was last fed. A request whose input starts with
them prefills only the rest, which is what makes a chat's next turn (or an agent's) cheap.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator

import torch

from lingcode.engine import ContextOverflow, EngineError, ModelInfo, SamplingParams, TokenChunk
from lingcode.engine.local.kv_store import PrefixStore
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.sampling import sample
from lingcode.engine.local.weights import Checkpoint

PREFILL_CHUNK = 512  # prompt tokens per forward while prefilling
KV_STORE_BYTES = 512 * 1024 * 1024  # saved KV prefixes (kv_store.py), e.g. an agent session's


@dataclass
class _Request:
    request_id: str
    input_ids: list[int]
    params: SamplingParams
    emit: callable
    aborted: threading.Event = field(default_factory=threading.Event)
    steps_after_abort: int = 0


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class LocalEngine:
    def __init__(self, checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype,
                 kv_store_bytes: int = KV_STORE_BYTES):
        cfg = checkpoint.config
        self.device, self.dtype = device, dtype
        self.model = Transformer.from_weights(cfg, checkpoint.weights, dtype, device)
        self.model.setup_cache(cfg.context_length)
        self.info = ModelInfo(
            name=checkpoint.name,
            context_length=cfg.context_length,
            eos_token_ids=checkpoint.eos_token_ids,
            tokenizer=checkpoint.tokenizer,
            chat_template=checkpoint.chat_template,
            bos_token=checkpoint.bos_token,
            eos_token=checkpoint.eos_token,
            extra={"engine": "local", "device": str(device), "dtype": str(dtype).removeprefix("torch.")},
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingcode-engine")
        self._requests: dict[str, _Request] = {}
        self._cached_ids: list[int] = []  # tokens whose keys/values are in the cache, in order
        self.kv_store = PrefixStore(kv_store_bytes)
        self._counters = dict.fromkeys(
            ("requests", "finished", "aborted", "errors", "prompt_tokens", "cached_tokens",
             "prefilled_tokens", "generated_tokens", "forward_passes"), 0
        )  # fmt: skip
        self._last: dict = {}
        self._running: str | None = None

    # --- the Engine interface -----------------------------------------------------------------

    async def generate(
        self, request_id: str, input_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        if not input_ids:
            raise ValueError("input_ids is empty")
        if len(input_ids) >= self.info.context_length:
            raise ContextOverflow(
                f"{len(input_ids)} input tokens leave no room in the model's context of "
                f"{self.info.context_length} tokens"
            )
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue()
        req = _Request(request_id, list(input_ids), params, lambda c: loop.call_soon_threadsafe(chunks.put_nowait, c))
        self._requests[request_id] = req
        done = asyncio.wrap_future(self._worker.submit(self._run, req))
        try:
            while True:
                chunk = await chunks.get()
                if isinstance(chunk, BaseException):
                    raise chunk
                yield chunk
                if chunk.finish_reason is not None:
                    break
        finally:
            req.aborted.set()  # no-op when finished; stops the loop within a step otherwise
            self._requests.pop(request_id, None)
            await asyncio.shield(done)

    async def abort(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            req.aborted.set()

    def stats(self) -> dict:
        return {**self._counters, "running": self._running, "cached_context_tokens": len(self._cached_ids),
                "last_request": dict(self._last), "kv_store": self.kv_store.stats()}  # fmt: skip

    async def close(self) -> None:
        for req in list(self._requests.values()):
            req.aborted.set()
        self._worker.shutdown(wait=True)

    # --- the worker thread --------------------------------------------------------------------

    def _run(self, req: _Request) -> None:
        self._running = req.request_id
        try:
            with torch.inference_mode():
                self._decode(req)
        except Exception as exc:  # the request fails; the engine stays usable
            self._cached_ids = []
            self._counters["errors"] += 1
            req.emit(EngineError(f"engine failed: {type(exc).__name__}: {exc}"))
        finally:
            self._running = None

    def _forward(self, ids: list[int], start: int) -> torch.Tensor:
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        del self._cached_ids[start:]
        logits = self.model(tokens, start)
        self._cached_ids.extend(ids)
        self._counters["forward_passes"] += 1
        return logits[0, -1]

    def _decode(self, req: _Request) -> None:
        params, ids = req.params, req.input_ids
        counters = self._counters
        counters["requests"] += 1
        # Reuse the cached prefix; at least one token is fed to get the next token's logits.
        cached = min(self._reuse_prefix(ids), len(ids) - 1)
        counters["prompt_tokens"] += len(ids)
        counters["cached_tokens"] += cached
        counters["prefilled_tokens"] += len(ids) - cached
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.info.eos_token_ids))
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        max_new = min(params.max_tokens, self.info.context_length - len(ids))

        t0 = time.perf_counter()
        logits = None
        for start in range(cached, len(ids), PREFILL_CHUNK):  # chunks, so an abort lands mid-prefill
            if req.aborted.is_set():
                break
            logits = self._forward(ids[start : start + PREFILL_CHUNK], start)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        generated: list[int] = []
        finish = None
        while finish is None:
            if req.aborted.is_set():
                finish = "abort"
                break
            if params.constraint is not None:
                params.constraint.mask_logits(logits)
            token = int(sample(logits, params, generator))  # one host read per step (issue 7 removes it)
            generated.append(token)
            if params.constraint is not None:
                params.constraint.accept(token)
            if token in stop_ids or (params.constraint is not None and params.constraint.is_terminated()):
                finish = "stop"
            elif len(generated) >= max_new:
                finish = "length"
            req.emit(TokenChunk([token], finish, len(ids), cached))
            if finish is None:
                logits = self._forward([token], len(ids) + len(generated) - 1)
                if req.aborted.is_set():
                    req.steps_after_abort += 1
        if finish == "abort":
            req.emit(TokenChunk([], "abort", len(ids), cached))
            counters["aborted"] += 1
        else:
            counters["finished"] += 1
        counters["generated_tokens"] += len(generated)
        self._last = {
            "request_id": req.request_id, "prompt_tokens": len(ids), "cached_tokens": cached,
            "prefilled_tokens": len(ids) - cached, "generated_tokens": len(generated), "finish_reason": finish,
            "steps_after_abort": req.steps_after_abort, "prefill_ms": round(prefill_ms, 3),
            "decode_ms": round((time.perf_counter() - t0) * 1e3 - prefill_ms, 3),
        }  # fmt: skip

    def _reuse_prefix(self, ids: list[int]) -> int:
        """How many leading tokens of ids the cache holds: the live cache's, or a saved prefix's."""
        live = _common_prefix(self._cached_ids, ids)
        caches = [layer.attn.kv_cache for layer in self.model.layers]
        saved, shared = self.kv_store.best_match(ids)
        restore = saved if shared > live else None
        # Either way (restored prefix or this request's own tokens) the cache keeps only its first
        # `live` positions: save it first if that loses most of it, never evicting what we restore.
        if self.kv_store.should_save(len(self._cached_ids), live):
            self.kv_store.save(self._cached_ids, caches, keep=restore)
        if restore is not None:
            self.kv_store.restore(saved, shared, caches)
            self._cached_ids = list(saved[:shared])
            return shared
        return live


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(device)


def load_engine(model_path, device: str = "auto") -> LocalEngine:
    """Load a GGUF file or Hugging Face directory: f32 on the CPU, bf16 on a GPU."""
    from lingcode.engine.local.weights import load_checkpoint

    dev = pick_device(device)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    return LocalEngine(load_checkpoint(model_path), dev, dtype)
