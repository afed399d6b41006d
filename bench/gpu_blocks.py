"""The Triton step on a GGUF's blocks (gpu_blocks.py) on a GPU: lossless verify steps, and the decode
step's speed next to the dense-bf16 torch step, on synthetic models of Qwen2.5-Coder's exact shapes
and block formats (random blocks: the real files are too large to carry to a lent GPU).

    PYTHONPATH=. python3 bench/gpu_blocks.py OUTDIR        (a GPU; about 3 minutes. A lent GPU machine
    lacks platformdirs: carry a copy of the package and add its folder to PYTHONPATH)
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/gpu_blocks.py /tmp/smoke   (CPU: tiny shapes, no
    graphs, no timing: checks the script itself)

0. Each block format's GEMV against its dequantized matrix (f32 inputs).
1. Lossless: 2-layer models of the 1.5B's and the 0.5B's dims and formats (bf16): greedy decoding
   with one-token steps, then verify steps of widths 2, 4 and 8 over the same tokens and positions,
   whose rows must be the one-token steps' logits bit for bit (so greedy drafts give plain
   decoding's tokens); the captured greedy loop (replay_greedy) must pick the same tokens; and how
   close the torch step's logits (dense bf16) come.
2. Speed: the captured decode step (width 1 at contexts 300 and 2000, width 4 at 300) of the 28-layer
   1.5B, the 24-layer 0.5B and the 30-layer SmolLM2-135M shapes: Triton on blocks, Triton on dense
   bf16 rows, torch on dense bf16 rows; ms per step and GB/s of weights read (the weights' bytes
   over the step's time); the 1.5B's kernels in a profile; then other block tables for the 1.5B.
Writes OUTDIR/results.json and prints Markdown tables as it goes.
"""

import dataclasses
import json
import os
import sys
import time

import torch

from lingcode.engine.local import gpu_blocks
from lingcode.engine.local.cuda_graphs import GraphRunner
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.triton_step import TritonStep, block_for, matmul_residual_kernel
from lingcode.engine.local.weights import ModelConfig

SMOKE = os.environ.get("TRITON_INTERPRET") == "1"  # the CPU check of this script
DEVICE = torch.device("cpu" if SMOKE else "cuda")
DTYPE = torch.bfloat16
STARTED = time.perf_counter()
BUDGET_S = float(os.environ.get("BUDGET_S", 450))  # block-table variants stop past this
# What to time (all by default): SHAPES and KERNELS, comma-separated names; VARIANTS, a JSON list of
# [matrix, [BLOCK_N, num_warps]] for the 1.5B's block tables ([] for none)
ONLY_SHAPES = os.environ.get("SHAPES")
ONLY_KERNELS = os.environ.get("KERNELS")
VARIANTS = json.loads(os.environ["VARIANTS"]) if os.environ.get("VARIANTS") else None
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpu_blocks"
RESULTS: dict = {}

# The files' formats (read from the real GGUFs): the 1.5B's V and down are Q6_K in these layers,
# the 0.5B's V Q8_0 and down Q6_K in these (llama.cpp's Q4_K_M mix).
Q6_LAYERS_1_5B = {0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27}
Q8_LAYERS_0_5B = {0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21}


def formats_1_5b(i, name):
    if i is None:
        return {"output": "Q6_K", "tok_embeddings": "Q4_K"}[name]
    return "Q6_K" if name in ("wv", "w_down") and i in Q6_LAYERS_1_5B else "Q4_K"


def formats_0_5b(i, name):
    if i is None:
        return {"output": "Q8_0", "tok_embeddings": "Q5_0"}[name]
    if name == "wv":
        return "Q8_0" if i in Q8_LAYERS_0_5B else "Q5_0"
    if name == "w_down":
        return "Q6_K" if i in Q8_LAYERS_0_5B else "Q4_K"
    return "Q5_0"


def formats_smollm2(i, name):
    return "Q8_0" if i is None else "Q4_1"


