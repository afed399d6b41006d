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
import os
import threading
import time
import dataclasses
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from dataclasses import dataclass, field
from typing import AsyncIterator

import torch

from lingcode.engine import ChunkChannel, ContextOverflow, EngineError, ModelInfo, SamplingParams, TokenChunk
from lingcode.engine.local.cuda_graphs import GraphRunner
from lingcode.engine.local.kv_store import MIN_SAVE_TOKENS, PrefixStore, common_prefix
from lingcode.engine.local.model import Transformer, row_exact_kv_len
from lingcode.engine.local.sampling import sample
from lingcode.engine.local.speculative import (
    DraftLength, Drafter, EarlyExitDrafter, NGramDrafter, verify_greedy, verify_sampled,
)  # fmt: skip
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


class LocalEngine:
    def __init__(
        self, checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, speculation: str = "ngram",
        cuda_graphs: bool = True, compile: bool = False, kv_store_bytes: int = KV_STORE_BYTES, kernels: str = "auto",
        model: Transformer | None = None, step_cost: list[float] | None = None,
    ):  # fmt: skip
        """model: one build_model() made from this checkpoint already (a prepared one, mapped from the
        cache); step_cost: what _measure_step_costs() measured for it before."""
        cfg = checkpoint.config
        kernels = pick_kernels(kernels, device, cuda_graphs, compile)
        self.speculation, self.draft_layers = parse_speculation(speculation, cfg.n_layers)
        self.device, self.dtype = device, dtype
        self.model = model if model is not None else build_model(checkpoint, dtype, device)
        self.model.setup_cache(cfg.context_length)
        self.graphs = None
        if device.type == "cuda" and cuda_graphs:
            self.graphs = GraphRunner(self.model, compile=compile, kernels=kernels)
        elif kernels != "torch":  # the Triton step runs only as captured graphs
            raise ValueError(f"--kernels {kernels} needs CUDA graphs on a GPU (this engine: {device}, no graphs)")
        self.narrow_step = None  # CPU --compile: decode and verify steps through torch.compile
        if device.type == "cpu" and compile:
            self.narrow_step = compile_narrow_step(self.model)
        # ms of a step verifying k drafts, k = 0, 1, ...
        self.step_cost = step_cost if step_cost is not None and self.narrow_step is None else self._measure_step_costs()
        self.draft_length = DraftLength(self.step_cost)
        self.info = ModelInfo(
            name=checkpoint.name,
            context_length=cfg.context_length,
            eos_token_ids=checkpoint.eos_token_ids,
            tokenizer=checkpoint.tokenizer,
            chat_template=checkpoint.chat_template,
            bos_token=checkpoint.bos_token,
            eos_token=checkpoint.eos_token,
            extra={"engine": "local", "device": str(device), "dtype": str(dtype).removeprefix("torch."),
                   "kv_cache_dtype": str(self.model.layers[0].attn.kv_cache.k.dtype).removeprefix("torch."),
                   "speculation": speculation, "kernels": kernels},  # fmt: skip
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingcode-engine")
        self._requests: dict[str, _Request] = {}
        self._cached_ids: list[int] = []  # tokens whose keys/values are in the cache, in order
        self.kv_store = PrefixStore(kv_store_bytes)
        self._counters = dict.fromkeys(
            ("requests", "finished", "aborted", "errors", "prompt_tokens", "cached_tokens",
             "prefilled_tokens", "generated_tokens", "forward_passes", "decode_steps", "draft_tokens",
             "accepted_draft_tokens", "host_waits"), 0
        )  # fmt: skip
        self._last: dict = {}
        self._running: str | None = None
        self._ngram = NGramDrafter()  # used by one request at a time: the worker thread's

    def set_speculation(self, speculation: str) -> None:
        """Switch drafting for the requests that start from now on ("off", "ngram", "early-exit:L")."""
        self.speculation, self.draft_layers = parse_speculation(speculation, self.model.cfg.n_layers)
        self.draft_length = DraftLength(self.step_cost)
        self.info.extra["speculation"] = speculation

    def reset_cache(self) -> None:
        """Forget the cached prefix (benchmarks: every variant starts from a cold cache)."""
        self._cached_ids.clear()

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
        chunks = ChunkChannel(asyncio.get_running_loop())
        req = _Request(request_id, list(input_ids), params, chunks.put)
        self._requests[request_id] = req
        done = asyncio.wrap_future(self._worker.submit(self._run, req))
        try:
            while True:
                chunk = await chunks.get()
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

    def _forward(self, ids: list[int], start: int, all_logits: bool = False) -> torch.Tensor:
        """Feed ids at positions start..; logits of the last position [V] (or of every one [T, V])."""
        del self._cached_ids[start:]
        width = self.graphs.width_for(len(ids)) if self.graphs is not None else None
        if width is not None and start + width <= self.model.max_len:
            # Pad to a captured width; padded positions write cache entries no one reads as valid.
            padded = ids + ids[-1:] * (width - len(ids))
            staging = self.graphs.staging  # pinned; free to reuse: every host-loop step ends in a read
            staging[:width] = torch.tensor(padded)
            self.graphs.tokens[0, :width].copy_(staging[:width], non_blocking=True)
            torch.arange(start, start + width, out=self.graphs.positions[:width])
            logits = self.graphs.replay(width, start + width)[: len(ids)]
        else:
            tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
            narrow = self.narrow_step is not None and len(ids) <= self.model.row_exact_rows
            logits = (self.narrow_step if narrow else self.model)(tokens, start, all_logits=all_logits)[0]  # [T, V] or [1, V]
        self._cached_ids.extend(ids)
        self._counters["forward_passes"] += 1
        return logits if all_logits else logits[-1]

    def _verify(self, fed: list[int], pos: int, draft: list[int], draft_probs, params, generator) -> list[int]:
        """One step feeding `fed` (tokens the cache lacks, the last one's next token pending) and the
        draft after them, from pos: the tokens to emit, accepted drafts and the target's own next."""
        logits = self._forward([*fed, *draft], pos, all_logits=True)[len(fed) - 1 :]
        if params.greedy:
            new = verify_greedy(logits, draft)
        else:
            new = verify_sampled(logits, draft, draft_probs, params, generator)
        del self._cached_ids[pos + len(fed) + len(new) - 1 :]  # keys/values of rejected drafts are stale
        return new

    def _draft_room(self, pos: int, fed: int) -> int:
        """How many drafts a step feeding `fed` tokens from pos may verify (0 or more): within the
        captured widths (GPU) or the row-exact rows (CPU), and within the cache bucket of its fed
        tokens, where each row sums as plain decoding sums it (the Triton step and the CPU's
        row-exact attention split a row's attention by the bucket; cpu_attention does not, so with
        the CPU's f16 cache the room is the rows')."""
        if self.graphs is not None:
            room = min(self.graphs.widths[-1], self.graphs.bucket_for(pos + fed) - pos) - fed
        elif self.model.row_exact_rows:
            end = self.model.max_len if self.model.kv_dtype else row_exact_kv_len(pos + fed, self.model.max_len)
            room = min(self.model.row_exact_rows, end - pos) - fed
        else:
            room = self.draft_length.k_max
        return max(0, room)

    def _measure_step_costs(self, rounds: int = 4) -> list[float]:
        """ms of a step verifying k = 0, 1, ... drafts (k + 1 tokens) on this engine, timed at load
        on a short context, for DraftLength: what a longer draft costs is what it must earn. Rounds
        go through every width in turn and each width keeps its fastest time, so that other work on
        the machine during the load slows all widths alike instead of skewing their ratios."""
        model, graphs = self.model, self.graphs
        widths = graphs.widths if graphs is not None else range(1, (model.row_exact_rows or 8) + 1)
        step = self.narrow_step or model
        ms = dict.fromkeys(widths, float("inf"))
        with torch.inference_mode():
            for round_ in range(rounds + 1):  # round 0 is a warm-up
                for width in widths:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()
                    started = time.perf_counter()
                    if graphs is not None:
                        graphs.tokens[0, :width].zero_()
                        torch.arange(width, out=graphs.positions[:width])
                        graphs.replay(width, width)
                    else:
                        step(torch.zeros(1, width, dtype=torch.long, device=self.device), 0, all_logits=width > 1)
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()
                    if round_:
                        ms[width] = min(ms[width], (time.perf_counter() - started) * 1e3)
        if graphs is not None:  # a draft is padded up to the next captured width
            costs = [ms[graphs.width_for(k + 1)] for k in range(graphs.widths[-1])]
        else:
            costs = [ms[width] for width in widths]
        return list(itertools.accumulate(costs, max))  # a wider step costs no less (timing noise aside)

    def _choose(self, logits: torch.Tensor, params: SamplingParams, generator) -> int:
        if params.constraint is not None:
            params.constraint.mask_logits(logits)
        token = int(sample(logits, params, generator))  # one host read per step
        if params.constraint is not None:
            params.constraint.accept(token)
        return token

    def _drafter(self, params: SamplingParams) -> Drafter | None:
        if self.speculation == "off" or params.constraint is not None:
            return None  # a grammar would have to roll drafts back too: one token per step instead
        if self.speculation == "ngram":  # one for every request: it keeps the index of a shared prefix
            self._ngram.copy_recent = params.greedy  # a seeded sample must not depend on earlier requests
            return self._ngram
        return EarlyExitDrafter(self.model, self.draft_layers, self.device)

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

        drafter = self._drafter(params)
        if drafter is not None:
            drafter.start(ids)
        chunks = self._prefill_steps(cached, len(ids))
        # The prompt's last chunk (often one typed character: prefix reuse) goes with a draft of what
        # follows it, verified in the same step: a step sooner to the first tokens. Only where the
        # drafter needs nothing of that chunk in the cache (n-grams; a one-token chunk).
        last = chunks.pop() if drafter is not None and (
            isinstance(drafter, NGramDrafter) or chunks[-1][1] - chunks[-1][0] == 1) else None  # fmt: skip
        t0 = time.perf_counter()
        logits = None
        for start, end in chunks:
            if req.aborted.is_set():  # between chunks, so an abort lands mid-prefill
                break
            logits = self._forward(ids[start:end], start)
        prefill_ms = (time.perf_counter() - t0) * 1e3

        generated: list[int] = []
        steps = drafted = accepted = 0
        from_prefill = 1  # the first token came from the prefill's logits, not from a counted step
        finish = "abort" if req.aborted.is_set() else None
        if finish is None and self.graphs is not None and drafter is None and params.constraint is None:
            finish, steps = self._pipelined_loop(req, logits, generated, stop_ids, max_new, generator, cached)
        new = []
        if finish is None and last is not None:
            start, end = last
            draft, draft_probs = drafter.propose(self.draft_length.k)
            draft = draft[: min(self._draft_room(start, end - start), max_new - 1)]
            if draft:
                new = self._verify(ids[start:end], start, draft, draft_probs, params, generator)
                drafted, accepted, steps, from_prefill = len(draft), len(new) - 1, 1, 0
                self.draft_length.update(len(draft), len(new) - 1)
            else:
                logits = self._forward(ids[start:end], start)
        if finish is None and not new:
            new = [self._choose(logits, params, generator)]
        while finish is None:
            new, finish = self._take(new, generated, stop_ids, max_new, params)
            accept_length = (len(generated) - from_prefill) / steps if drafter is not None and steps else None
            req.emit(TokenChunk(new, finish, len(ids), cached, accept_length if finish else None))
            if finish is not None:
                break
            if req.aborted.is_set():
                finish = "abort"
                break
            pos = len(ids) + len(generated) - 1  # the pending token: emitted, not fed yet
            draft, draft_probs = [], None
            if drafter is not None:
                drafter.extend(new)
                draft, draft_probs = drafter.propose(self.draft_length.k)
                draft = draft[: self._draft_room(pos, 1)]
            draft = draft[: max_new - len(generated)]
            if draft:
                new = self._verify([generated[-1]], pos, draft, draft_probs, params, generator)
                drafted += len(draft)
                accepted += len(new) - 1
                self.draft_length.update(len(draft), len(new) - 1)
            else:
                if drafter is not None:
                    self.draft_length.update(0, 0)
                new = [self._choose(self._forward([generated[-1]], pos), params, generator)]
            steps += 1
            if req.aborted.is_set():
                req.steps_after_abort += 1
        if finish == "abort":
            req.emit(TokenChunk([], "abort", len(ids), cached))
            counters["aborted"] += 1
        else:
            counters["finished"] += 1
        counters["generated_tokens"] += len(generated)
        counters["decode_steps"] += steps
        counters["draft_tokens"] += drafted
        counters["accepted_draft_tokens"] += accepted
        self._last = {
            "request_id": req.request_id, "prompt_tokens": len(ids), "cached_tokens": cached,
            "prefilled_tokens": len(ids) - cached, "generated_tokens": len(generated), "finish_reason": finish,
            "steps_after_abort": req.steps_after_abort, "prefill_ms": round(prefill_ms, 3),
            "decode_ms": round((time.perf_counter() - t0) * 1e3 - prefill_ms, 3), "decode_steps": steps,
            "draft_tokens": drafted, "accepted_draft_tokens": accepted,
            "accept_length": round((len(generated) - 1) / steps, 3) if steps else None,
        }  # fmt: skip

    def _prefill_steps(self, start: int, end: int) -> list[tuple[int, int]]:
        """Chunks of at most PREFILL_CHUNK tokens. On the CPU the prompt's last token must come from
        a row-exact step (model.py), as every decoded token does, or the first token would depend on
        how much of the prompt was cached: a tail too wide for one is cut off the last chunk."""
        rows = self.model.row_exact_rows
        if rows and (end - start > rows or row_exact_kv_len(start + 1, self.model.max_len) < end):
            steps = [(s, min(s + PREFILL_CHUNK, end - 1)) for s in range(start, end - 1, PREFILL_CHUNK)]
            return steps + [(end - 1, end)]
        return [(s, min(s + PREFILL_CHUNK, end)) for s in range(start, end, PREFILL_CHUNK)]

    def _pipelined_loop(self, req, logits, generated, stop_ids, max_new, generator, cached) -> tuple[str, int]:
        """Plain decoding on the GPU with no host wait on the critical path.

        The sampled token stays on the device and feeds the next step directly; step k+1 is
        enqueued before the host reads step k's token, which comes back through one non-blocking
        copy into pinned memory. The host's Python (stop checks, streaming) then overlaps the GPU's
        work instead of idling it. A token read after a stop costs one wasted step, never a wrong one.
        """
        params, n_prompt = req.params, len(req.input_ids)
        runner = self.graphs
        host, ready = runner.readback, runner.ready  # allocated once: pinned allocations are slow
        token = sample(logits, params, generator).view(1)
        host[0:1].copy_(token, non_blocking=True)
        ready[0].record()
        if params.greedy:  # the token and its position stay in the runner's buffers (replay_greedy)
            runner.tokens[0, :1].copy_(token)
            runner.positions[:1].fill_(n_prompt)
        finish, step, replays, pos = None, 0, 0, n_prompt  # pos: where the token being read will sit
        while finish is None:
            fed = len(generated) + 1 < max_new
            if fed:  # enqueue the next step before reading this one's token
                if params.greedy:
                    runner.replay_greedy(pos + 1)
                    token = runner.tokens[0, :1]
                else:
                    runner.tokens[0, :1].copy_(token)
                    runner.positions[:1].fill_(pos)
                    token = sample(runner.replay(1, pos + 1)[0], params, generator).view(1)
                slot = (step + 1) % 2
                host[slot : slot + 1].copy_(token, non_blocking=True)
                ready[slot].record()
                replays += 1
            ready[step % 2].synchronize()  # waits for step k only: step k+1 is already queued behind it
            self._counters["host_waits"] += 1
            value = int(host[step % 2])
            if fed:
                self._cached_ids.append(value)
                self._counters["forward_passes"] += 1
            new, finish = self._take([value], generated, stop_ids, max_new, params)
            req.emit(TokenChunk(new, finish, n_prompt, cached))
            if finish is None and req.aborted.is_set():
                finish = "abort"
                req.steps_after_abort = int(fed)  # at most the one step already queued
            step += 1
            pos += 1
        return finish, replays

    @staticmethod
    def _take(new, generated, stop_ids, max_new, params) -> tuple[list[int], str | None]:
        """Append the step's tokens up to the first stop token or the length limit."""
        for i, token in enumerate(new):
            generated.append(token)
            if token in stop_ids or token in params.final_token_ids or (
                params.constraint is not None and params.constraint.is_terminated()
            ):
                return new[: i + 1], "stop"
            if len(generated) >= max_new:
                return new[: i + 1], "length"
        return new, None

    def _reuse_prefix(self, ids: list[int]) -> int:
        """How many leading tokens of ids the cache holds: the live cache's, or a saved prefix's."""
        live = common_prefix(self._cached_ids, ids)
        caches = [layer.attn.kv_cache for layer in self.model.layers]
        saved, shared = self.kv_store.best_match(ids)
        # A saved entry is restored (and so kept from eviction) only if it saves real prefill: one
        # that shares a few more tokens than the live cache (prompts that open alike, e.g. a first
        # line with a timestamp) would otherwise stop the live cache, maybe a long conversation,
        # from being saved.
        restore = saved if shared >= live + MIN_SAVE_TOKENS else None
        # Either way (restored prefix or this request's own tokens) the cache keeps only its first
        # `live` positions: save it first if that loses most of it, never evicting what we restore.
        if self.kv_store.should_save(len(self._cached_ids), live):
            self.kv_store.save(self._cached_ids, caches, keep=restore)
        if restore is not None:
            self.kv_store.restore(saved, shared, caches)
            self._cached_ids = list(saved[:shared])
            return shared
        return live


def build_model(checkpoint: Checkpoint, dtype: torch.dtype, device: torch.device) -> Transformer:
    """The checkpoint's weights as the engine runs them on this device (no KV cache yet)."""
    model = Transformer.from_weights(checkpoint.config, checkpoint.weights, dtype, device)
    if device.type == "cpu":  # bf16 matmuls, the file's 4-bit weights for decoding (quantized.py)
        model.use_cpu_matmuls(checkpoint.q4)
    return model


def compile_narrow_step(model: Transformer):
    """torch.compile the CPU's decode/verify forward (up to row_exact_rows tokens): Inductor fuses
    the small elementwise ops between the matmuls, which at batch 1 cost as much as the matmuls.
    Measured on 2 cores, context 800 (bench/cpu_variants.py --compile): 15 ms a step vs 24 ms
    eager; compiling took 123 s (less from Inductor's on-disk cache). dynamic=True: one graph for every width and
    position. Warmed up here, at load, on positions the first request overwrites (not 0 or 1:
    Dynamo specializes those values, and a real step would compile again)."""
    # Inductor warns when a fused kernel mixes the f16 cache's writes with the bf16 inputs of the
    # int4 matmuls; it then computes that kernel in f32, which is what the step means anyway.
    warnings.filterwarnings("ignore", message="bf16 and fp16 are mixed in the scheduler node")
    step = torch.compile(model.forward, dynamic=True)
    with torch.inference_mode():
        for width in (1, 2, 3):
            for all_logits in (False, True):
                step(torch.zeros(1, width, dtype=torch.long), 300 + width, all_logits=all_logits)
    return step


def pick_kernels(kernels: str, device: torch.device, cuda_graphs: bool, compile: bool) -> str:
    """"auto": the Triton step where it can run (captured graphs on a GPU, Triton importable, no
    torch.compile, which is for the torch kernels), else torch. On the H200 it decodes 4x faster
    than the torch step (bench/results/h200-2026-11-30-summary.md)."""
    if kernels != "auto":
        return kernels
    if device.type != "cuda" or not cuda_graphs or compile:
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
    """"off", "ngram" (prompt lookup) or "early-exit:L" (the target's first L layers as the draft model)."""
    if spec in ("off", "ngram"):
        return spec, 0
    name, _, layers = spec.partition(":")
    if name == "early-exit" and layers.isdigit() and 0 < int(layers) < n_layers:
        return name, int(layers)
    raise ValueError(f"speculation {spec!r}: use off, ngram or early-exit:L with 0 < L < {n_layers}")


def load_engine(
    model_path, device: str = "auto", speculation: str = "ngram", cuda_graphs: bool = True,
    compile: bool = False, kernels: str = "auto",
) -> LocalEngine:
    """Load a GGUF file or Hugging Face directory: bf16 with CUDA graphs on a GPU; on the CPU f32
    activations with bf16 matmuls, and a quantized GGUF's own 4-bit weights for decoding.

    kernels: what the captured GPU step runs, "torch" (model.py), "triton" (triton_step.py) or
    "auto" (pick_kernels)."""
    from lingcode.engine.local.weights import load_checkpoint

    dev = pick_device(device)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    if dev.type != "cpu":
        return LocalEngine(load_checkpoint(model_path), dev, dtype, speculation, cuda_graphs, compile, kernels=kernels)
    from lingcode.engine.local import cpu_attention, prepared

    def build():
        checkpoint = load_checkpoint(model_path)
        model = build_model(checkpoint, dtype, dev)
        return dataclasses.replace(checkpoint, weights={}, q4={}), model  # the model holds the tensors

    # The kernel is loaded in this process before the key is made: the prepared model's cache type depends on it.
    (checkpoint, model), name = prepared.load_or_build(Path(model_path), "cpu-float32", build,
                                                       extra=f"cpu_attention={cpu_attention.load()}")  # fmt: skip
    what = f"step_cost_ms threads={torch.get_num_threads()}"
    step_cost = prepared.recall(name, what)
    engine = LocalEngine(checkpoint, dev, dtype, speculation, cuda_graphs, compile, kernels=kernels, model=model,
                         step_cost=step_cost)  # fmt: skip
    if step_cost is None and engine.narrow_step is None:
        prepared.remember(name, what, engine.step_cost)
    return engine
