// The CPU attention kernel over a 16-bit KV cache, shared by the decode_attention op
// (cpu_attention.cpp) and the native forward step (cpu_step.cpp). See cpu_attention.cpp for why and how.
#pragma once

#include <algorithm>
#if defined(__AVX512F__) || defined(__F16C__)
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

// f16 <-> f32 for one value. With F16C one instruction each; GCC's _Float16 casts call libgcc.
inline float half_to_float(uint16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  _Float16 f;
  std::memcpy(&f, &h, sizeof f);
  return float(f);
#endif
}

inline uint16_t float_to_half(float x) {
#ifdef __F16C__
  return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
#else
  const _Float16 f = _Float16(x);
  uint16_t h;
  std::memcpy(&h, &f, sizeof h);
  return h;
#endif
}

// The kernels below work in vectors of the machine's width (VL floats: 16 with AVX-512, 8 with
// AVX2) and keep as many in registers as it has (32 or 16): with 16-float vectors on AVX2 their
// accumulators spilled to memory, and attention ran 5-10 times slower than it should (prefill at 8K
// positions, 13 tokens/s). What a row gets does not depend on the width: every score is one chain of
// fma over d, every output one chain over positions, and sums go through 16 fixed lanes.
#if defined(__AVX512F__)
constexpr int64_t VL = 16;
#elif defined(__AVX__)
constexpr int64_t VL = 8;
#else
constexpr int64_t VL = 4;
#endif
typedef float fvec __attribute__((vector_size(VL * 4)));
typedef int32_t ivec __attribute__((vector_size(VL * 4)));
constexpr int REGISTERS = VL == 16 ? 32 : 16;

// VL cache entries as f32, per storage type
struct Bf16 {
  static fvec load(const uint16_t* p) {
    typedef uint16_t u16v __attribute__((vector_size(VL * 2)));
    typedef uint32_t u32v __attribute__((vector_size(VL * 4)));
    u16v raw;
    std::memcpy(&raw, p, sizeof raw);
    u32v bits = __builtin_convertvector(raw, u32v) << 16;
    fvec out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  }
};

struct F16 {
  static fvec load(const uint16_t* p) {
#if defined(__AVX512F__)  // GCC 12 converts a _Float16 vector one element at a time
    return (fvec)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX__) && defined(__F16C__)  // on AVX2 too: vcvtph2ps, not calls into libgcc
    return (fvec)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    fvec out;
    for (int64_t i = 0; i < VL; ++i) out[i] = half_to_float(p[i]);
    return out;
#endif
  }
};

