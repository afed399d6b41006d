"""flashinfer's kernels against the ones the captured step runs now, at SmolLM2-135M's shapes, on the GPU.

The issue asks to adopt flashinfer where it beats the torch path, measured first. Per launch, each
kernel captured 30 times in a CUDA graph (bench/triton_blocks.py's timing), bf16, one layer:
  attention   torch SDPA with the step's mask (the torch step), the Triton step's attention kernel,
              flashinfer's decode (W = 1) and prefill (W = 8, causal) wrappers over the same cache:
              our [1, KV, max_len, D] cache is flashinfer's HND paged layout with one page; and
              the same entries copied into 16-entry pages (a layout the step would have to adopt)
  rms norm    F.rms_norm vs flashinfer.rmsnorm; residual add + norm vs flashinfer.fused_add_rmsnorm
  SiLU * up   F.silu(gate) * up vs flashinfer.silu_and_mul
Each line also gives the largest difference from the torch result.

flashinfer compiles its kernels at first use (JIT: nvcc, ninja). It is not a lingcode dependency:
install flashinfer-python to run this.   PYTHONPATH=. python3 bench/flashinfer_kernels.py
"""

import math
import sys

import flashinfer
import torch
import torch.nn.functional as F
from random_weights import random_weights
from replay_timing import per_launch_us

from lingcode.engine.local import triton_step
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.weights import ModelConfig

HEADS, KV_HEADS, HEAD_DIM, DIM, FFN, MAX_LEN = 9, 3, 64, 576, 1536, 8192
cfg = ModelConfig(n_layers=1, dim=DIM, ffn_dim=FFN, n_heads=HEADS, n_kv_heads=KV_HEADS, vocab_size=1024,
                  context_length=MAX_LEN)  # fmt: skip
weights = random_weights(cfg)
model = Transformer.from_weights(cfg, weights, torch.bfloat16, torch.device("cuda"))
model.setup_cache(MAX_LEN)
layer = model.layers[0]
cache = layer.attn.kv_cache
step = triton_step.TritonStep(model)
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashinfer {flashinfer.__version__}")


def report(what: str, fn, reference: torch.Tensor | None = None) -> None:
    try:
        out = fn()
        diff = "" if reference is None else f", max |diff| vs torch {(out.float() - reference.float()).abs().max().item():.3g}"
        print(f"  {what}: {per_launch_us(fn):.2f} us{diff}", flush=True)
    except Exception as exc:  # one kernel that fails to build or run should not hide the others
        print(f"  {what}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}", flush=True)


workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")
with torch.inference_mode():
    cache.k.normal_(), cache.v.normal_()
    for width, end in ((1, 300), (1, 2000), (1, 8000), (8, 300), (8, 2000)):
        print(f"attention, W={width}, context {end}:")
        pos = torch.arange(end - width, end, device="cuda")
        kv_len = -(-end // 128) * 128  # the step's bucket
        q = torch.randn(width, HEADS * HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        mask = torch.arange(kv_len, device="cuda")[None, :] <= pos[:, None]
        heads = q.view(1, width, HEADS, HEAD_DIM).transpose(1, 2)

        def sdpa():
            y = F.scaled_dot_product_attention(heads, cache.k[:, :, :kv_len], cache.v[:, :, :kv_len],
                                               attn_mask=mask, enable_gqa=True)  # fmt: skip
            return y.transpose(1, 2).reshape(width, -1)

        reference = sdpa()
        report("torch SDPA (the torch step)", sdpa)
        report("Triton step's attention kernel", lambda: step.attention(layer, q, pos, kv_len), reference)
        for page in (MAX_LEN, 16):  # one page: our cache as it is; 16-entry pages: a copy in that layout
            pages = -(-end // page)
            if page == MAX_LEN:
                kv_pages = (cache.k, cache.v)  # [pages=1, KV, page_size=MAX_LEN, D]: HND
            else:
                kv_pages = tuple(c[0, :, : pages * page].reshape(KV_HEADS, pages, page, HEAD_DIM).transpose(0, 1)
                                 .contiguous() for c in (cache.k, cache.v))  # fmt: skip
            indptr = torch.tensor([0, pages], dtype=torch.int32, device="cuda")
            indices = torch.arange(pages, dtype=torch.int32, device="cuda")
            last = torch.tensor([end - (pages - 1) * page], dtype=torch.int32, device="cuda")
            plan = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=1 / math.sqrt(HEAD_DIM))
            if width == 1:
                variants = {f"flashinfer decode, {page}-entry pages, tensor cores {tc}": tc for tc in (False, True)}
                for name, tensor_cores in variants.items():
                    try:
                        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                            workspace, "HND", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                            paged_kv_indptr_buffer=indptr.clone(), paged_kv_indices_buffer=indices.clone(),
                            paged_kv_last_page_len_buffer=last.clone(),
                        )  # fmt: skip
                        wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, HEAD_DIM, page, **plan)
                        q3 = q.view(1, HEADS, HEAD_DIM)
                        report(name, lambda w=wrapper, kv=kv_pages: w.run(q3, kv).view(1, -1), reference)
                    except Exception as exc:
                        print(f"  {name}: {type(exc).__name__}: {exc}"[:300])
            else:
                name = f"flashinfer prefill (causal), {page}-entry pages"
                try:
                    qo = torch.tensor([0, width], dtype=torch.int32, device="cuda")
                    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                        workspace, "HND", use_cuda_graph=True, qo_indptr_buf=qo.clone(),
                        paged_kv_indptr_buf=indptr.clone(), paged_kv_indices_buf=indices.clone(),
                        paged_kv_last_page_len_buf=last.clone(),
                    )  # fmt: skip
                    wrapper.plan(qo, indptr, indices, last, HEADS, KV_HEADS, HEAD_DIM, page, causal=True, **plan)
                    q3 = q.view(width, HEADS, HEAD_DIM)
                    report(name, lambda w=wrapper, kv=kv_pages: w.run(q3, kv).view(width, -1), reference)
                except Exception as exc:
                    print(f"  {name}: {type(exc).__name__}: {exc}"[:300])

    for width in (1, 8):
        print(f"norms and activation, W={width}:")
        x = torch.randn(width, DIM, device="cuda", dtype=torch.bfloat16)
        residual = torch.randn(width, DIM, device="cuda", dtype=torch.bfloat16)
        weight = layer.attn_norm.weight
        reference = F.rms_norm(x, (DIM,), weight, 1e-5)
        report("F.rms_norm", lambda: F.rms_norm(x, (DIM,), weight, 1e-5))
        report("flashinfer.rmsnorm", lambda: flashinfer.rmsnorm(x, weight, 1e-5), reference)
        report("residual add + F.rms_norm", lambda: F.rms_norm(x + residual, (DIM,), weight, 1e-5))
        xs, rs = x.clone(), residual.clone()
        report("flashinfer.fused_add_rmsnorm (in place)", lambda: flashinfer.fused_add_rmsnorm(xs, rs, weight, 1e-5))
        gate_up = torch.randn(width, 2 * FFN, device="cuda", dtype=torch.bfloat16)
        gate, up = gate_up.chunk(2, dim=-1)
        reference = F.silu(gate) * up
        report("F.silu(gate) * up", lambda: F.silu(gate) * up)
        report("flashinfer.silu_and_mul", lambda: flashinfer.silu_and_mul(gate_up), reference)
sys.stdout.flush()
