"""One engine of `lingcode bench` in a process of its own, fed requests as token ids over a pipe.

decode.py starts one worker per engine (lingcode's, with all its speculation modes, and each peer),
because a peer sharing lingcode's process is not measured alone (bench/README.md says why). Every
worker times its tokens with the same Clock.

Protocol, one JSON object a line. The worker writes {"ready": {...}} once loaded, then answers
{"request": {"input_ids", "max_tokens", "stop_ids", "speculation"}} with {"result": {"ttft_ms",
"tpot_ms", "tokens", "token_ids", "accept_length", "served"}}, and {"plan": {...}} (lingcode only)
with {"requests": [...]}, the workload's prompts as token ids; {"logits": {"input_ids", "path"}}
(llama.cpp with --logits-all) with {"logits": {"path", "positions"}}, every position's logits saved
as .npy at path; a failure with {"error": "..."}.
End of input ends it.

Only the standard library is imported at the top, so another interpreter can run this file by its
path (llama-cpp-python lives in a venv of its own):
    python -m lingcode.bench.worker lingcode|transformers-eager|transformers-static --model M --threads N
    PEER_PYTHON -I path/to/lingcode/bench/worker.py llama.cpp --model M.gguf --threads N
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

KINDS = ("lingcode", "transformers-eager", "transformers-static", "llama.cpp")


class Clock:
    """TTFT (request start -> first token) and TPOT ((last - first token) / (tokens - 1)), the same
    for every engine: start it right before the engine is asked, call got() as tokens arrive."""

    def __init__(self):
        self.start = time.perf_counter()
        self.first = self.last = None
        self.token_ids: list[int] = []

    def got(self, ids) -> None:
        now = time.perf_counter()
        if ids:
            self.first = self.first or now
            self.last = now
            self.token_ids.extend(int(i) for i in ids)

    def result(self, accept_length: float | None = None) -> dict:
        n = len(self.token_ids)
        return {
            "ttft_ms": round((self.first - self.start) * 1e3, 3) if self.first else None,
            "tpot_ms": round((self.last - self.first) * 1e3 / (n - 1), 4) if n > 1 else None,
            "tokens": n,
            "token_ids": self.token_ids,
            "accept_length": accept_length,
        }


# --- engines --------------------------------------------------------------------------------------


class LingcodeRunner:
    """lingcode's engine through its Engine interface. The embedded engine runs each request in the
    speculation mode it names, from a cold KV cache; an SGLang engine runs as its profile configured it."""

    def __init__(self, args):
        import torch

        self.local = args.engine == "local"
        started = time.perf_counter()
        if self.local:
            from lingcode.engine.local import load_engine

            self.engine = load_engine(args.model, device=args.device, compile=args.compile, kernels=args.kernels)
        else:
            from lingcode.engine.sglang.engine import open_engine

            self.engine = open_engine(
                args.model,
                engine_url=args.engine_url,
                profile=args.profile,
                say=lambda line: print(line, file=sys.stderr),
            )
        extra = self.engine.info.extra
        self.ready = {
            "load_s": round(time.perf_counter() - started, 2),
            "name": self.engine.info.name,
            "versions": {"torch": torch.__version__},
            "engine": extra,
            "eos_token_ids": list(self.engine.info.eos_token_ids),
        }
        runner = getattr(self.engine.step, "runner", None)  # captured CUDA graphs (steps.GraphStep)
        if runner is not None:
            self.ready["cuda_graph_capture_s"] = round(runner.capture_s, 2)

    def plan(self, spec: dict) -> list[dict]:
        from lingcode.bench.decode import workload_requests

        info = self.engine.info
        return [
            {
                "workload": name,
                "input_ids": r.input_ids,
                "max_tokens": r.max_tokens,
                "stop_ids": [] if r.ignore_eos else list(info.eos_token_ids),
            }
            for name in spec["workloads"]
            for r in workload_requests(name, info.tokenizer, info.chat_template, spec["requests"], spec["max_tokens"])
        ]

    def run(self, request: dict) -> dict:
        import asyncio

        from lingcode.engine import SamplingParams

        speculation = request.get("speculation")
        if self.local:
            self.engine.set_speculation(speculation or "off")
            self.engine.reset_cache()
        stop_ids = request["stop_ids"]
        # The model's eos ids end a generation unless ignore_eos; the request's own list says which.
        params = SamplingParams(
            max_tokens=request["max_tokens"], temperature=0.0, ignore_eos=not stop_ids, stop_token_ids=tuple(stop_ids)
        )

        async def go() -> Clock:
            clock = Clock()
            async for chunk in self.engine.generate(f"bench-{time.monotonic_ns()}", request["input_ids"], params):
                clock.got(chunk.token_ids)
            return clock

        clock = asyncio.run(go())
        accept = self.engine.stats().get("last_request", {}).get("accept_length") if speculation != "off" else None
        return clock.result(accept)


class TransformersRunner:
    """transformers' LlamaForCausalLM on the same weights (lingcode's GGUF reader, dequantized),
    `generate` greedy, eager or with its static cache; tokens timed through a streamer."""

    def __init__(self, args):
        import torch
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM

        from lingcode.engine.local.weights import load_checkpoint

        started = time.perf_counter()
        checkpoint = load_checkpoint(args.model)
        cfg = checkpoint.config
        config = LlamaConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.dim,
            intermediate_size=cfg.ffn_dim,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads,
            num_key_value_heads=cfg.n_kv_heads,
            max_position_embeddings=cfg.context_length,
            rope_theta=cfg.rope_theta,
            rms_norm_eps=cfg.norm_eps,
            tie_word_embeddings=cfg.tied_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},  # transformers >= 5
        )
        names = {
            "attn_norm": "input_layernorm",
            "wq": "self_attn.q_proj",
            "wk": "self_attn.k_proj",
            "wv": "self_attn.v_proj",
            "wo": "self_attn.o_proj",
            "ffn_norm": "post_attention_layernorm",
            "w_gate": "mlp.gate_proj",
            "w_up": "mlp.up_proj",
            "w_down": "mlp.down_proj",
        }
        state = {
            "model.embed_tokens.weight": checkpoint.weights["tok_embeddings"],
            "model.norm.weight": checkpoint.weights["norm"],
        }
        if "output" in checkpoint.weights:
            state["lm_head.weight"] = checkpoint.weights["output"]
        for key, tensor in checkpoint.weights.items():
            if key.startswith("layers."):
                _, i, short = key.split(".")
                state[f"model.layers.{i}.{names[short]}.weight"] = tensor
        self.device = torch.device(args.device)
        model = LlamaForCausalLM(config)
        model.load_state_dict(state, strict=False)
        model.tie_weights()
        self.model = model.to(device=self.device, dtype=getattr(torch, args.dtype)).eval()
        self.cache = args.kind.split("-")[1]
        self.ready = {
            "load_s": round(time.perf_counter() - started, 2),
            "name": checkpoint.name,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "engine": {"device": args.device, "dtype": args.dtype, "cache": self.cache},
        }

    def _generate(self, ids, request: dict, clock: Clock | None) -> None:
        from transformers.generation.streamers import BaseStreamer

        class Stream(BaseStreamer):
            prompt_seen = False

            def put(self, value):  # the prompt first, then each new token
                if self.prompt_seen and clock is not None:
                    clock.got(value.reshape(-1).tolist())
                self.prompt_seen = True

            def end(self):
                pass

        n, stop_ids = request["max_tokens"], request["stop_ids"]
        kwargs = {"cache_implementation": "static"} if self.cache == "static" else {}
        kwargs |= {"eos_token_id": stop_ids} if stop_ids else {"min_new_tokens": n}
        self.model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, streamer=Stream(), **kwargs)

    def run(self, request: dict) -> dict:
        import torch

        ids = torch.tensor([request["input_ids"]], device=self.device)
        with torch.inference_mode():
            if self.cache == "static":  # untimed: transformers compiles static-cache decoding for each
                self._generate(ids, request, None)  # new prompt or cache length (~180 ms in a timed call)
            clock = Clock()
            self._generate(ids, request, clock)
        return clock.result()


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python on the same GGUF, greedy, from a cold cache per request."""

    def __init__(self, args):
        import llama_cpp

        started = time.perf_counter()
        self.llm = llama_cpp.Llama(
            model_path=args.model,
            n_ctx=args.context,
            n_batch=512,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            flash_attn=args.flash_attn,
            logits_all=args.logits_all,
            verbose=False,
        )
        self.ready = {
            "load_s": round(time.perf_counter() - started, 2),
            "name": os.path.basename(args.model),
            "versions": {"llama_cpp_python": llama_cpp.__version__},
            "engine": {
                "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                "python": sys.executable,
                "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
                "n_ctx": args.context,
                "flash_attn": args.flash_attn,
            },
        }

    def logits(self, request: dict) -> dict:
        """The logits of every position of input_ids (teacher-forced), saved as .npy at `path`."""
        import numpy as np

        ids = request["input_ids"]
        self.llm.reset()
        self.llm.eval(ids)
        np.save(request["path"], np.asarray(self.llm.scores[: len(ids)], dtype=np.float32))
        return {"path": request["path"], "positions": len(ids)}

    def run(self, request: dict) -> dict:
        self.llm.reset()
        stop_ids = set(request["stop_ids"])
        clock = Clock()
        for token in self.llm.generate(request["input_ids"], temp=0.0, top_k=1, reset=True):
            clock.got([token])
            if token in stop_ids or len(clock.token_ids) >= request["max_tokens"]:
                break
        return clock.result()


