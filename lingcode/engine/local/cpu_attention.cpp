// Decode/verify attention for the CPU over a 16-bit KV cache (f16, the engine's choice, or bf16):
// lingcode::decode_attention.
//
// Why by hand: a decode step at context ~1000 reads the whole KV cache, and in f32 that is about
// half as many bytes as the 4-bit weights. A 16-bit cache halves it, but torch has no fast CPU path
// that reads 16-bit values and computes in f32 (bf16 bmm is 2.3-2.5x slower than f32 on these
// shapes and bmm(out_dtype=float32) has no CPU kernel). This kernel reads each key and value once
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

#include <algorithm>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace {

constexpr int64_t CHUNK = 256;  // positions per task
constexpr int64_t LANES = 16;   // one 512-bit vector of f32
constexpr int64_t MAX_ROWS = 64;

// GCC/Clang vector extensions: the compiler keeps these in registers (one zmm with AVX-512) and
// lowers them to whatever the machine has; plain arrays in the loops below stayed in memory.
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

typedef _Float16 f16x16 __attribute__((vector_size(32)));

// 16 cache entries as f32, per storage type
struct Bf16 {
  static f32x16 load(const uint16_t* p) {
    u16x16 raw;
    std::memcpy(&raw, p, sizeof raw);
    u32x16 bits = __builtin_convertvector(raw, u32x16) << 16;
    f32x16 out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  }
};

struct F16 {
  static f32x16 load(const uint16_t* p) {
#ifdef __AVX512F__  // GCC 12 converts a _Float16 vector one element at a time
    return (f32x16)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
    f16x16 raw;
    std::memcpy(&raw, p, sizeof raw);
    return __builtin_convertvector(raw, f32x16);
#endif
  }
};

// exp(x) for x <= 0 (scores minus their max): Cephes' expf polynomial, written so that the
// compiler vectorizes it (no libm call, no branch). Relative error ~2e-7.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// f(std::integral_constant<int, nr>) for a runtime nr in 1..MAX: kernels take their row count
// as a template argument, so that their accumulators are registers.
template <int MAX, typename F>
void with_rows(int64_t nr, F&& f) {
  if constexpr (MAX > 1) {
    if (nr < MAX) return with_rows<MAX - 1>(nr, f);
  }
  f(std::integral_constant<int, MAX>{});
}

// The next block of at most `most` of `left` rows, the blocks as even as they can be (9 -> 5, 4).
inline int64_t block_rows(int64_t left, int64_t most) {
  const int64_t blocks = (left + most - 1) / most;
  return (left + blocks - 1) / blocks;
}

// Scores of NR query rows (pre-scaled, [NR, D]) against n_pad keys (position-last): s[r][l].
template <int64_t D, int NR, typename Cache>
void scores(const float* q, const uint16_t* k, int64_t k_stride_d, int64_t n_pad, float* s) {
  for (int64_t l0 = 0; l0 < n_pad; l0 += LANES) {
    f32x16 acc[NR] = {};
    for (int64_t d = 0; d < D; ++d) {
      const f32x16 kv = Cache::load(k + d * k_stride_d + l0);
      for (int r = 0; r < NR; ++r) acc[r] += q[r * D + d] * kv;
    }
    for (int r = 0; r < NR; ++r) std::memcpy(s + r * CHUNK + l0, &acc[r], sizeof acc[r]);
  }
}

// out[r] = sum over the first n positions of w[r][l] * v[l] for NR rows of weights (stride CHUNK).
template <int64_t D, int NR, typename Cache>
void weighted_values(const float* w, const uint16_t* v, int64_t v_stride_l, int64_t n, float* out) {
  f32x16 acc[NR][D / 16] = {};
  for (int64_t l = 0; l < n; ++l) {
    f32x16 vv[D / 16];
    for (int64_t d = 0; d < D / 16; ++d) vv[d] = Cache::load(v + l * v_stride_l + d * 16);
    for (int r = 0; r < NR; ++r)
      for (int64_t d = 0; d < D / 16; ++d) acc[r][d] += w[r * CHUNK + l] * vv[d];
  }
  for (int r = 0; r < NR; ++r) std::memcpy(out + r * D, acc[r], sizeof acc[r]);
}