SHAPES = {
    "qwen2.5-coder-1.5b": (ModelConfig(n_layers=28, dim=1536, ffn_dim=8960, n_heads=12, n_kv_heads=2,
                                       vocab_size=151936, context_length=32768, rope_theta=1e6, norm_eps=1e-6,
                                       tied_embeddings=False, arch="qwen2"), formats_1_5b),
    "qwen2.5-coder-0.5b": (ModelConfig(n_layers=24, dim=896, ffn_dim=4864, n_heads=14, n_kv_heads=2,
                                       vocab_size=151936, context_length=32768, rope_theta=1e6, norm_eps=1e-6,
                                       tied_embeddings=False, arch="qwen2"), formats_0_5b),
    "smollm2-135m": (ModelConfig(n_layers=30, dim=576, ffn_dim=1536, n_heads=9, n_kv_heads=3, vocab_size=49152,
                                 context_length=8192, rope_theta=100000.0), formats_smollm2),
}  # fmt: skip
if SMOKE:  # shapes the interpreter runs in seconds, the same formats (K-quant rows: whole 256-blocks)
    SHAPES = {
        name: (
            dataclasses.replace(
                cfg,
                n_layers=2,
                dim=256,
                ffn_dim=768,
                n_heads=cfg.n_heads // cfg.n_kv_heads,
                n_kv_heads=1,
                head_dim=cfg.head_dim,
                vocab_size=512,
            ),
            formats,
        )
        for name, (cfg, formats) in SHAPES.items()
    }


def log(*parts) -> None:
    print(f"[{time.perf_counter() - STARTED:6.1f}s]", *parts, flush=True)


def save() -> None:
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def build(cfg: ModelConfig, formats, seed: int = 0):
    """Random blocks in the given formats, repacked on the device; the model's dense bf16 weights are
    their dequantized values (what model.py's path reads), so both steps run the same weights."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {
        "wq": (q, cfg.dim),
        "wk": (kv, cfg.dim),
        "wv": (kv, cfg.dim),
        "wo": (cfg.dim, q),
        "w_gate": (cfg.ffn_dim, cfg.dim),
        "w_up": (cfg.ffn_dim, cfg.dim),
        "w_down": (cfg.dim, cfg.ffn_dim),
    }
    packed, weights = {}, {}

    def make(key, layer, name, rows, cols):
        t = gpu_blocks.BY_NAME[formats(layer, name)].ggml_type
        m = gpu_blocks.repack(gpu_blocks.random_blocks(t, rows, cols, cols**-0.5, gen), rows, cols, t)
        weights[key] = gpu_blocks.dequantize(m).to(DTYPE)
        return m

    embeddings = make("tok_embeddings", None, "tok_embeddings", cfg.vocab_size, cfg.dim)
    packed["output"] = embeddings if cfg.tied_embeddings else make("output", None, "output", cfg.vocab_size, cfg.dim)
    vector = lambda n, around, spread: (around + spread * torch.randn(n, generator=gen, device=DEVICE)).to(DTYPE)  # noqa: E731
    weights["norm"] = vector(cfg.dim, 1.0, 0.1)
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        for name, (rows, cols) in shapes.items():
            packed[p + name] = make(p + name, i, name, rows, cols)
        weights[p + "attn_norm"], weights[p + "ffn_norm"] = vector(cfg.dim, 1.0, 0.1), vector(cfg.dim, 1.0, 0.1)
        if cfg.architecture.qkv_bias:  # Qwen2's biases are large: they matter
            weights[p + "bq"], weights[p + "bk"], weights[p + "bv"] = (
                vector(q, 0, 0.5),
                vector(kv, 0, 0.5),
                vector(kv, 0, 0.5),
            )
    model = Transformer.from_weights(cfg, weights, DTYPE, DEVICE)
    return model, packed


class EagerRunner:
    """GraphRunner's interface without graphs, for the CPU check of this script."""

    def __init__(self, model, kernels, options, widths, buckets):
        large = {m: (256, 4) for m in ("qkv", "wo", "gate_up", "down")} | {"lm_head": (512, 4)}  # few programs
        self.step = TritonStep(model, **{"blocks": large, **options}) if kernels == "triton" else model.forward_static
        self.widths = widths
        self.buckets = tuple(b for b in buckets if b < model.max_len) + (model.max_len,)
        self.tokens = torch.zeros(1, max(widths), dtype=torch.long)
        self.positions = torch.zeros(max(widths), dtype=torch.long)

    def replay(self, width, end):
        bucket = next(b for b in self.buckets if b >= end)
        return self.step(self.tokens[:, :width], self.positions[:width], bucket)[0]


def runner(model, kernels, weights=None, blocks=None, widths=(1, 4), buckets=(512,)):
    options = {k: v for k, v in (("weights", weights), ("blocks", blocks)) if v is not None}
    if SMOKE:
        return EagerRunner(model, kernels, options, widths, buckets)
    return GraphRunner(
        model, widths=widths, buckets=buckets, kernels=kernels, triton_options=options if kernels == "triton" else None
    )


