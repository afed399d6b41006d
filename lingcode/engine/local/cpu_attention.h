// The CPU attention kernel over a 16-bit KV cache, shared by the decode_attention op
// (cpu_attention.cpp) and the native forward step (cpu_step.cpp). See cpu_attention.cpp for why and how.
#pragma once

#include <algorithm>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace lingcode::attention {

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

// exp(x), x clamped to [-87, 88]: Cephes' expf polynomial, written so that the compiler vectorizes
// it (no libm call, no branch). Relative error ~2e-7.
inline float exp_clamped(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
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
// B blocks of 16 positions for NR rows: each key row (one d) is read over 16 * B positions in a row,
// so the hardware prefetcher follows one row at a time instead of 64 rows 16 positions at a time.
template <int64_t D, int NR, int B, typename Cache>
void score_blocks(const float* q, const uint16_t* k, int64_t k_stride_d, int64_t l0, float* s) {
  f32x16 acc[NR][B] = {};
  for (int64_t d = 0; d < D; ++d)
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) {
      const f32x16 kv = Cache::load(k + d * k_stride_d + l0 + 16 * b);
#pragma GCC unroll 12
      for (int r = 0; r < NR; ++r) acc[r][b] += q[r * D + d] * kv;
    }
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < B; ++b) std::memcpy(s + r * CHUNK + l0 + 16 * b, &acc[r][b], sizeof acc[r][b]);
}

// Scores of NR query rows (pre-scaled, [NR, D]) against n_pad keys (position-last): s[r][l]. Each
// score is one fixed chain of fma over d, however the positions are blocked.
template <int64_t D, int NR, typename Cache>
void scores(const float* q, const uint16_t* k, int64_t k_stride_d, int64_t n_pad, float* s) {
  constexpr int B = NR * 8 <= 24 ? 8 : (24 / NR > 0 ? 24 / NR : 1);  // NR * B accumulators of 32 registers
  int64_t l0 = 0;
  for (; l0 + 16 * B <= n_pad; l0 += 16 * B) score_blocks<D, NR, B, Cache>(q, k, k_stride_d, l0, s);
  for (; l0 < n_pad; l0 += LANES) score_blocks<D, NR, 1, Cache>(q, k, k_stride_d, l0, s);
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
    for (int64_t l = 0; l < n_pad; ++l) sr[l] = exp_clamped(sr[l] - m);
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


// One query row's attention from its chunks' partials (m, sum, acc as chunk_attention leaves them;
// chunk c's at m[c * stride], acc[c * stride * D]), combined in chunk order: out[D].
template <int64_t D>
void combine_chunks(int64_t chunks, const float* m, const float* sum, const float* acc, int64_t stride, float* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < chunks; ++c) top = std::max(top, m[c * stride]);
  float total = 0.0f;
  alignas(64) float o[D] = {};
  for (int64_t c = 0; c < chunks; ++c) {
    if (m[c * stride] == -std::numeric_limits<float>::infinity()) continue;  // no position visible
    const float w = exp_clamped(m[c * stride] - top);
    total = std::fma(w, sum[c * stride], total);
    const float* a = acc + c * stride * D;
    for (int64_t d = 0; d < D; ++d) o[d] = std::fma(w, a[d], o[d]);
  }
  for (int64_t d = 0; d < D; ++d) out[d] = o[d] / total;
}

}  // namespace lingcode::attention