# --- the loop -------------------------------------------------------------------------------------


def serve(runner, replies) -> None:
    """Answer request lines from stdin on `replies` until stdin closes."""
    served = 0

    def say(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    say({"ready": {**runner.ready, "pid": os.getpid()}})
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        try:
            if "plan" in message:
                say({"requests": runner.plan(message["plan"])})
            elif "logits" in message:
                say({"logits": runner.logits(message["logits"])})
            else:
                result = runner.run(message["request"])
                served += 1
                say({"result": {**result, "served": served}})
        except Exception as e:  # the parent reports it and stops the run
            say({"error": f"{type(e).__name__}: {e}"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--model", help="GGUF file or model directory (lingcode: also a catalog name)")
    parser.add_argument("--threads", type=int, required=True, help="CPU threads for the engine")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="transformers: the weights' dtype")
    parser.add_argument("--engine", choices=["local", "sglang"], default="local")
    parser.add_argument("--profile")
    parser.add_argument("--engine-url")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--kernels", default="auto")
    parser.add_argument("--context", type=int, default=4096, help="llama.cpp: its context (KV cache) length")
    parser.add_argument("--flash-attn", action="store_true", help="llama.cpp: its flash attention")
    parser.add_argument("--logits-all", action="store_true", help="llama.cpp: keep every position's logits")
    args = parser.parse_args(argv)
    # Everything the engines print goes to stderr; stdout carries the protocol only.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if args.kind != "llama.cpp":
        import torch

        torch.set_num_threads(args.threads)
    runner = {
        "lingcode": LingcodeRunner,
        "transformers-eager": TransformersRunner,
        "transformers-static": TransformersRunner,
        "llama.cpp": LlamaCppRunner,
    }[args.kind](args)
    runner.ready["threads"] = args.threads if args.kind == "llama.cpp" else torch.get_num_threads()
    serve(runner, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