def ms_per_step(r, width: int, end: int) -> float:
    if SMOKE:
        r.replay(width, end)
        return float("nan")
    from gpu_timing import ms_per_replay

    return ms_per_replay(r, width, end)


def feed(r, tokens: list[int], start: int) -> torch.Tensor:
    """Replay r's step for tokens at positions start..: their logits [len, V] (a copy)."""
    width = r.widths[[w >= len(tokens) for w in r.widths].index(True)]
    r.tokens[0, :width].copy_(torch.tensor(tokens + tokens[-1:] * (width - len(tokens))))
    torch.arange(start, start + width, out=r.positions[:width])
    return r.replay(width, start + width)[: len(tokens)].float().clone()


def check_formats() -> None:
    """Section 0: matmul_residual on each format, f32 inputs, against the dequantized matrix."""
    rows, width = 40, 3
    results = {}
    for name, fmt in sorted(gpu_blocks.BY_NAME.items()):
        cols = 768 if name.endswith("_K") else 352
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        m = gpu_blocks.repack(
            gpu_blocks.random_blocks(fmt.ggml_type, rows, cols, cols**-0.5, gen), rows, cols, fmt.ggml_type
        )
        a = torch.randn(width, cols, generator=gen, device=DEVICE)
        x = torch.randn(width, rows, generator=gen, device=DEVICE)
        out = x.clone()
        block_k = 1024 if cols == 768 else 512
        matmul_residual_kernel[(3, 2)](a, *m.args, out, width, 2, rows, cols, 16, block_k, m.spec, num_warps=4)
        expected = x.double() + a.double() @ gpu_blocks.dequantize(m).double().T
        results[name] = ((out.double() - expected).abs().max() / expected.abs().max()).item()
    RESULTS["formats_max_rel_diff"] = results
    log("GEMV per format, max |diff| / max |expected| (f32):", {k: f"{v:.2e}" for k, v in results.items()})
    assert all(v < 1e-5 for v in results.values()), results


def check_lossless(name: str) -> None:
    """Section 1 for one shape (2 layers)."""
    cfg, formats = SHAPES[name]
    cfg = dataclasses.replace(cfg, n_layers=2, vocab_size=min(cfg.vocab_size, 8192))
    model, packed = build(cfg, formats, seed=1)
    model.setup_cache(256 if SMOKE else 1024, transposed_keys=False)
    triton = runner(model, "triton", packed, widths=(1, 2, 4, 8), buckets=(256,))
    gen = torch.Generator().manual_seed(2)
    prompt_len, steps = 100, 16 if SMOKE else 64
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), generator=gen)
    with torch.inference_mode():
        token = int(model(prompt.to(DEVICE), 0)[0, -1].argmax())
        plain, logits = [token], []
        for k in range(steps):  # plain decoding, one token a step
            row = feed(triton, [plain[k]], prompt_len + k)[0]
            logits.append(row)
            plain.append(int(row.argmax()))
        mismatched, checked = [], 0
        for width in (2, 4, 8):  # drafts that are plain decoding's tokens, verified width at a time
            for k0 in range(0, steps - width + 1, width):
                rows = feed(triton, plain[k0 : k0 + width], prompt_len + k0)
                for r in range(width):
                    checked += 1
                    if not torch.equal(rows[r], logits[k0 + r]) or int(rows[r].argmax()) != plain[k0 + r + 1]:
                        mismatched.append((width, k0 + r))
        greedy_same = None
        if not SMOKE:  # the engine's captured greedy loop: step, argmax and next inputs in one replay
            triton.tokens[0, 0], triton.positions[0] = plain[0], prompt_len
            picked = []
            for k in range(steps):
                triton.replay_greedy(prompt_len + k + 1)
                picked.append(int(triton.tokens[0, 0]))
            greedy_same = picked == plain[1:]
        torch_step = runner(model, "torch", widths=(1,), buckets=(256,))
        ref = torch.stack([feed(torch_step, [plain[k]], prompt_len + k)[0] for k in range(steps)])
        ours = torch.stack(logits)
    result = {
        "rows_checked": checked,
        "rows_not_bit_exact": len(mismatched),
        "first_mismatches": mismatched[:5],
        "captured_greedy_same_tokens": greedy_same,
        "vs_torch_dense_max_logit_diff": (ours - ref).abs().max().item(),
        "vs_torch_dense_max_logit": ref.abs().max().item(),
        "vs_torch_dense_argmax_agreement": (ours.argmax(-1) == ref.argmax(-1)).float().mean().item(),
    }
    RESULTS.setdefault("lossless", {})[name] = result
    log(f"lossless {name}:", result)