// One (kv head, chunk): for each of `rows` query rows (pre-scaled, [rows, 64]) the chunk's
// partial softmax: max m, sum of exp(s - m), and sum of exp(s - m) * v.
template <int64_t D, typename Cache>
void chunk_attention(const float* q, int64_t rows, const int64_t* visible, const uint16_t* k, int64_t k_stride_d,
                     const uint16_t* v, int64_t v_stride_l, int64_t n, float* m_out, float* sum_out, float* acc_out) {
  const int64_t n_pad = (n + LANES - 1) / LANES * LANES;
  alignas(64) float s[MAX_ROWS * CHUNK];

  // scores: up to 12 rows (12 accumulators + the keys in 13 of 32 registers) by 16 positions
  for (int64_t r0 = 0, nr; r0 < rows; r0 += nr) {
    nr = block_rows(rows - r0, 12);
    with_rows<12>(nr, [&](auto NR) { scores<D, NR, Cache>(q + r0 * D, k, k_stride_d, n_pad, s + r0 * CHUNK); });
  }

  // per row: max over its visible positions, exp, sum in 16 fixed lanes; invisible -> 0
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * CHUNK;
    const int64_t vis = visible[r];
    for (int64_t l = vis; l < n_pad; ++l) sr[l] = -std::numeric_limits<float>::infinity();
    alignas(64) float lane[LANES];
    for (int64_t j = 0; j < LANES; ++j) lane[j] = -std::numeric_limits<float>::infinity();
    for (int64_t l0 = 0; l0 < n_pad; l0 += LANES)
      for (int64_t j = 0; j < LANES; ++j) lane[j] = std::max(lane[j], sr[l0 + j]);
    float m = lane[0];
    for (int64_t j = 1; j < LANES; ++j) m = std::max(m, lane[j]);
    m_out[r] = vis > 0 ? m : -std::numeric_limits<float>::infinity();
    if (vis == 0) m = 0.0f;
    for (int64_t l = 0; l < n_pad; ++l) sr[l] = exp_nonpositive(sr[l] - m);
    for (int64_t l = vis; l < n_pad; ++l) sr[l] = 0.0f;
    for (int64_t j = 0; j < LANES; ++j) lane[j] = 0.0f;
    for (int64_t l0 = 0; l0 < n_pad; l0 += LANES)
      for (int64_t j = 0; j < LANES; ++j) lane[j] += sr[l0 + j];
    float total = 0.0f;
    for (int64_t j = 0; j < LANES; ++j) total += lane[j];
    sum_out[r] = total;
  }

  // exp(s - m) @ v, up to 6 rows (24 accumulators + 4 value vectors); the weights past a row's
  // visible positions are exact zeros
  for (int64_t r0 = 0, nr; r0 < rows; r0 += nr) {
    nr = block_rows(rows - r0, 6);
    with_rows<6>(nr, [&](auto NR) { weighted_values<D, NR, Cache>(s + r0 * CHUNK, v, v_stride_l, n, acc_out + r0 * D); });
  }
}

at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v, int64_t start) {
  constexpr int64_t D = 64;
  TORCH_CHECK(q_in.dim() == 4 && q_in.size(0) == 1 && q_in.size(3) == D, "decode_attention: q must be [1, H, T, 64]");
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
  const float scale = 1.0f / std::sqrt(float(D));  // exact for D = 64
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
      run_chunk(q_rows, rows, visible, kc, k.stride(3), vc, v.stride(2), n, mp + at_, sp + at_, ap + at_ * D);
    }
  });

  // combine the chunks of each row in order
  at::Tensor out = at::empty({1, heads, t, D}, q.options());
  float* op = out.data_ptr<float>();
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t g = 0; g < group; ++g)
      for (int64_t i = 0; i < t; ++i) {
        const int64_t r = g * t + i;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < chunks; ++c) top = std::max(top, mp[(h * chunks + c) * rows + r]);
        float total = 0.0f;
        alignas(64) float o[D] = {};
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t at_ = (h * chunks + c) * rows + r;
          if (mp[at_] == -std::numeric_limits<float>::infinity()) continue;
          const float w = exp_nonpositive(mp[at_] - top);
          total = std::fma(w, sp[at_], total);
          for (int64_t d = 0; d < D; ++d) o[d] = std::fma(w, ap[at_ * D + d], o[d]);
        }
        float* dst = op + ((h * group + g) * t + i) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = o[d] / total;
      }
  return out;
}

}  // namespace

TORCH_LIBRARY(lingcode, m) { m.def("decode_attention(Tensor q, Tensor k, Tensor v, SymInt start) -> Tensor"); }
TORCH_LIBRARY_IMPL(lingcode, CPU, m) { m.impl("decode_attention", decode_attention); }
