"""The embedded engine: one Llama-family model in torch, batch 1, on the CPU or one GPU.

The decode loop runs on one worker thread (torch releases the GIL inside its kernels), so the
daemon's event loop stays free to accept requests and aborts while a request runs. Tokens go
back to the loop through a ChunkChannel (what piled up since the loop last looked, as one
chunk); an abort is checked between steps, so it takes effect within one step.

Prefix reuse: the KV cache keeps the tokens it was last fed. A request whose input starts with
them prefills only the rest, which is what makes a chat's next turn (or an agent's) cheap.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import dataclasses
import queue
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from dataclasses import dataclass, field
from typing import AsyncIterator

import torch

from lingcode.engine import (
    CPU_STREAM_INTERVAL_S,
    STREAM_INTERVAL_S,
    ChunkChannel,
    ContextOverflow,
    EngineError,
    ModelInfo,
    SamplingParams,
    TokenChunk,
    common_prefix,
    handed_over,
)
from lingcode.engine.local.kv_store import MIN_SAVE_TOKENS, PrefixStore
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.sampling import RepetitionPenalty, sample
from lingcode.engine.local.speculative import (
    DraftLength,
    Drafter,
    EarlyExitDrafter,
    NGramDrafter,
    verify_greedy,
    verify_sampled,
)
from lingcode.engine.local.steps import pick_step
from lingcode.engine.local.weights import Checkpoint

log = logging.getLogger(__name__)

KV_STORE_BYTES = 512 * 1024 * 1024  # saved KV prefixes (kv_store.py), e.g. an agent session's


@dataclass
class _Request:
    request_id: str
    input_ids: list[int]
    params: SamplingParams
    emit: callable
    aborted: threading.Event = field(default_factory=threading.Event)
    steps_after_abort: int = 0
    admitted: float = field(default_factory=time.perf_counter)  # when the engine took it (submit, run)


@dataclass
class _Run:
    """One request's decoding state, shared by the prefill, the decode loop and the speculative step."""

    req: _Request
    cached: int  # prompt tokens whose keys/values the cache held already
    max_new: int
    stop_ids: set[int]
    generator: torch.Generator | None
    drafter: Drafter | None
    penalty: RepetitionPenalty | None = None  # None: repetition_penalty 1, nothing to do per step
    generated: list[int] = field(default_factory=list)
    steps: int = 0  # forwards after the prefill (verify or plain steps)
    drafted: int = 0
    accepted: int = 0
    from_prefill: int = 1  # the first token came from the prefill's logits, not from a counted step
    prefill_ms: float = 0.0
    first_chunk_ms: float | None = None  # from admission to the first chunk handed to emit
    hand_over_ms: float | None = None  # emit of the first chunk (on the CPU: until the reader took it)
    barrier_sleeps: int | None = None  # the CPU step's count when the request began (None: not that step)


class Worker:
    """The engine's one thread, running requests in turn. Handing it one is a queue put, and its
    end reaches the event loop as one call_soon_threadsafe: a ThreadPoolExecutor's submit wrapped
    in an asyncio future cost several times that, on the way to every first token."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # started by the first job (an engine's own process has none)
        self._starting = threading.Lock()

    def put(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            with self._starting:  # one thread, however many callers come first
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="lingcode-engine", daemon=True)
                    self._thread.start()
        self._jobs.put(job)

    def close(self) -> None:
        """Finish the jobs queued, then end the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except BaseException:  # a job's own failure is reported by the job; the thread goes on
                log.exception("engine worker job failed")


def _finish_soon(loop: asyncio.AbstractEventLoop, done: asyncio.Future) -> None:
    """Worker thread: tell the loop that a request is done, unless the loop closed meanwhile."""
    if not loop.is_closed():
        try:
            loop.call_soon_threadsafe(_finish, done)
        except RuntimeError:  # it closed between the check and the call
            pass


def _finish(done: asyncio.Future) -> None:
    if not done.done():
        done.set_result(None)