// exp(x), x clamped to [-87, 88]: Cephes' expf polynomial, for one value and for a vector (the
// softmax's loop: written on scalars, GCC kept it scalar on AVX2, with a branch per clamp). The same
// operations either way, with no libm call. Relative error ~2e-7.
template <typename T, typename I>
inline T exp_poly(T x) {
  x = x < -87.0f ? T{} - 87.0f : x;
  x = x > 88.0f ? T{} + 88.0f : x;
  const T n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  T r = n * -0.693359375f + x;
  r = n * 2.12194440e-4f + r;
  T p = T{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  I bits;
  if constexpr (std::is_same_v<T, float>) {
    bits = I(uint32_t(int32_t(n) + 127) << 23);
  } else {
    bits = (__builtin_convertvector(n, I) + 127) << 23;
  }
  T scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float exp_clamped(float x) { return exp_poly<float, uint32_t>(x); }

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

// The next task's keys and values, fetched a few lines at a time while this task computes. A
// chunk's keys are D rows of the position-last cache, D streams at once: more than the hardware
// prefetcher follows, so without this every line was a miss waiting on memory, and decode attention
// read the cache at a quarter of the machine's bandwidth.
struct Ahead {
  const char* k = nullptr;  // the next chunk's first key row
  int64_t k_stride = 0;     // bytes between key rows
  int64_t k_lines = 0;      // lines per key row
  int64_t rows = 0;         // key rows (D)
  const char* v = nullptr;  // the next chunk's values, contiguous
  int64_t v_lines = 0;
  int64_t row = 0, line = 0;

  Ahead() = default;
  Ahead(const uint16_t* k_next, int64_t k_stride_d, const uint16_t* v_next, int64_t v_stride_l, int64_t d, int64_t n)
      : k(reinterpret_cast<const char*>(k_next)), k_stride(2 * k_stride_d), k_lines((2 * n + 63) / 64), rows(d),
        v(reinterpret_cast<const char*>(v_next)), v_lines(v_stride_l == d ? (2 * n * d + 63) / 64 : 0) {}

  // Two lines more (key rows first, then the values): a rate that has them all asked for by the
  // end of this task's scores (fewer left misses; more crowded this task's own loads out).
  inline void fetch() {
    for (int i = 0; i < 2; ++i) {
      if (row < rows) {
        __builtin_prefetch(k + row * k_stride + 64 * line);
        if (++line == k_lines) line = 0, ++row;
      } else if (line < v_lines) {
        __builtin_prefetch(v + 64 * line++);
      } else {
        return;
      }
    }
  }
};

// Scores of NR query rows (pre-scaled, [NR, D]) against B * VL keys from l0 (position-last): s[r][l].
// Each key row (one d) is read over B * VL positions in a row, so the hardware prefetcher follows
// one row at a time.
template <int64_t D, int NR, int B, typename Cache>
void score_blocks(const float* q, const uint16_t* k, int64_t k_stride_d, int64_t l0, float* s, Ahead& ahead) {
  fvec acc[NR][B] = {};
  for (int64_t d = 0; d < D; ++d) {
    ahead.fetch();
    fvec kv[B];
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) kv[b] = Cache::load(k + d * k_stride_d + l0 + VL * b);
#pragma GCC unroll 12
    for (int r = 0; r < NR; ++r) {
      const float qd = q[r * D + d];
#pragma GCC unroll 8
      for (int b = 0; b < B; ++b) acc[r][b] += qd * kv[b];
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < B; ++b) std::memcpy(s + r * CHUNK + l0 + VL * b, &acc[r][b], sizeof acc[r][b]);
}

// Rows per score pass: NR * B accumulators, B keys and a broadcast within the registers.
constexpr int SCORE_ROWS = REGISTERS == 32 ? 12 : 6;

// Scores of NR query rows (pre-scaled, [NR, D]) against n_pad keys (position-last): s[r][l]. Each
// score is one fixed chain of fma over d, however the positions are blocked.
template <int64_t D, int NR, typename Cache>
void scores(const float* q, const uint16_t* k, int64_t k_stride_d, int64_t n_pad, float* s, Ahead& ahead) {
  constexpr int FREE = REGISTERS - 3;
  constexpr int B = NR * 8 <= FREE ? 8 : (FREE / NR > 0 ? FREE / NR : 1);
  int64_t l0 = 0;
  for (; l0 + VL * B <= n_pad; l0 += VL * B) score_blocks<D, NR, B, Cache>(q, k, k_stride_d, l0, s, ahead);
  for (; l0 < n_pad; l0 += VL) score_blocks<D, NR, 1, Cache>(q, k, k_stride_d, l0, s, ahead);
}

// Rows per value pass, and the slice of d each pass keeps in registers: NR * slice accumulators,
// the slice of v and a broadcast within the registers (on AVX2, 3 rows of 4 vectors spilled).
constexpr int VALUE_ROWS = 6;
constexpr int64_t VALUE_SLICE = (REGISTERS == 32 ? 4 : 2) * VL;

// out[r] = sum over the first n positions of w[r][l] * v[l] for NR rows of weights (stride CHUNK),
// a slice of d at a time.
template <int64_t D, int NR, typename Cache>
void weighted_values(const float* w, const uint16_t* v, int64_t v_stride_l, int64_t n, float* out, Ahead& ahead) {
  constexpr int64_t SLICE = D < VALUE_SLICE ? D : VALUE_SLICE, V = SLICE / VL;
  for (int64_t d0 = 0; d0 < D; d0 += SLICE) {
    fvec acc[NR][V] = {};
    for (int64_t l = 0; l < n; ++l) {
      ahead.fetch();
      fvec vv[V];
#pragma GCC unroll 8
      for (int64_t j = 0; j < V; ++j) vv[j] = Cache::load(v + l * v_stride_l + d0 + j * VL);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const float wl = w[r * CHUNK + l];
#pragma GCC unroll 8
        for (int64_t j = 0; j < V; ++j) acc[r][j] += wl * vv[j];
      }
    }
    for (int r = 0; r < NR; ++r) std::memcpy(out + r * D + d0, acc[r], sizeof acc[r]);
  }
}

// One (kv head, chunk): for each of `rows` query rows (pre-scaled, [rows, D]) the chunk's
// partial softmax: max m, sum of exp(s - m), and sum of exp(s - m) * v. `ahead`: the next task's.
template <int64_t D, typename Cache>
void chunk_attention(const float* q, int64_t rows, const int64_t* visible, const uint16_t* k, int64_t k_stride_d,
                     const uint16_t* v, int64_t v_stride_l, int64_t n, float* m_out, float* sum_out, float* acc_out,
                     Ahead ahead = {}) {
  const int64_t n_pad = (n + LANES - 1) / LANES * LANES;
  alignas(64) float s[MAX_ROWS * CHUNK];

  // scores: up to SCORE_ROWS rows at a time
  for (int64_t r0 = 0, nr; r0 < rows; r0 += nr) {
    nr = block_rows(rows - r0, SCORE_ROWS);
    with_rows<SCORE_ROWS>(nr, [&](auto NR) { scores<D, NR, Cache>(q + r0 * D, k, k_stride_d, n_pad, s + r0 * CHUNK, ahead); });
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
    for (int64_t l = 0; l < n_pad; l += VL) {
      fvec e;
      std::memcpy(&e, sr + l, sizeof e);
      e = exp_poly<fvec, ivec>(e - m);
      std::memcpy(sr + l, &e, sizeof e);
    }
    for (int64_t l = vis; l < n_pad; ++l) sr[l] = 0.0f;
    for (int64_t j = 0; j < LANES; ++j) lane[j] = 0.0f;
    for (int64_t l0 = 0; l0 < n_pad; l0 += LANES)
      for (int64_t j = 0; j < LANES; ++j) lane[j] += sr[l0 + j];
    float total = 0.0f;
    for (int64_t j = 0; j < LANES; ++j) total += lane[j];
    sum_out[r] = total;
  }

  // exp(s - m) @ v, up to VALUE_ROWS rows at a time; the weights past a row's visible positions are
  // exact zeros
  for (int64_t r0 = 0, nr; r0 < rows; r0 += nr) {
    nr = block_rows(rows - r0, VALUE_ROWS);
    with_rows<VALUE_ROWS>(nr, [&](auto NR) {
      weighted_values<D, NR, Cache>(s + r0 * CHUNK, v, v_stride_l, n, acc_out + r0 * D, ahead);
    });
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
