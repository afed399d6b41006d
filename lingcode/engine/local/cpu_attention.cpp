// Decode/verify attention for the CPU over a 16-bit KV cache (f16, the engine's choice, or bf16):
// lingcode::decode_attention.
//
// Why by hand: a decode step at context ~1000 reads the whole KV cache, and in f32 that is about
// half as many bytes as the 4-bit weights. A 16-bit cache halves it, but torch has no fast CPU path
// that reads 16-bit values and computes in f32 (bf16 bmm is slower than f32 on these shapes and
// bmm(out_dtype=float32) has no CPU kernel). This kernel reads each key and value once
// per step, computes in f32 and splits the context into fixed 256-position chunks
// (flash-decoding): one task per (kv head, chunk), then the chunks are combined in order.
//
// Row-exact by construction, which lossless speculation needs: a query row's result depends only
// on its own position and the cache, never on how many rows come with it, the thread count or the
// chunk count. Every score is one fixed chain of fma over the head dim; sums use 16 fixed lanes
// over positions (padding adds exact zeros); chunks are fixed positions combined in order.
//
// Layouts (what model.KVCache keeps on the CPU): keys position-last [KV, D, Lpad] with Lpad a
// multiple of 16 (blocks of 16 keys are read whole; the extra entries are never used), values
// [KV, L, D]. q [1, H, T, D] f32; head h reads kv head h / (H / KV); row t sees positions
// 0..start + t.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cpu_attention.h"

namespace {

using namespace lingcode::attention;

template <int64_t D>
at::Tensor decode_attention_(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v, int64_t start) {
  TORCH_CHECK(q_in.scalar_type() == at::kFloat, "decode_attention: q must be float32");
  const bool bf16 = k.scalar_type() == at::kBFloat16;
  TORCH_CHECK((bf16 || k.scalar_type() == at::kHalf) && v.scalar_type() == k.scalar_type(),
              "decode_attention: the cache must be bf16 or f16");
  TORCH_CHECK(k.stride(2) == 1 && k.stride(3) % LANES == 0, "decode_attention: keys must be position-last, padded");
  TORCH_CHECK(v.stride(3) == 1, "decode_attention: values must be position-first");
  const int64_t heads = q_in.size(1), t = q_in.size(2), kv_heads = k.size(1);
  const int64_t group = heads / kv_heads, rows = group * t, end = start + t;
  TORCH_CHECK(heads % kv_heads == 0 && rows <= MAX_ROWS, "decode_attention: too many rows");
  TORCH_CHECK(start >= 0 && end <= k.size(2) && end <= v.size(2), "decode_attention: positions past the cache");

  const at::Tensor q = q_in.contiguous();
  const float scale = 1.0f / std::sqrt(float(D));  // as the native step's and llama.cpp's
  const int64_t chunks = (end + CHUNK - 1) / CHUNK;
  at::Tensor m = at::empty({kv_heads, chunks, rows}, q.options());
  at::Tensor sum = at::empty({kv_heads, chunks, rows}, q.options());
  at::Tensor acc = at::empty({kv_heads, chunks, rows, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const auto* kp = static_cast<const uint16_t*>(k.data_ptr());
  const auto* vp = static_cast<const uint16_t*>(v.data_ptr());
  float *mp = m.data_ptr<float>(), *sp = sum.data_ptr<float>(), *ap = acc.data_ptr<float>();

  const auto run_chunk = bf16 ? chunk_attention<D, Bf16> : chunk_attention<D, F16>;
  at::parallel_for(0, kv_heads * chunks, 1, [&](int64_t begin, int64_t stop) {
    alignas(64) float q_rows[MAX_ROWS * D];
    int64_t visible[MAX_ROWS];
    for (int64_t task = begin; task < stop; ++task) {
      const int64_t h = task / chunks, c = task % chunks, l0 = c * CHUNK;
      const int64_t n = std::min(CHUNK, end - l0);
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = 0; i < t; ++i) {
          const int64_t r = g * t + i;
          const float* src = qp + ((h * group + g) * t + i) * D;  // rows (group, t), pre-scaled
          for (int64_t d = 0; d < D; ++d) q_rows[r * D + d] = src[d] * scale;
          visible[r] = std::clamp<int64_t>(start + i + 1 - l0, 0, n);
        }
      const int64_t at_ = task * rows;
      const uint16_t *kc = kp + h * k.stride(1) + l0, *vc = vp + h * v.stride(1) + l0 * v.stride(2);
      Ahead ahead;
      if (task + 1 < stop) {
        const int64_t nh = (task + 1) / chunks, nl0 = (task + 1) % chunks * CHUNK;
        ahead = Ahead(kp + nh * k.stride(1) + nl0, k.stride(3), vp + nh * v.stride(1) + nl0 * v.stride(2), v.stride(2),
                      D, std::min(CHUNK, end - nl0));
      }
      run_chunk(q_rows, rows, visible, kc, k.stride(3), vc, v.stride(2), n, mp + at_, sp + at_, ap + at_ * D, ahead);
    }
  });

  // combine the chunks of each row in order
  at::Tensor out = at::empty({1, heads, t, D}, q.options());
  float* op = out.data_ptr<float>();
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t g = 0; g < group; ++g)
      for (int64_t i = 0; i < t; ++i) {
        const int64_t at_ = h * chunks * rows + g * t + i;
        combine_chunks<D>(chunks, mp + at_, sp + at_, ap + at_ * D, rows, op + ((h * group + g) * t + i) * D);
      }
  return out;
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t start) {
  TORCH_CHECK(q.dim() == 4 && q.size(0) == 1 && (q.size(3) == 64 || q.size(3) == 128),
              "decode_attention: q must be [1, H, T, 64 or 128]");
  return q.size(3) == 64 ? decode_attention_<64>(q, k, v, start) : decode_attention_<128>(q, k, v, start);
}

}  // namespace

TORCH_LIBRARY(lingcode, m) { m.def("decode_attention(Tensor q, Tensor k, Tensor v, SymInt start) -> Tensor"); }
TORCH_LIBRARY_IMPL(lingcode, CPU, m) { m.impl("decode_attention", decode_attention); }