class LocalEngine:
    def __init__(
        self,
        checkpoint: Checkpoint,
        device: torch.device,
        dtype: torch.dtype,
        speculation: str = "ngram",
        cuda_graphs: bool = True,
        compile: bool = False,
        kv_store_bytes: int = KV_STORE_BYTES,
        kernels: str = "auto",
        model: Transformer | None = None,
        step_cost: dict | None = None,
    ):
        """model: one build_model() made from this checkpoint already (a prepared one, mapped from the
        cache); step_cost: what measure_step_costs() measured for it before."""
        cfg = checkpoint.config
        kernels = pick_kernels(kernels, device, cuda_graphs, compile, checkpoint)
        self.speculation, self.draft_layers = parse_speculation(speculation, cfg.n_layers)
        self.device, self.dtype = device, dtype
        self.model = model if model is not None else build_model(checkpoint, dtype, device, kernels)
        self.model.setup_cache(cfg.context_length)
        self.step = pick_step(checkpoint, self.model, device, kernels, cuda_graphs, compile)
        # ms of a step verifying k = 0, 1, ... drafts: remembered for a prepared model, not for a compiled step
        self.step_costs = step_cost if step_cost is not None and not compile else measure_step_costs(self.step, device)
        self.step_cost, self.step_cost_per_position = self.step_costs["at_start"], self.step_costs["per_position"]
        self.draft_length = DraftLength(self.step_cost, self.step_cost_per_position)
        # Every wake-up of the event loop (detokenize, parsers, an SSE frame, the client reading it)
        # takes a core from the step's threads when they use every core (the CPU), and the other
        # thread then waits at its barrier: wake it less often there (docs/engine-notes.md).
        cores = (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )  # macOS: no affinity
        all_cores = device.type == "cpu" and torch.get_num_threads() >= cores
        self.stream_interval_s = float(os.environ.get("LINGCODE_STREAM_INTERVAL_MS", 0)) / 1e3 or (
            CPU_STREAM_INTERVAL_S if all_cores else STREAM_INTERVAL_S
        )
        self.hand_over_first = all_cores  # ChunkChannel: the loop gets a core for the first token
        # A stream's head goes out once the engine has the request, and the client reads it while the
        # first step runs; where the step uses every core that reading slows the step as much.
        self.head_early = not all_cores
        # There it goes out before the engine has the request (_admit refuses only what the daemon checked).
        self.head_before_submit = all_cores
        self.info = ModelInfo(
            name=checkpoint.name,
            context_length=cfg.context_length,
            eos_token_ids=checkpoint.eos_token_ids,
            tokenizer=checkpoint.tokenizer,
            chat_template=checkpoint.chat_template,
            bos_token=checkpoint.bos_token,
            eos_token=checkpoint.eos_token,
            extra={
                "engine": "local",
                "device": str(device),
                "dtype": str(dtype).removeprefix("torch."),
                "kv_cache_dtype": str(self.model.layers[0].attn.kv_cache.k.dtype).removeprefix("torch."),
                "speculation": speculation,
                "kernels": kernels,
                "step": self.step.name,
            },
        )
        self._worker = Worker()
        self._requests: dict[str, _Request] = {}
        self._cached_ids: list[int] = []  # tokens whose keys/values are in the cache, in order
        self.kv_store = PrefixStore(kv_store_bytes)
        self._counters = dict.fromkeys(
            (
                "requests",
                "finished",
                "aborted",
                "errors",
                "prompt_tokens",
                "cached_tokens",
                "prefilled_tokens",
                "generated_tokens",
                "forward_passes",
                "decode_steps",
                "draft_tokens",
                "accepted_draft_tokens",
                "host_waits",
            ),
            0,
        )
        self._last: dict = {}
        self._running: str | None = None
        self._ngram = NGramDrafter()  # used by one request at a time: the worker thread's

    def set_speculation(self, speculation: str) -> None:
        """Switch drafting for the requests that start from now on ("off", "ngram", "early-exit:L")."""
        self.speculation, self.draft_layers = parse_speculation(speculation, self.model.cfg.n_layers)
        self.draft_length = DraftLength(self.step_cost, self.step_cost_per_position)
        self.info.extra["speculation"] = speculation

    def reset_cache(self) -> None:
        """Forget the cached prefix (benchmarks: every variant starts from a cold cache)."""
        self._cached_ids.clear()

    # --- the Engine interface -----------------------------------------------------------------

    async def generate(
        self, request_id: str, input_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        loop = asyncio.get_running_loop()
        chunks = ChunkChannel(loop, self.chunk_interval(params), self.hand_over_first)
        done = loop.create_future()
        self._start(request_id, input_ids, params, chunks.put, lambda: _finish_soon(loop, done))
        if self.head_early:
            handed_over()
        try:
            while True:
                chunk = await chunks.get()
                yield chunk
                if chunk.finish_reason is not None:
                    break
        finally:
            chunks.release()
            self.stop(request_id)  # no-op when finished; stops the loop within a step otherwise
            await asyncio.shield(done)

    async def abort(self, request_id: str) -> None:
        self.stop(request_id)

    def submit(self, request_id: str, input_ids: list[int], params: SamplingParams, emit) -> Future:
        """Run one request on the worker thread, which calls emit() with each step's TokenChunk (or
        the exception that ends it); the future is done once the request is (generate() hands the
        chunks to the event loop instead)."""
        done: Future = Future()
        self._start(request_id, input_ids, params, emit, lambda: done.set_result(None))
        return done

    def _start(
        self, request_id: str, input_ids: list[int], params: SamplingParams, emit, finished: Callable[[], None]
    ) -> None:
        req = self._admit(request_id, input_ids, params, emit)

        def job() -> None:
            try:
                self._run_and_tidy(req)
            finally:
                self._requests.pop(request_id, None)
                finished()

        self._worker.put(job)

    def run(self, request_id: str, input_ids: list[int], params: SamplingParams, emit) -> None:
        """submit()'s work in the calling thread, to the end (the engine's own process runs requests
        on the thread that reads them: no hand-over to the worker, one thread wake-up less). The
        caller calls tidy() once it has passed the last chunk on."""
        req = self._admit(request_id, input_ids, params, emit)
        try:
            self._run(req)
        finally:
            self._requests.pop(request_id, None)

    def tidy(self) -> None:
        """The last request's bookkeeping that need not delay its last chunk nor the next request's
        first: the n-gram drafter's, the one drafter kept across requests (it indexes the output,
        and readies the prompt's index for a retry; a no-op when it did not draft)."""
        self._ngram.finish()

    def _admit(self, request_id: str, input_ids: list[int], params: SamplingParams, emit) -> _Request:
        if not input_ids:
            raise ValueError("input_ids is empty")
        if len(input_ids) >= self.info.context_length:
            raise ContextOverflow(
                f"{len(input_ids)} input tokens leave no room in the model's context of "
                f"{self.info.context_length} tokens"
            )
        self._requests[request_id] = req = _Request(request_id, list(input_ids), params, emit)
        return req

    def stop(self, request_id: str) -> None:
        """Abort a running request from any thread: it ends within a step."""
        req = self._requests.get(request_id)
        if req is not None:
            req.aborted.set()

    def chunk_interval(self, params: SamplingParams) -> float:
        """How long a request's chunks may wait to be handed over (ChunkChannel)."""
        return STREAM_INTERVAL_S if params.text_ends else self.stream_interval_s

    def stats(self) -> dict:
        return {
            **self._counters,
            "running": self._running,
            "cached_context_tokens": len(self._cached_ids),
            "last_request": dict(self._last),
            "kv_store": self.kv_store.stats(),
        }

    async def close(self) -> None:
        for req in list(self._requests.values()):
            req.aborted.set()
        self._worker.close()

    # --- the worker thread --------------------------------------------------------------------

    def _run_and_tidy(self, req: _Request) -> None:
        self._run(req)
        self.tidy()  # the last chunk is with the event loop already

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

    def _forward(self, ids: list[int], start: int, all_logits: bool = False) -> torch.Tensor:
        """Feed ids at positions start..; logits of the last position [V] (or of every one [T, V])."""
        del self._cached_ids[start:]
        logits = self.step(ids, start, all_logits=all_logits)
        self._cached_ids.extend(ids)
        self._counters["forward_passes"] += 1
        return logits if all_logits else logits[-1]

    def _choose(self, logits: torch.Tensor, run: _Run) -> int:
        params = run.req.params
        if run.penalty is not None:
            run.penalty.apply(logits)
        if params.constraint is not None:
            params.constraint.mask_logits(logits)
        token = int(sample(logits, params, run.generator))  # one host read per step
        if params.constraint is not None:
            params.constraint.accept(token)
        return token

    def _drafter(self, params: SamplingParams) -> Drafter | None:
        if self.speculation == "off" or params.constraint is not None or not self.step.drafts:
            # a grammar would have to roll drafts back too; a step that is not bit-exact across
            # widths would change the answer (steps.TorchStep): one token per step instead
            return None
        if self.speculation == "ngram":  # one for every request: it keeps the index of a shared prefix
            self._ngram.copy_recent = params.greedy  # a seeded sample must not depend on earlier requests
            return self._ngram
        return EarlyExitDrafter(self.step, self.draft_layers)

    def _decode(self, req: _Request) -> None:
        params, ids, counters = req.params, req.input_ids, self._counters
        counters["requests"] += 1
        # Reuse the cached prefix; at least one token is fed to get the next token's logits.
        max_new = min(params.max_tokens, self.info.context_length - len(ids))
        reach = len(ids) + max_new + max(self.step.widths)  # past the last position a step may write (padding, drafts)
        cached = min(self._reuse_prefix(ids, reach), len(ids) - 1)
        counters["prompt_tokens"] += len(ids)
        counters["cached_tokens"] += cached
        counters["prefilled_tokens"] += len(ids) - cached
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(
                params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
            )
        run = _Run(
            req,
            cached,
            max_new=max_new,
            stop_ids=set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.info.eos_token_ids)),
            generator=generator,
            drafter=self._drafter(params),
            penalty=RepetitionPenalty(ids, params.repetition_penalty, self.device)
            if params.repetition_penalty != 1.0
            else None,
        )
        _time_first_chunk(run)
        if run.drafter is not None:
            run.drafter.start(ids)
        run.barrier_sleeps = self._barrier_sleeps()
        t0 = time.perf_counter()
        logits, tail = self._prefill(run)
        if req.aborted.is_set():
            finish = "abort"
        elif self.step.pipelined and run.drafter is None and params.constraint is None:
            finish = self._pipelined_loop(run, logits)
        else:
            finish = self._decode_loop(run, self._first_tokens(run, logits, tail))
        self._account(run, finish, (time.perf_counter() - t0) * 1e3)

    def _prefill(self, run: _Run) -> tuple[torch.Tensor | None, tuple[int, int] | None]:
        """Feed the prompt past the cached prefix, chunk by chunk, checking for an abort between
        chunks. Returns the last chunk's logits, or (where drafting can use it) that last chunk
        unfed: often one typed character (prefix reuse), it then goes with a draft of what follows
        it, verified in the same step: a step sooner to the first tokens. Only where the drafter
        needs nothing of that chunk in the cache (n-grams; a one-token chunk)."""
        ids, drafter = run.req.input_ids, run.drafter
        chunks = self.step.prefill_chunks(run.cached, len(ids))
        tail = None
        if drafter is not None and (isinstance(drafter, NGramDrafter) or chunks[-1][1] - chunks[-1][0] == 1):
            tail = chunks.pop()
        started = time.perf_counter()
        logits = None
        for start, end in chunks:
            if run.req.aborted.is_set():  # between chunks, so an abort lands mid-prefill
                break
            logits = self._forward(ids[start:end], start)
        run.prefill_ms = (time.perf_counter() - started) * 1e3
        return logits, tail

    def _first_tokens(self, run: _Run, logits: torch.Tensor | None, tail: tuple[int, int] | None) -> list[int]:
        """The first step's tokens: from the prefill's logits, or the prompt's tail fed with a draft."""
        ids = run.req.input_ids
        if tail is not None:
            start, end = tail
            draft, draft_probs = run.drafter.propose(self.draft_length.at(start))
            draft = draft[: min(self.step.draft_room(start, end - start), run.max_new - 1)]
            if draft:
                run.from_prefill = 0
                return self._speculative_step(run, ids[start:end], start, draft, draft_probs)
            logits = self._forward(ids[start:end], start)
        return [self._choose(logits, run)]

    def _decode_loop(self, run: _Run, new: list[int]) -> str:
        """Emit tokens step by step, each step plain or speculative, until a stop, the length limit
        or an abort (checked between steps); returns the finish reason."""
        req, params, generated = run.req, run.req.params, run.generated
        n_prompt = len(req.input_ids)
        while True:
            new, finish = self._take(new, generated, run.stop_ids, run.max_new, params)
            if run.penalty is not None:
                run.penalty.add(new)
            accept_length = (len(generated) - run.from_prefill) / run.steps if run.drafter and run.steps else None
            req.emit(TokenChunk(new, finish, n_prompt, run.cached, accept_length if finish else None))
            if finish is not None:
                return finish
            if req.aborted.is_set():
                return "abort"
            pos = n_prompt + len(generated) - 1  # the pending token: emitted, not fed yet
            draft, draft_probs = [], None
            if run.drafter is not None:
                run.drafter.extend(new)
                draft, draft_probs = run.drafter.propose(self.draft_length.at(pos))
                draft = draft[: self.step.draft_room(pos, 1)]
            draft = draft[: run.max_new - len(generated)]
            if draft:
                new = self._speculative_step(run, [generated[-1]], pos, draft, draft_probs)
            else:
                if run.drafter is not None:
                    self.draft_length.update(0, 0)
                new = [self._choose(self._forward([generated[-1]], pos), run)]
                run.steps += 1
            if req.aborted.is_set():
                req.steps_after_abort += 1

    def _speculative_step(self, run: _Run, fed: list[int], pos: int, draft: list[int], draft_probs) -> list[int]:
        """One step feeding `fed` (tokens the cache lacks, the last one's next token pending) and the
        draft after them, from pos: the tokens to emit, accepted drafts and the target's own next."""
        params = run.req.params
        logits = self._forward([*fed, *draft], pos, all_logits=True)[len(fed) - 1 :]
        if run.penalty is not None:  # each position's logits, for the sequence up to it: lossless still
            run.penalty.apply(logits, draft)
        if params.greedy:
            new = verify_greedy(logits, draft)
        else:
            new = verify_sampled(logits, draft, draft_probs, params, run.generator)
        del self._cached_ids[pos + len(fed) + len(new) - 1 :]  # keys/values of rejected drafts are stale
        run.steps += 1
        run.drafted += len(draft)
        run.accepted += len(new) - 1
        self.draft_length.update(len(draft), len(new) - 1)
        return new

    def _account(self, run: _Run, finish: str, total_ms: float) -> None:
        req, counters, ids = run.req, self._counters, run.req.input_ids
        if finish == "abort":
            req.emit(TokenChunk([], "abort", len(ids), run.cached))
            counters["aborted"] += 1
        else:
            counters["finished"] += 1
        generated, steps = len(run.generated), run.steps
        counters["generated_tokens"] += generated
        counters["decode_steps"] += steps
        counters["draft_tokens"] += run.drafted
        counters["accepted_draft_tokens"] += run.accepted
        self._last = {
            "request_id": req.request_id,
            "prompt_tokens": len(ids),
            "cached_tokens": run.cached,
            "prefilled_tokens": len(ids) - run.cached,
            "generated_tokens": generated,
            "finish_reason": finish,
            "steps_after_abort": req.steps_after_abort,
            "prefill_ms": round(run.prefill_ms, 3),
            "decode_ms": round(total_ms - run.prefill_ms, 3),
            "decode_steps": steps,
            "draft_tokens": run.drafted,
            "accepted_draft_tokens": run.accepted,
            "accept_length": round((generated - 1) / steps, 3) if steps else None,
            "first_chunk_ms": None if run.first_chunk_ms is None else round(run.first_chunk_ms, 3),
            "admitted_at_ms": round(req.admitted * 1e3, 3),  # perf_counter's clock: every process's here
            "hand_over_ms": None if run.hand_over_ms is None else round(run.hand_over_ms, 3),
            "barrier_sleeps": None if run.barrier_sleeps is None else self._barrier_sleeps() - run.barrier_sleeps,
        }

    def _barrier_sleeps(self) -> int | None:
        """How often the native CPU step's threads have slept at a barrier: a partner came late,
        its core taken by other work (the daemon's loop, a client). None for other steps."""
        sleeps = getattr(self.step, "sleeps", None)
        return None if sleeps is None else sleeps()

    def _pipelined_loop(self, run: _Run, logits: torch.Tensor) -> str:
        """Plain decoding on the GPU with no host wait on the critical path.

        The sampled token stays on the device and feeds the next step directly; step k+1 is
        enqueued before the host reads step k's token, which comes back through one non-blocking
        copy into pinned memory. The host's Python (stop checks, streaming) then overlaps the GPU's
        work instead of idling it. A token read after a stop costs one wasted step, never a wrong one.
        """
        req, params, generator, generated = run.req, run.req.params, run.generator, run.generated
        n_prompt = len(req.input_ids)
        runner = self.step.runner
        host, ready = runner.readback, runner.ready  # allocated once: pinned allocations are slow
        penalty = run.penalty
        in_graph = params.greedy and penalty is None  # the argmax runs in the captured step (replay_greedy)

        def choose(logits: torch.Tensor) -> torch.Tensor:
            if penalty is not None:
                penalty.apply(logits)
            token = sample(logits, params, generator).view(1)
            if penalty is not None:
                penalty.add(token)  # on the device: no host read
            return token

        token = choose(logits)
        host[0:1].copy_(token, non_blocking=True)
        ready[0].record()
        if in_graph:  # the token and its position stay in the runner's buffers (replay_greedy)
            runner.tokens[0, :1].copy_(token)
            runner.positions[:1].fill_(n_prompt)
        finish, step, pos = None, 0, n_prompt  # pos: where the token being read will sit
        while finish is None:
            fed = len(generated) + 1 < run.max_new
            if fed:  # enqueue the next step before reading this one's token
                if in_graph:
                    runner.replay_greedy(pos + 1)
                    token = runner.tokens[0, :1]
                else:
                    runner.tokens[0, :1].copy_(token)
                    runner.positions[:1].fill_(pos)
                    token = choose(runner.replay(1, pos + 1)[0])
                slot = (step + 1) % 2
                host[slot : slot + 1].copy_(token, non_blocking=True)
                ready[slot].record()
                run.steps += 1
            ready[step % 2].synchronize()  # waits for step k only: step k+1 is already queued behind it
            self._counters["host_waits"] += 1
            value = int(host[step % 2])
            if fed:
                self._cached_ids.append(value)
                self._counters["forward_passes"] += 1
            new, finish = self._take([value], generated, run.stop_ids, run.max_new, params)
            req.emit(TokenChunk(new, finish, n_prompt, run.cached))
            if finish is None and req.aborted.is_set():
                finish = "abort"
                req.steps_after_abort = int(fed)  # at most the one step already queued
            step += 1
            pos += 1
        return finish

    @staticmethod
    def _take(new, generated, stop_ids, max_new, params) -> tuple[list[int], str | None]:
        """Append the step's tokens up to the first stop token or the length limit."""
        for i, token in enumerate(new):
            generated.append(token)
            if (
                token in stop_ids
                or token in params.final_token_ids
                or (params.constraint is not None and params.constraint.is_terminated())
            ):
                return new[: i + 1], "stop"
            if len(generated) >= max_new:
                return new[: i + 1], "length"
        return new, None

    def _reuse_prefix(self, ids: list[int], reach: int) -> int:
        """How many leading tokens of ids the cache holds: the live cache's, or a saved prefix's.
        `reach`: past the last position this request may write; the prefix store copies what it
        keeps there before the request writes it."""
        live = common_prefix(self._cached_ids, ids)
        caches = [layer.attn.kv_cache for layer in self.model.layers]
        store = self.kv_store
        saved, shared = store.best_match(ids)
        # A saved entry is restored (and so kept from eviction) only if it saves real prefill: one
        # that shares a few more tokens than the live cache (prompts that open alike, e.g. a first
        # line with a timestamp) would otherwise stop the live cache, maybe a long conversation,
        # from being saved.
        restore = saved if shared >= live + MIN_SAVE_TOKENS else None
        # Either way (restored prefix or this request's own tokens) the cache keeps only its first
        # `live` positions: save it first if that loses most of it, never evicting what we restore.
        if store.should_save(len(self._cached_ids), live, len(ids)):
            store.save(self._cached_ids, caches, reach, keep=restore)
        if restore is not None:
            self._cached_ids, live = list(store.restore(restore, shared, caches)), shared
            # an entry the cache now holds whole, as if it had never left: saved again by the same rule
            if store.should_save(len(self._cached_ids), live, len(ids)):
                store.save(self._cached_ids, caches, reach)
        store.protect(reach, caches)
        return live