def matrix_bytes(model: Transformer) -> int:
    """The dense step's weight bytes: every matrix it reads (the embedding lookup reads one row)."""
    total = model.output.weight.numel() * model.output.weight.element_size()
    for layer in model.layers:
        for m in (layer.attn.wqkv, layer.attn.wo, layer.ffn.w_gate_up, layer.ffn.w_down):
            total += m.weight.numel() * m.weight.element_size()
    return total


CASES = ((1, 300), (1, 2000), (4, 300))  # (width, context: the last position + 1)


def speed(name: str, kernel_sets=("triton-blocks", "triton-dense", "torch-dense")) -> tuple:
    """Section 2 for one shape: ms per step and GB/s of weights, each kernel set."""
    if ONLY_KERNELS:
        kernel_sets = tuple(k for k in kernel_sets if k in ONLY_KERNELS.split(","))
    cfg, formats = SHAPES[name]
    started = time.perf_counter()
    model, packed = build(cfg, formats)
    model.setup_cache(256 if SMOKE else 2048, transposed_keys=False)
    cases = ((1, 40), (4, 40)) if SMOKE else CASES
    with torch.inference_mode():
        context = torch.randint(
            0, cfg.vocab_size, (1, max(end for _, end in cases)), generator=torch.Generator().manual_seed(3)
        )
        for s in range(0, context.shape[1], 512):  # a real context for the attention to read
            model(context[:, s : s + 512].to(DEVICE), s)
    if not SMOKE:
        torch.cuda.synchronize()
    weight_bytes = {
        "triton-blocks": sum(m.nbytes for m in packed.values()),
        "triton-dense": matrix_bytes(model),
        "torch-dense": matrix_bytes(model),
    }
    log(
        f"{name}: built in {time.perf_counter() - started:.1f}s; weights {weight_bytes['triton-blocks'] / 1e6:.0f} MB "
        f"as blocks, {weight_bytes['torch-dense'] / 1e6:.0f} MB dense bf16"
    )
    runners = {}
    for kernels in kernel_sets:
        started = time.perf_counter()
        runners[kernels] = runner(model, kernels.split("-")[0], packed if kernels == "triton-blocks" else None)
        log(f"  {kernels}: captured in {time.perf_counter() - started:.1f}s")
    rows, logits = [], {}
    ids = context[0].tolist()
    with torch.inference_mode():
        for width, end in cases:
            for kernels, r in runners.items():
                logits[kernels, width, end] = feed(r, ids[end - width : end], end - width)
                ms = ms_per_step(r, width, end)
                gbs = weight_bytes[kernels] / (ms * 1e-3) / 1e9
                rows.append(
                    dict(kernels=kernels, width=width, context=end, ms=round(ms, 4), weights_gb_s=round(gbs, 1))
                )
                log(f"  {kernels:14s} width {width} context {end:5d}: {ms:.4f} ms, {gbs:.0f} GB/s of weights")
    agreement = {}
    for width, end in cases if "torch-dense" in kernel_sets else ():
        ref = logits["torch-dense", width, end]
        for kernels in kernel_sets:
            if kernels != "torch-dense":
                got = logits[kernels, width, end]
                agreement[f"{kernels} w{width} c{end}"] = dict(
                    max_diff=round((got - ref).abs().max().item(), 4),
                    max_logit=round(ref.abs().max().item(), 2),
                    argmax_same=bool((got.argmax(-1) == ref.argmax(-1)).all()),
                )
    RESULTS.setdefault("speed", {})[name] = dict(rows=rows, weight_bytes=weight_bytes, vs_torch=agreement)
    log(f"  vs torch-dense: {agreement}")
    save()
    return model, packed, runners