def _time_first_chunk(run: _Run) -> None:
    """Time the request's first chunk from its admission: the engine's own share of the first token
    (the daemon's trace has the rest); and its hand-over, which on the CPU holds the next step until
    the reader has passed the chunk on (ChunkChannel). emit is wrapped for that one call only, so
    the decode loops call it as they always do."""
    req = run.req
    emit = req.emit

    def first(chunk) -> None:
        handed = time.perf_counter()
        run.first_chunk_ms = (handed - req.admitted) * 1e3
        req.emit = emit
        emit(chunk)
        run.hand_over_ms = (time.perf_counter() - handed) * 1e3

    req.emit = first


def build_model(
    checkpoint: Checkpoint, dtype: torch.dtype, device: torch.device, kernels: str = "torch"
) -> Transformer:
    """The checkpoint's weights as the engine runs them on this device with these kernels (no KV cache yet)."""
    native = device.type == "cpu" and kernels == "native"
    model = Transformer.from_weights(checkpoint.config, checkpoint.weights, dtype, device, matrices=not native)
    if native:  # the native step reads the file's blocks itself
        model.use_native_step()
    elif device.type == "cpu":  # bf16 matmuls, the file's 4-bit weights for decoding (quantized.py)
        model.use_cpu_matmuls(checkpoint.q4)
    return model


COST_CONTEXT = 4096  # positions of context at which step costs are timed a second time


def measure_step_costs(step, device: torch.device, rounds: int = 4) -> dict:
    """ms of a step verifying k = 0, 1, ... drafts (k + 1 tokens) with this step, timed at load at
    position 0 ("at_start") and what each position of context adds ("per_position", from a second
    timing COST_CONTEXT positions in: the cache's contents do not change the time), for
    DraftLength: what a longer draft costs is what it must earn. Rounds go through every width in
    turn and each width keeps its fastest time, so that other work on the machine during the load
    slows all widths alike instead of skewing their ratios."""
    k_max = step.widths[-1]
    far = max(0, min(COST_CONTEXT, step_max_len(step) - k_max - 1))
    ms = {(width, at): float("inf") for width in step.widths for at in (0, far)}
    with torch.inference_mode():
        for round_ in range(rounds + 1):  # round 0 is a warm-up
            for width, at in ms:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                step([0] * width, at, all_logits=width > 1)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if round_:
                    ms[width, at] = min(ms[width, at], (time.perf_counter() - started) * 1e3)

    def costs(at: int) -> list[float]:  # a draft is padded up to a step width; a wider step costs no less
        return list(itertools.accumulate((ms[step.padded_width(k + 1), at] for k in range(k_max)), max))

    start, later = costs(0), costs(far)
    per_position = [max(0.0, (b - a) / far) if far else 0.0 for a, b in zip(start, later)]
    return {"at_start": start, "per_position": list(itertools.accumulate(per_position, max))}