def profile(name: str, runners: dict) -> None:
    """Kernel times of one decode step (width 1, context 300), from 20 replays."""
    if SMOKE:
        return
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    table = {}
    for kernels, r in runners.items():
        with torch.inference_mode():
            feed(r, [1], 299)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    r.replay(1, 300)
                torch.cuda.synchronize()
        kernels_us = {}
        for e in prof.key_averages():
            us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if us:
                kernels_us[e.key[:60]] = (round(us / 20, 1), e.count // 20)
        top = dict(sorted(kernels_us.items(), key=lambda kv: -kv[1][0])[:12])
        table[kernels] = top
        log(f"  profile {kernels} (us per step, launches per step):", json.dumps(top, indent=None))
    RESULTS.setdefault("profile", {})[name] = table
    save()


def block_variants(name: str, model, packed) -> None:
    """Other block tables for the Triton step on blocks, one matrix changed at a time: width 1,
    context 300, while time is left."""
    cfg = model.cfg
    base = {
        m: block_for(m, k, True)
        for m, k in (
            ("qkv", cfg.dim),
            ("wo", cfg.n_heads * cfg.head_dim),
            ("gate_up", cfg.dim),
            ("down", cfg.ffn_dim),
            ("lm_head", cfg.dim),
        )
    }
    variants = [
        ("down", (2, 8)),
        ("down", (1, 4)),
        ("gate_up", (2, 4)),
        ("gate_up", (8, 16)),
        ("lm_head", (16, 16)),
        ("lm_head", (4, 4)),
        ("qkv", (2, 4)),
        ("wo", (2, 2)),
        ("wo", (8, 8)),
        ("down", (1, 16)),
    ]
    if VARIANTS is not None:
        variants = [(m, tuple(b)) for m, b in VARIANTS]
    rows, r = [], None
    ids, end = list(range(100, 400)), min(300, model.max_len)
    for matrix, block in [(None, None)] + ([] if SMOKE else variants):
        if time.perf_counter() - STARTED > BUDGET_S:
            log(f"  block variants: out of time before {matrix} {block}")
            break
        table = dict(base) if matrix is None else {**base, matrix: block}
        try:
            started = time.perf_counter()
            r = runner(model, "triton", packed, blocks=table, widths=(1,), buckets=(2048,))
            with torch.inference_mode():
                feed(r, ids[-1:], end - 1)
                ms = ms_per_step(r, 1, end)
            rows.append(dict(changed=matrix, block=block, ms=round(ms, 4)))
            log(
                f"  blocks {matrix or 'default'} {block or table}: {ms:.4f} ms (capture {time.perf_counter() - started:.1f}s)"
            )
        except Exception as e:  # a table that does not compile or fit: note it, go on
            rows.append(dict(changed=matrix, block=block, error=repr(e)[:300]))
            log(f"  blocks {matrix} {block}: {e!r}"[:400])
        r = None  # its graphs' memory back before the next capture
    RESULTS.setdefault("blocks", {})[name] = dict(base=base, rows=rows)
    save()


def section(title: str, fn, *args):
    log(f"== {title}")
    try:
        return fn(*args)
    except Exception as e:  # one section's failure must not cost the others
        import traceback

        traceback.print_exc()
        RESULTS.setdefault("errors", {})[title] = repr(e)[:2000]
        save()
        return None


def main() -> None:
    if not SMOKE:
        RESULTS["device"] = torch.cuda.get_device_name()
        import triton

        RESULTS["versions"] = dict(torch=torch.__version__, triton=triton.__version__)
        log(RESULTS["device"], RESULTS["versions"])
    if not os.environ.get("SPEED_ONLY"):  # sections 0 and 1
        section("formats", check_formats)
        for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
            section(f"lossless {name}", check_lossless, name)
    save()
    shapes = ONLY_SHAPES.split(",") if ONLY_SHAPES else list(SHAPES)
    built = section("speed qwen2.5-coder-1.5b", speed, "qwen2.5-coder-1.5b")
    if built is not None:
        model, packed, runners = built
        built = None
        section("profile qwen2.5-coder-1.5b", profile, "qwen2.5-coder-1.5b", runners)
        runners = None  # their graphs' memory back
        if "smollm2-135m" in shapes:
            section("speed smollm2-135m", speed, "smollm2-135m")
        if "qwen2.5-coder-0.5b" in shapes:
            section("speed qwen2.5-coder-0.5b", speed, "qwen2.5-coder-0.5b", ("triton-blocks", "torch-dense"))
        if VARIANTS != []:
            section("block tables qwen2.5-coder-1.5b", block_variants, "qwen2.5-coder-1.5b", model, packed)
    save()
    log("done; errors:", RESULTS.get("errors"))


if __name__ == "__main__":
    main()