def step_max_len(step) -> int:
    return step.max_len if hasattr(step, "max_len") else step.model.max_len


def pick_kernels(kernels: str, device: torch.device, cuda_graphs: bool, compile: bool, checkpoint=None) -> str:
    """ "auto": on a GPU the Triton step where it can run (captured graphs on a GPU, Triton
    importable, no torch.compile, which is for the torch kernels), else torch; on the CPU the
    native step where it can run (lingcode's native code builds, the model's matrices are in a
    format it reads, no torch.compile), else torch; the reason it cannot is logged."""
    if kernels != "auto":
        return kernels
    if device.type == "cpu":
        if compile:
            return "torch"
        from lingcode.engine.local import cpu_step

        reason = cpu_step.unavailable(checkpoint) if checkpoint is not None else "no checkpoint given"
        if reason is not None:
            log.warning("the native CPU step cannot run this model here (%s): using torch's kernels", reason)
            return "torch"
        return "native"
    if not cuda_graphs or compile:
        return "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(device)


def parse_speculation(spec: str, n_layers: int) -> tuple[str, int]:
    """ "off", "ngram" (prompt lookup) or "early-exit:L" (the target's first L layers as the draft model)."""
    if spec in ("off", "ngram"):
        return spec, 0
    name, _, layers = spec.partition(":")
    if name == "early-exit" and layers.isdigit() and 0 < int(layers) < n_layers:
        return name, int(layers)
    raise ValueError(f"speculation {spec!r}: use off, ngram or early-exit:L with 0 < L < {n_layers}")


def load_engine(
    model_path,
    device: str = "auto",
    speculation: str = "ngram",
    cuda_graphs: bool = True,
    compile: bool = False,
    kernels: str = "auto",
) -> LocalEngine:
    """Load a GGUF file or Hugging Face directory: bf16 with CUDA graphs on a GPU; on the CPU the
    native step on a GGUF's own blocks, or f32 activations with torch's bf16 and int4 matmuls.

    kernels: what the step runs: "torch" (model.py), "triton" (triton_step.py, GPU), "native"
    (cpu_step.cpp, CPU) or "auto" (pick_kernels)."""
    from lingcode.engine.local.weights import load_checkpoint

    dev = pick_device(device)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    if dev.type != "cpu":
        return LocalEngine(load_checkpoint(model_path), dev, dtype, speculation, cuda_graphs, compile, kernels=kernels)
    from lingcode.engine.local import cpu_native, prepared

    if kernels == "auto" and compile:
        kernels = "torch"

    def build():
        checkpoint = load_checkpoint(model_path)
        chosen = pick_kernels(kernels, dev, cuda_graphs, compile, checkpoint)
        model = build_model(checkpoint, dtype, dev, chosen)
        return dataclasses.replace(checkpoint, weights={}, q4={}), model, chosen  # the model holds the tensors

    # The native code is loaded in this process before the key is made: the prepared model depends on it.
    (checkpoint, model, chosen), name = prepared.load_or_build(
        Path(model_path), f"cpu-float32-{kernels}", build, extra=f"cpu_native={cpu_native.load() is not None}"
    )
    what = f"step_costs threads={torch.get_num_threads()}"
    step_cost = prepared.recall(name, what)
    engine = LocalEngine(
        checkpoint, dev, dtype, speculation, cuda_graphs, compile, kernels=chosen, model=model, step_cost=step_cost
    )
    if step_cost is None and not compile:
        prepared.remember(name, what, engine.step_costs)
    return engine
