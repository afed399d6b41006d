// The whole batch-1 forward pass of a Llama-family model on the CPU, in one call from Python:
// lingcode's native step (cpu_step.py says when the engine uses it).
//
// Why: a decode step of the 135M default model reads ~97 MB of 4-bit weights; at the memory
// bandwidth of two cores that is ~6 ms, while torch spent ~30 ms, mostly in the dispatch of ~600
// small ops and their OpenMP regions. Here two threads (Pool) run the whole step with five
// barriers per layer, and every matmul reads the GGUF's own blocks (Q4_1, Q8_0) against
// activations quantized to 8 bits per block of 32 (ggml's Q8_1 idea), with integer dot products.
//
// Row-exact by construction, which lossless speculation needs: each token's numbers go through the
// same operations in the same order whatever the number of tokens in the step and the thread count.
// Per-token work (norms, quantization, RoPE, SiLU, the attention's combine) is done for every token
// by every thread into its own buffers, so it never depends on how tokens are split; a matmul's
// output row for a token is one fixed chain of float operations over its blocks (the block's
// integer dot product is exact); attention is cpu_attention.h's chunked kernel, row-exact too.
//
// Weights are repacked once at load into groups of 16 rows: for each block of 32 columns, the
// 16 rows' f16 scales (and mins) and their codes interleaved 4 bytes at a time, so that one 512-bit
// vector holds 4 codes of each of 16 rows and an integer dot product (vpdpbusd) gives 16 rows'
// partial sums at once, with no horizontal sums. Kernels: AVX-512 (VNNI or BW), AVX2 (with or
// without AVX-VNNI), or portable C++, chosen at build time by the machine's flags (-march=native).

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#endif

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "cpu_attention.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define LC_ISA_512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LC_ISA_256 1
#endif

// The kernels' loops over tokens and code lines are unrolled by hand-set pragmas: GCC left some
// rolled, which kept the accumulators in memory (a 3-token step then cost twice a 2-token one).

namespace lingcode::step {

using attention::f32x16;

constexpr int64_t GROUP = 16;  // rows interleaved together
constexpr int64_t QK = 32;     // weights per block (one scale)
constexpr int NT = 8;          // tokens per register tile in the matmuls
constexpr int64_t HEAD_DIM = 64;

enum Kind : int64_t { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };  // ggml's type ids

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline f32x16 loadv(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void storev(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }

// Sum of 16 lanes in a fixed order (a tree).
inline float hsum(f32x16 v) {
  float s[16];
  std::memcpy(s, &v, sizeof s);
  for (int w = 8; w; w /= 2)
    for (int i = 0; i < w; ++i) s[i] += s[i + w];
  return s[0];
}

inline float half_to_float(uint16_t h) {
  _Float16 f;
  std::memcpy(&f, &h, sizeof f);
  return float(f);
}

inline uint16_t float_to_half(float x) {
  const _Float16 f = _Float16(x);
  uint16_t h;
  std::memcpy(&h, &f, sizeof h);
  return h;
}

// --- weights --------------------------------------------------------------------------------------

// A weight matrix [rows, cols] repacked from GGUF blocks. For row group g and block b:
// codes at ((g * blocks + b) * code_bytes): 64-byte lines, line j holding bytes 4j..4j+3 of each
// of the 16 rows' block data (Q4_1: the 16 bytes of nibbles, so 4 lines; Q8_0: the 32 int8 codes,
// 8 lines); scales at ((g * blocks + b) * scale_count): 16 f16 d, then (Q4_1) 16 f16 m.
// Q4_0 is stored as Q4_1 with m = -8 d (exact in f16).
struct Matrix {
  int64_t kind = 0, rows = 0, cols = 0;
  at::Tensor codes, scales;

  int64_t blocks() const { return cols / QK; }
  int64_t code_bytes() const { return kind == Q8_0 ? 512 : 256; }
  int64_t scale_count() const { return kind == Q8_0 ? 16 : 32; }
  const uint8_t* group_codes(int64_t g) const { return codes.data_ptr<uint8_t>() + g * blocks() * code_bytes(); }
  const uint16_t* group_scales(int64_t g) const {
    return reinterpret_cast<const uint16_t*>(scales.data_ptr<int16_t>()) + g * blocks() * scale_count();
  }
  int64_t bytes() const { return codes.nbytes() + scales.nbytes(); }

  // One row as floats (the token embedding).
  void dequantize_row(int64_t row, float* out) const {
    const int64_t g = row / GROUP, lane = row % GROUP, nb = blocks();
    const uint8_t* c = group_codes(g);
    const uint16_t* s = group_scales(g);
    for (int64_t b = 0; b < nb; ++b, c += code_bytes(), s += scale_count()) {
      const float d = half_to_float(s[lane]);
      if (kind == Q8_0) {
        for (int64_t e = 0; e < QK; ++e) out[b * QK + e] = d * float(int8_t(c[64 * (e / 4) + 4 * lane + e % 4]));
      } else {
        const float m = half_to_float(s[16 + lane]);
        for (int64_t e = 0; e < 16; ++e) {
          const uint8_t byte = c[64 * (e / 4) + 4 * lane + e % 4];
          out[b * QK + e] = std::fma(d, float(byte & 15), m);
          out[b * QK + 16 + e] = std::fma(d, float(byte >> 4), m);
        }
      }
    }
  }
};

struct MappedFile {
  const uint8_t* data = nullptr;
  size_t size = 0;
  explicit MappedFile(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY);
    TORCH_CHECK(fd >= 0, "cannot open ", path);
    struct stat st;
    fstat(fd, &st);
    size = size_t(st.st_size);
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    TORCH_CHECK(p != MAP_FAILED, "cannot map ", path);
    data = static_cast<const uint8_t*>(p);
  }
  ~MappedFile() { munmap(const_cast<uint8_t*>(data), size); }
};

// parts: (byte offset of the tensor's data in the file, rows, row order or None: output row i of
// the part is the file's row order[i]), stacked in that order (fused QKV, gate/up).
Matrix repack(const std::string& path, int64_t kind, int64_t cols,
              const std::vector<std::tuple<int64_t, int64_t, std::optional<at::Tensor>>>& parts) {
  TORCH_CHECK(kind == Q4_0 || kind == Q4_1 || kind == Q8_0, "native step: unsupported GGUF type ", kind);
  TORCH_CHECK(cols % QK == 0, "native step: columns must be a multiple of 32");
  const int64_t in_block = kind == Q4_0 ? 18 : kind == Q4_1 ? 20 : 34;
  Matrix m;
  m.kind = kind == Q8_0 ? Q8_0 : Q4_1;
  m.cols = cols;
  for (const auto& part : parts) m.rows += std::get<1>(part);
  TORCH_CHECK(m.rows % GROUP == 0, "native step: rows must be a multiple of 16");
  const int64_t nb = m.blocks(), groups = m.rows / GROUP;
  m.codes = at::empty({groups * nb * m.code_bytes()}, at::kByte);
  m.scales = at::empty({groups * nb * m.scale_count()}, at::kShort);

  MappedFile file(path);
  std::vector<const uint8_t*> sources(m.rows);  // each output row's bytes in the file
  int64_t row = 0;
  for (const auto& [offset, rows, order] : parts) {
    TORCH_CHECK(offset >= 0 && size_t(offset + rows * nb * in_block) <= file.size, "native step: tensor past the file's end");
    at::Tensor o;
    if (order) {
      o = order->to(at::kLong).contiguous();
      TORCH_CHECK(o.numel() == rows, "native step: a row order must name every row");
    }
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t src = order ? o.data_ptr<int64_t>()[i] : i;
      TORCH_CHECK(src >= 0 && src < rows, "native step: row order out of range");
      sources[row++] = file.data + offset + src * nb * in_block;
    }
  }
  uint8_t* codes = m.codes.data_ptr<uint8_t>();
  uint16_t* scales = reinterpret_cast<uint16_t*>(m.scales.data_ptr<int16_t>());
  const int64_t cb = m.code_bytes(), sc = m.scale_count();
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t lane = 0; lane < GROUP; ++lane) {
        const uint8_t* src = sources[g * GROUP + lane];
        for (int64_t b = 0; b < nb; ++b, src += in_block) {
          uint8_t* c = codes + (g * nb + b) * cb;
          uint16_t* s = scales + (g * nb + b) * sc;
          uint16_t d;
          std::memcpy(&d, src, 2);
          s[lane] = d;
          if (kind == Q8_0) {
            #pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) std::memcpy(c + 64 * j + 4 * lane, src + 2 + 4 * j, 4);
          } else {
            if (kind == Q4_1) {
              std::memcpy(&s[16 + lane], src + 2, 2);
            } else {
              s[16 + lane] = float_to_half(-8.0f * half_to_float(d));
            }
            const uint8_t* qs = src + (kind == Q4_1 ? 4 : 2);
            #pragma GCC unroll 8
            for (int j = 0; j < 4; ++j) std::memcpy(c + 64 * j + 4 * lane, qs + 4 * j, 4);
          }
        }
      }
  });
  return m;
}

// --- activations ----------------------------------------------------------------------------------

// max |x| over a block of 32, and the block rounded to int8 as round(x * id) (the product rounded
// once, then to the nearest integer, ties to even: the same integers on every kernel path); returns
// their sum.
#if defined(__AVX512F__)
inline float block_amax(const float* x) {
  const __m512 a = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)), _mm512_abs_ps(_mm512_loadu_ps(x + 16)));
  return _mm512_reduce_max_ps(a);
}

inline int32_t quantize_block(const float* x, float id, int8_t* out) {
  const __m512 scale = _mm512_set1_ps(id);
  const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x), scale), mode));
  const __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + 16), scale), mode));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(q1));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}
#elif defined(__AVX2__)
inline float block_amax(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
  for (int i = 8; i < 32; i += 8) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline int32_t quantize_block(const float* x, float id, int8_t* out) {
  const __m256 scale = _mm256_set1_ps(id);
  __m256i sum = _mm256_setzero_si256();
  for (int i = 0; i < 32; i += 8) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale),
                                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    sum = _mm256_add_epi32(sum, q);
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), q);
    for (int j = 0; j < 8; ++j) out[i + j] = int8_t(lanes[j]);
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}
#else
inline float block_amax(const float* x) {
  float m = 0.0f;
  for (int i = 0; i < 32; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

inline int32_t quantize_block(const float* x, float id, int8_t* out) {
  int32_t sum = 0;
  for (int i = 0; i < 32; ++i) {
    const float product = x[i] * id;  // rounded once, as the vector paths do
    out[i] = int8_t(std::nearbyint(product));
    sum += out[i];
  }
  return sum;
}
#endif

// T tokens' activations [T, k], each block of 32 quantized to int8 with one scale d: q = round(x / d),
// d = max |x| / 127. Kept per block: d, the sum of q, and d times it (for Q4_1's min term).
struct Act {
  int64_t k = 0, blocks = 0;
  std::vector<int8_t> q;
  std::vector<float> d, sum;
  std::vector<int32_t> isum;

  void resize(int64_t tokens, int64_t k_max) {
    if (int64_t(q.size()) < tokens * k_max) {
      q.resize(tokens * k_max);
      d.resize(tokens * k_max / QK);
      sum.resize(tokens * k_max / QK);
      isum.resize(tokens * k_max / QK);
    }
  }
  void set_width(int64_t k_) {
    k = k_;
    blocks = k_ / QK;
  }
  const int8_t* qt(int64_t t, int64_t b) const { return q.data() + t * k + b * QK; }
  int64_t at(int64_t t, int64_t b) const { return t * blocks + b; }

  void quantize(int64_t t, const float* x) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float amax = block_amax(x + b * QK);
      const float dq = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
      const int32_t s = quantize_block(x + b * QK, id, q.data() + t * k + b * QK);
      d[at(t, b)] = dq;
      sum[at(t, b)] = dq * float(s);  // of the quantized values: its error cancels the codes' (Q4_1 mins)
      isum[at(t, b)] = s;
    }
  }
};

// --- matmul kernels: 16 rows (one group) x nt tokens -------------------------------------------------
// out[t * ldo + lane] = the row's dot product with token t0 + t; the float chain per (row, token) is
// for each block: acc = fma(isum, d_w * d_x, acc), then (Q4_1) acc = fma(m_w, sum_x, acc).

#if LC_ISA_512

inline __m512i dot_u8i8(__m512i acc, __m512i u8, __m512i i8) {
#ifdef __AVX512VNNI__
  return _mm512_dpbusd_epi32(acc, u8, i8);
#else  // u8 <= 15 here: the 16-bit pair sums cannot saturate
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u8, i8), _mm512_set1_epi16(1)));
#endif
}

template <int N>
void q4_tile(const Matrix& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  __m512 acc[N];
  #pragma GCC unroll 8
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const uint8_t* c = w.group_codes(g);
  const uint16_t* s = w.group_scales(g);
  const int64_t nb = w.blocks();
  for (int64_t b = 0; b < nb; ++b, c += 256, s += 32) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 16)));
    __m512i lo[4], hi[4];
    #pragma GCC unroll 8
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_load_si512(c + 64 * j);
      lo[j] = _mm512_and_si512(v, low);
      hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    #pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      const int8_t* x = a.qt(t0 + t, b);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      #pragma GCC unroll 8
      for (int j = 0; j < 4; ++j) {
        s0 = dot_u8i8(s0, lo[j], _mm512_set1_epi32(load_i32(x + 4 * j)));
        s1 = dot_u8i8(s1, hi[j], _mm512_set1_epi32(load_i32(x + 16 + 4 * j)));
      }
      const int64_t i = a.at(t0 + t, b);
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      acc[t] = _mm512_fmadd_ps(sum, _mm512_mul_ps(d, _mm512_set1_ps(a.d[i])), acc[t]);
      acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.sum[i]), acc[t]);
    }
  }
  #pragma GCC unroll 8
  for (int t = 0; t < N; ++t) _mm512_storeu_ps(out + t * ldo, acc[t]);
}

template <int N>
void q8_tile(const Matrix& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  __m512 acc[N];
  #pragma GCC unroll 8
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  const uint8_t* c = w.group_codes(g);
  const uint16_t* s = w.group_scales(g);
  const int64_t nb = w.blocks();
  for (int64_t b = 0; b < nb; ++b, c += 512, s += 16) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    __m512i u[8], sign[8];
#ifdef __AVX512VNNI__  // codes + 128 as unsigned; the sum then has 128 * sum(x) too much
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) u[j] = _mm512_xor_si512(_mm512_load_si512(c + 64 * j), flip);
    (void)sign;
#else  // |codes| times x with the codes' signs (16-bit pair sums stay below 2^15)
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      sign[j] = _mm512_load_si512(c + 64 * j);
      u[j] = _mm512_abs_epi8(sign[j]);
    }
#endif
    #pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      const int8_t* x = a.qt(t0 + t, b);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      #pragma GCC unroll 8
      for (int j = 0; j < 8; j += 2) {
        __m512i x0 = _mm512_set1_epi32(load_i32(x + 4 * j)), x1 = _mm512_set1_epi32(load_i32(x + 4 * j + 4));
#ifndef __AVX512VNNI__
        x0 = _mm512_mask_sub_epi8(x0, _mm512_movepi8_mask(sign[j]), _mm512_setzero_si512(), x0);
        x1 = _mm512_mask_sub_epi8(x1, _mm512_movepi8_mask(sign[j + 1]), _mm512_setzero_si512(), x1);
#endif
        s0 = dot_u8i8(s0, u[j], x0);
        s1 = dot_u8i8(s1, u[j + 1], x1);
      }
      const int64_t i = a.at(t0 + t, b);
      __m512i isum = _mm512_add_epi32(s0, s1);
#ifdef __AVX512VNNI__
      isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(128 * a.isum[i]));
#endif
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(a.d[i])), acc[t]);
    }
  }
  #pragma GCC unroll 8
  for (int t = 0; t < N; ++t) _mm512_storeu_ps(out + t * ldo, acc[t]);
}

const char* isa() {
#ifdef __AVX512VNNI__
  return "avx512-vnni";
#else
  return "avx512bw";
#endif
}

#elif LC_ISA_256

inline __m256i dot_u8i8(__m256i acc, __m256i u8, __m256i i8) {
#ifdef __AVXVNNI__
  return _mm256_dpbusd_avx_epi32(acc, u8, i8);
#else  // |u8| <= 128 and |i8| <= 127 here: the 16-bit pair sums cannot saturate
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, i8), _mm256_set1_epi16(1)));
#endif
}

// Eight rows at a time: half h of the group is bytes 32h..32h+31 of each 64-byte line.
template <int N>
void q4_tile(const Matrix& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const int64_t nb = w.blocks();
  for (int h = 0; h < 2; ++h) {
    __m256 acc[N];
    #pragma GCC unroll 8
    for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
    const uint8_t* c = w.group_codes(g) + 32 * h;
    const uint16_t* s = w.group_scales(g) + 8 * h;
    for (int64_t b = 0; b < nb; ++b, c += 256, s += 32) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16)));
      __m256i lo[4], hi[4];
      #pragma GCC unroll 8
      for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j));
        lo[j] = _mm256_and_si256(v, low);
        hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
      #pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const int8_t* x = a.qt(t0 + t, b);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int j = 0; j < 4; ++j) {
          s0 = dot_u8i8(s0, lo[j], _mm256_set1_epi32(load_i32(x + 4 * j)));
          s1 = dot_u8i8(s1, hi[j], _mm256_set1_epi32(load_i32(x + 16 + 4 * j)));
        }
        const int64_t i = a.at(t0 + t, b);
        const __m256 sum = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
        acc[t] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, _mm256_set1_ps(a.d[i])), acc[t]);
        acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.sum[i]), acc[t]);
      }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < N; ++t) _mm256_storeu_ps(out + t * ldo + 8 * h, acc[t]);
  }
}

template <int N>
void q8_tile(const Matrix& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  const int64_t nb = w.blocks();
  for (int h = 0; h < 2; ++h) {
    __m256 acc[N];
    #pragma GCC unroll 8
    for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
    const uint8_t* c = w.group_codes(g) + 32 * h;
    const uint16_t* s = w.group_scales(g) + 8 * h;
    for (int64_t b = 0; b < nb; ++b, c += 512, s += 16) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      __m256i u[8], sign[8];
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        sign[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j));
        u[j] = _mm256_sign_epi8(sign[j], sign[j]);  // |codes|
      }
      #pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const int8_t* x = a.qt(t0 + t, b);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j += 2) {
          s0 = dot_u8i8(s0, u[j], _mm256_sign_epi8(_mm256_set1_epi32(load_i32(x + 4 * j)), sign[j]));
          s1 = dot_u8i8(s1, u[j + 1], _mm256_sign_epi8(_mm256_set1_epi32(load_i32(x + 4 * j + 4)), sign[j + 1]));
        }
        const int64_t i = a.at(t0 + t, b);
        const __m256 sum = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
        acc[t] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, _mm256_set1_ps(a.d[i])), acc[t]);
      }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < N; ++t) _mm256_storeu_ps(out + t * ldo + 8 * h, acc[t]);
  }
}

const char* isa() {
#ifdef __AVXVNNI__
  return "avx2-vnni";
#else
  return "avx2";
#endif
}

#else  // portable C++

template <int N>
void q4_tile(const Matrix& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  const uint8_t* c = w.group_codes(g);
  const uint16_t* s = w.group_scales(g);
  const int64_t nb = w.blocks();
  float acc[N][GROUP] = {};
  for (int64_t b = 0; b < nb; ++b, c += 256, s += 32)
    for (int64_t lane = 0; lane < GROUP; ++lane) {
      int32_t q[QK];
      for (int64_t e = 0; e < 16; ++e) {
        const uint8_t byte = c[64 * (e / 4) + 4 * lane + e % 4];
        q[e] = byte & 15;
        q[16 + e] = byte >> 4;
      }
      const float d = half_to_float(s[lane]), m = half_to_float(s[16 + lane]);
      #pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const int8_t* x = a.qt(t0 + t, b);
        int32_t isum = 0;
        for (int64_t e = 0; e < QK; ++e) isum += q[e] * x[e];
        const int64_t i = a.at(t0 + t, b);
        acc[t][lane] = std::fma(float(isum), d * a.d[i], acc[t][lane]);
        acc[t][lane] = std::fma(m, a.sum[i], acc[t][lane]);
      }
    }
  #pragma GCC unroll 8
  for (int t = 0; t < N; ++t) std::memcpy(out + t * ldo, acc[t], sizeof acc[t]);
}

template <int N>
void q8_tile(const Matrix& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  const uint8_t* c = w.group_codes(g);
  const uint16_t* s = w.group_scales(g);
  const int64_t nb = w.blocks();
  float acc[N][GROUP] = {};
  for (int64_t b = 0; b < nb; ++b, c += 512, s += 16)
    for (int64_t lane = 0; lane < GROUP; ++lane) {
      int32_t q[QK];
      for (int64_t e = 0; e < QK; ++e) q[e] = int8_t(c[64 * (e / 4) + 4 * lane + e % 4]);
      const float d = half_to_float(s[lane]);
      #pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const int8_t* x = a.qt(t0 + t, b);
        int32_t isum = 0;
        for (int64_t e = 0; e < QK; ++e) isum += q[e] * x[e];
        acc[t][lane] = std::fma(float(isum), d * a.d[a.at(t0 + t, b)], acc[t][lane]);
      }
    }
  #pragma GCC unroll 8
  for (int t = 0; t < N; ++t) std::memcpy(out + t * ldo, acc[t], sizeof acc[t]);
}

const char* isa() { return "portable"; }

#endif

template <int N>
void tile(const Matrix& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  if (w.kind == Q8_0)
    q8_tile<N>(w, g, a, t0, out, ldo);
  else
    q4_tile<N>(w, g, a, t0, out, ldo);
}

// out[t * ldo + row] for row groups [g0, g1) and tokens [0, tokens): the tokens in tiles of NT
// (then one tile of the rest), each group's weights read once per tile.
void matmul(const Matrix& w, const Act& a, int64_t tokens, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t t0 = 0; t0 < tokens; t0 += NT) {
      float* o = out + t0 * ldo + g * GROUP;
      attention::with_rows<NT>(std::min<int64_t>(NT, tokens - t0), [&](auto n) { tile<n>(w, g, a, t0, o, ldo); });
    }
}

// x [T, cols] @ w.T, activations quantized as the step quantizes them (for tests and benchmarks).
at::Tensor matmul_op(const Matrix& w, const at::Tensor& x_in) {
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.cols, "matmul: x must be [T, cols]");
  const int64_t T = x.size(0);
  Act act;
  act.resize(T, w.cols);
  act.set_width(w.cols);
  for (int64_t t = 0; t < T; ++t) act.quantize(t, x.data_ptr<float>() + t * w.cols);
  at::Tensor out = at::empty({T, w.rows}, at::kFloat);
  matmul(w, act, T, out.data_ptr<float>(), w.rows, 0, w.rows / GROUP);
  return out;
}

// --- elementwise, one token ---------------------------------------------------------------------

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  f32x16 ss = {};
  for (int64_t i = 0; i < n; i += 16) {
    const f32x16 v = loadv(x + i);
    ss += v * v;
  }
  const float r = 1.0f / std::sqrt(hsum(ss) / float(n) + eps);
  for (int64_t i = 0; i < n; i += 16) storev(out + i, loadv(x + i) * r * loadv(weight + i));
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) storev(x + i, loadv(x + i) + loadv(y + i));
}

// Rotate-half RoPE on one head of 64 (the Hugging Face layout; weights.py unpermutes GGUF's rows).
void rope(float* x, const float* cos, const float* sin) {
  for (int64_t i = 0; i < HEAD_DIM / 2; ++i) {
    const float a = x[i], b = x[i + HEAD_DIM / 2];
    x[i] = a * cos[i] - b * sin[i];
    x[i + HEAD_DIM / 2] = b * cos[i + HEAD_DIM / 2] + a * sin[i + HEAD_DIM / 2];
  }
}

// --- threads ----------------------------------------------------------------------------------------

// How long a thread spins before it sleeps: adaptive, per thread and call site, in nanoseconds (a
// pause instruction takes 2-4 times longer on one x86 CPU than on another). A step has ~150
// barriers. Where both threads have a core each, the wait is a few microseconds and spinning
// catches it. Where another process holds one of the two cores and the threads share the other,
// spinning holds the core the partner needs: libgomp's default (spin ~0.3 s) then cost a whole
// timeslice at every barrier (~0.6 s a step instead of ~3 ms), a fixed 66 us spin ~10 ms a step
// (docs/engine-notes.md). So the budget halves after a wait the partner ended later than the most
// it may spin (it was not running), and doubles after a shorter one (spinning would catch it). Judged
// by when the partner published, not when the sleeper woke: a wake-up alone takes 10-70 us here, so
// judging by it halved the budget at every barrier after an idle pause and never recovered (steps of
// 11 ms instead of 2.1 when requests came with pauses between them).
struct Spin {
  int64_t budget, most;  // ns
};

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Sleeping and waking. A waiter spins within its budget, then counts itself in `sleepers` and sleeps
// in the kernel while the word still holds `old` (the kernel checks, so a change between our check
// and the sleep is never slept through). A waker changes the word first and calls the kernel only
// if someone may sleep. Both sides are seq_cst, so either the waker sees the sleeper or the
// sleeper sees the new value. (With std::atomic's wait and notify_all, libstdc++ 12 skips the wake
// on a check of its own waiter count that a release store is not ordered before. The step once
// slept 15 minutes with every thread waiting; whether that was the cause is not established:
// docs/engine-notes.md.)
// A sleep also ends after 100 ms: should a wake-up still be lost somewhere, the step goes on
// (the wait re-checks its word) and the loss is counted (Step.lost_wakes), instead of a hang.
#if defined(__linux__)
// True if the sleep timed out.
inline bool sleep_while(std::atomic<uint32_t>& word, uint32_t old) {
  timespec most{0, 100'000'000};
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, old, &most, nullptr, 0) != 0 &&
         errno == ETIMEDOUT;
}
inline void wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}
#else
inline bool sleep_while(std::atomic<uint32_t>& word, uint32_t old) {
  word.wait(old, std::memory_order_seq_cst);
  return false;
}
inline void wake_all(std::atomic<uint32_t>& word) { word.notify_all(); }
#endif

constexpr int64_t LEAST_SPIN_NS = 500;
thread_local Spin barrier_spin{66'000, 66'000};
thread_local Spin idle_spin{660'000, 660'000};  // between steps, while the caller runs a little Python

// The caller and n - 1 helper threads running one function together, with a barrier. Helpers sleep
// between calls. One call at a time (the engine's worker thread).
class Pool {
 public:
  ~Pool() { resize(1); }

  void run(int n, const std::function<void(int, int)>& f) {
    resize(n);
    if (n == 1) return f(0, 1);
    task_ = &f;
    caller_cpu_.store(current_cpu(), std::memory_order_relaxed);
    running_.store(n - 1, std::memory_order_seq_cst);
    publish(epoch_, epoch_.load(std::memory_order_relaxed) + 1);
    f(0, n);
    for (uint32_t left = running_.load(std::memory_order_seq_cst); left != 0;) left = wait_while(running_, left, barrier_spin);
  }

  // Every thread of the call waits here until all have arrived.
  void barrier() {
    const uint32_t generation = generation_.load(std::memory_order_seq_cst);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == int(helpers_.size())) {
      arrived_.store(0, std::memory_order_relaxed);
      publish(generation_, generation + 1);
      return;
    }
    wait_while(generation_, generation, barrier_spin);
  }

  // How many times a wait went to sleep (tests: the sleeping path ran).
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // Sleeps that timed out although the word had changed (a wake-up lost): 0 unless something is wrong.
  uint64_t lost_wakes() const { return lost_wakes_.load(std::memory_order_relaxed); }

 private:
  static int64_t clock_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  // Publish a new value; a sleeper is woken, and told when the value changed.
  void publish(std::atomic<uint32_t>& word, uint32_t value) {
    word.store(value, std::memory_order_seq_cst);
    woke_sleeper(word);
  }

  void woke_sleeper(std::atomic<uint32_t>& word) {
    if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
    published_at_.store(clock_ns(), std::memory_order_release);
    wake_all(word);
  }

  // Wait until `word` is no longer `old`: spin within the budget, then sleep until woken.
  uint32_t wait_while(std::atomic<uint32_t>& word, uint32_t old, Spin& spin) {
    int64_t spun_until = 0;  // read the clock only once the wait is not a short one
    for (int i = 1;; ++i) {
      const uint32_t now = word.load(std::memory_order_acquire);
      if (now != old) {
        spin.budget = std::min(spin.most, 2 * spin.budget);
        return now;
      }
      cpu_relax();
      if (i % 16 == 0) {
        const int64_t t = clock_ns();
        if (spun_until == 0) spun_until = t + spin.budget;
        if (t >= spun_until) break;
      }
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    uint32_t now;
    while ((now = word.load(std::memory_order_seq_cst)) == old) {
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      if (sleep_while(word, old) && word.load(std::memory_order_seq_cst) != old &&
          published_at_.load(std::memory_order_acquire) < spun_until) {
        lost_wakes_.fetch_add(1, std::memory_order_relaxed);  // changed, and nobody woke us
      }
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    if (helper_) {
      step_aside();
    } else {
      caller_cpu_.store(current_cpu(), std::memory_order_relaxed);  // a wake-up may have moved it
    }
    // How long after our spin ended the partner published (<= 0: before we slept, or an older
    // publish); within the rest of a full budget (and a margin), spinning would have caught it.
    const int64_t late = published_at_.load(std::memory_order_acquire) - spun_until;
    const bool catchable = late < (spin.most - spin.budget) * 6 / 5;
    spin.budget = catchable ? std::min(spin.most, 2 * spin.budget) : std::max(LEAST_SPIN_NS, spin.budget / 2);
    return now;
  }

  void resize(int n) {
    if (int(helpers_.size()) == n - 1) return;
    stop_.store(true);
    publish(epoch_, epoch_.load(std::memory_order_relaxed) + 1);
    for (auto& t : helpers_) t.join();
    helpers_.clear();
    stop_.store(false);
    const uint32_t now = epoch_.load(std::memory_order_acquire);  // a helper's first task is the next one
    for (int i = 1; i < n; ++i) helpers_.emplace_back([this, i, n, now] { serve(i, n, now); });
  }

  // Where the caller and a helper share a CPU, the helper moves to another of the CPUs it may use,
  // checked when either wakes from a sleep (a wake-up is where the kernel places a thread anew). After
  // a pause the kernel tends to wake one beside its waker, and the two then take turns on one core,
  // each barrier a sleep and a wake-up, while the other core idles: steps of 11 ms instead of 2.1
  // when requests came with pauses between them (docs/engine-notes.md).
  static int current_cpu() {
#if defined(__linux__)
    return sched_getcpu();
#else
    return -1;
#endif
  }

  void step_aside() {
#if defined(__linux__)
    const int mine = current_cpu(), callers = caller_cpu_.load(std::memory_order_relaxed);
    if (mine < 0 || mine != callers) return;
    static thread_local cpu_set_t allowed = [] {
      cpu_set_t set;
      CPU_ZERO(&set);
      sched_getaffinity(0, sizeof(set), &set);
      return set;
    }();
    cpu_set_t others = allowed;
    CPU_CLR(callers, &others);
    if (CPU_COUNT(&others) > 0) sched_setaffinity(0, sizeof(others), &others);
#endif
  }

  void serve(int tid, int n, uint32_t seen) {
    helper_ = true;
    while (true) {
      seen = wait_while(epoch_, seen, idle_spin);
      if (stop_.load()) return;
      (*task_)(tid, n);
      if (running_.fetch_sub(1, std::memory_order_seq_cst) == 1) woke_sleeper(running_);
    }
  }

  static inline thread_local bool helper_ = false;
  std::vector<std::thread> helpers_;
  const std::function<void(int, int)>* task_ = nullptr;
  std::atomic<uint32_t> epoch_{0}, generation_{0}, running_{0};
  std::atomic<int> arrived_{0}, sleepers_{0};
  std::atomic<uint64_t> sleeps_{0}, lost_wakes_{0};
  std::atomic<int64_t> published_at_{0};  // when a sleeper was last woken (steady clock, ns)
  std::atomic<int> caller_cpu_{-1};        // where run()'s caller was when the step began
  std::atomic<bool> stop_{false};
};

// --- the step -------------------------------------------------------------------------------------

struct Layer {
  at::Tensor attn_norm, ffn_norm;
  Matrix wqkv, wo, w_gate_up, w_down;
  at::Tensor k_cache, v_cache;  // model.KVCache's f16 buffers: keys [1, KV, Lpad, D] viewed position-last
};

// What one thread keeps to itself: its copy of the residual stream and of every per-token result.
struct Private {
  std::vector<float> x, tmp, y;
  Act act;
};

class Step {
 public:
  Step(int64_t dim, int64_t n_heads, int64_t n_kv_heads, int64_t ffn_dim, double eps, at::Tensor rope_cos,
       at::Tensor rope_sin, at::Tensor norm, Matrix head, Matrix embed)
      : dim_(dim), heads_(n_heads), kv_heads_(n_kv_heads), ffn_(ffn_dim), eps_(float(eps)),
        rope_cos_(rope_cos.contiguous()), rope_sin_(rope_sin.contiguous()), norm_(norm.contiguous()),
        head_(std::move(head)), embed_(std::move(embed)) {
    TORCH_CHECK(dim % QK == 0 && ffn_dim % QK == 0, "native step: dimensions must be multiples of 32");
    TORCH_CHECK(n_heads % n_kv_heads == 0 && dim == n_heads * HEAD_DIM, "native step: heads of 64 only");
    TORCH_CHECK(rope_cos_.scalar_type() == at::kFloat && rope_cos_.size(1) == HEAD_DIM, "native step: rope tables");
    TORCH_CHECK(head_.cols == dim && embed_.cols == dim && embed_.rows == head_.rows, "native step: head shape");
    max_len_ = rope_cos_.size(0);
  }

  void add_layer(at::Tensor attn_norm, at::Tensor ffn_norm, Matrix wqkv, Matrix wo, Matrix w_gate_up,
                 Matrix w_down, at::Tensor k_cache, at::Tensor v_cache) {
    const int64_t qkv = dim_ + 2 * kv_heads_ * HEAD_DIM;
    TORCH_CHECK(wqkv.rows == qkv && wqkv.cols == dim_ && wo.rows == dim_ && wo.cols == dim_ &&
                    w_gate_up.rows == 2 * ffn_ && w_gate_up.cols == dim_ && w_down.rows == dim_ &&
                    w_down.cols == ffn_,
                "native step: a layer's weights have the wrong shapes");
    TORCH_CHECK(k_cache.scalar_type() == at::kHalf && v_cache.scalar_type() == at::kHalf,
                "native step: the KV cache must be f16");
    TORCH_CHECK(k_cache.size(1) == kv_heads_ && k_cache.size(3) == HEAD_DIM && k_cache.stride(2) == 1 &&
                    k_cache.stride(3) % attention::LANES == 0 && v_cache.stride(3) == 1,
                "native step: keys must be position-last (padded), values position-first");
    TORCH_CHECK(k_cache.size(2) >= max_len_ && v_cache.size(2) >= max_len_, "native step: cache too short");
    layers_.push_back({attn_norm.contiguous(), ffn_norm.contiguous(), std::move(wqkv), std::move(wo),
                       std::move(w_gate_up), std::move(w_down), k_cache, v_cache});
  }

  int64_t weight_bytes() const {
    int64_t n = head_.bytes() + (embed_.codes.is_same(head_.codes) ? 0 : embed_.bytes());
    for (const auto& l : layers_) n += l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes();
    return n;
  }

  // Move every matrix into one block that the kernel may back with 2 MB pages: a step streams all
  // the weights, and on 4 KB pages it ran slower, its two threads waiting for each other more often.
  // Returns the block's bytes and whether madvise(MADV_HUGEPAGE) was taken.
  std::tuple<int64_t, bool> gather_weights() {
    constexpr int64_t HUGE_PAGE = int64_t(2) << 20, ALIGN = 64;
    const auto up = [](int64_t n, int64_t to) { return (n + to - 1) / to * to; };
    const bool tied = embed_.codes.is_same(head_.codes);
    std::vector<Matrix*> all{&head_};
    if (!tied) all.push_back(&embed_);
    for (auto& l : layers_) all.insert(all.end(), {&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down});
    int64_t total = 0;
    for (const Matrix* m : all) total += up(m->codes.nbytes(), ALIGN) + up(m->scales.nbytes(), ALIGN);
    const size_t mapped = size_t(up(total, HUGE_PAGE) + HUGE_PAGE);  // room to start on a 2 MB boundary
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "native step: cannot map ", mapped, " bytes for the weights");
    uint8_t* base = reinterpret_cast<uint8_t*>(up(reinterpret_cast<int64_t>(p), HUGE_PAGE));
    const bool huge = madvise(base, size_t(up(total, HUGE_PAGE)), MADV_HUGEPAGE) == 0;  // before the first touch
    const at::Tensor block = at::from_blob(base, {total}, [p, mapped](void*) { munmap(p, mapped); }, at::kByte);
    int64_t offset = 0;
    const auto move = [&](at::Tensor& t) {
      at::Tensor view = block.narrow(0, offset, t.nbytes());
      std::memcpy(view.data_ptr<uint8_t>(), t.data_ptr(), t.nbytes());
      t = view.view(t.scalar_type());
      offset += up(t.nbytes(), ALIGN);
    };
    for (Matrix* m : all) {
      move(m->codes);
      move(m->scales);
    }
    if (tied) embed_ = head_;
    return {total, huge};
  }

  uint64_t sleeps() const { return pool_.sleeps(); }
  uint64_t lost_wakes() const { return pool_.lost_wakes(); }

  // Feed tokens [T] (int64) at positions start..start+T-1 through the first n_layers layers (all
  // when < 0); logits [T, V] of every position (all_logits) or [1, V] of the last one.
  at::Tensor forward(const at::Tensor& tokens_in, int64_t start, bool all_logits, int64_t n_layers) {
    const at::Tensor tokens = tokens_in.to(at::kLong).contiguous().view(-1);
    const int64_t T = tokens.numel(), end = start + T, vocab = head_.rows;
    TORCH_CHECK(T > 0 && start >= 0 && end <= max_len_, "native step: positions past the cache");
    const int64_t* ids = tokens.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t) TORCH_CHECK(ids[t] >= 0 && ids[t] < vocab, "native step: token id out of range");
    const int64_t L = n_layers < 0 ? int64_t(layers_.size()) : std::min<int64_t>(n_layers, layers_.size());
    const int64_t out_rows = all_logits ? T : 1;
    at::Tensor logits = at::empty({out_rows, vocab}, at::kFloat);

    const int64_t group = heads_ / kv_heads_, kv_dim = kv_heads_ * HEAD_DIM, qkv_dim = dim_ + 2 * kv_dim;
    const int64_t nth = std::max(1, at::get_num_threads());
    // attention tasks: (kv head, tile of query tokens, chunk of positions); partials in task order
    const int64_t tile_tokens = attention::MAX_ROWS / group;
    struct Task {
      int64_t h, t0, tn, chunk, chunks, at;
    };
    std::vector<Task> tasks;
    int64_t partial_rows = 0;
    for (int64_t h = 0; h < kv_heads_; ++h)
      for (int64_t t0 = 0; t0 < T; t0 += tile_tokens) {
        const int64_t tn = std::min(tile_tokens, T - t0), chunks = (start + t0 + tn - 1) / attention::CHUNK + 1;
        for (int64_t c = 0; c < chunks; ++c) tasks.push_back({h, t0, tn, c, chunks, partial_rows + c * group * tn});
        partial_rows += chunks * group * tn;
      }
    qkv_.resize(T * qkv_dim);
    o_.resize(T * dim_);
    gu_.resize(T * 2 * ffn_);
    m_.resize(partial_rows);
    s_.resize(partial_rows);
    acc_.resize(partial_rows * HEAD_DIM);
    private_.resize(nth);
    for (auto& p : private_) {
      p.x.resize(T * dim_);
      p.tmp.resize(std::max(dim_, ffn_));
      p.y.resize(T * dim_);
      p.act.resize(T, std::max(dim_, ffn_));
    }
    float *qkv = qkv_.data(), *o = o_.data(), *gu = gu_.data();
    const float *cos = rope_cos_.data_ptr<float>(), *sin = rope_sin_.data_ptr<float>();

    pool_.run(int(nth), [&](int tid, int n) {
      auto share = [&](int64_t total) {  // this thread's [begin, end) of `total` items
        return std::make_pair(total * tid / n, total * (tid + 1) / n);
      };
      Private& me = private_[tid];
      float *x = me.x.data(), *tmp = me.tmp.data(), *y = me.y.data();
      Act& act = me.act;
      for (int64_t t = 0; t < T; ++t) embed_.dequantize_row(ids[t], x + t * dim_);

      for (int64_t l = 0; l < L; ++l) {
        const Layer& layer = layers_[l];
        act.set_width(dim_);
        for (int64_t t = 0; t < T; ++t) {
          rms_norm(x + t * dim_, layer.attn_norm.data_ptr<float>(), dim_, eps_, tmp);
          act.quantize(t, tmp);
        }
        // Q, K, V split by heads, so that each thread ropes and caches the heads it computed
        const auto [h0, h1] = share(heads_ + 2 * kv_heads_);
        matmul(layer.wqkv, act, T, qkv, qkv_dim, h0 * HEAD_DIM / GROUP, h1 * HEAD_DIM / GROUP);
        auto* kc = static_cast<uint16_t*>(layer.k_cache.data_ptr());
        auto* vc = static_cast<uint16_t*>(layer.v_cache.data_ptr());
        const int64_t ks1 = layer.k_cache.stride(1), ks3 = layer.k_cache.stride(3);
        const int64_t vs1 = layer.v_cache.stride(1), vs2 = layer.v_cache.stride(2);
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t t = 0; t < T; ++t) {
            float* head = qkv + t * qkv_dim + h * HEAD_DIM;
            const int64_t pos = start + t;
            if (h < heads_ + kv_heads_) rope(head, cos + pos * HEAD_DIM, sin + pos * HEAD_DIM);
            if (h >= heads_ + kv_heads_) {
              uint16_t* dst = vc + (h - heads_ - kv_heads_) * vs1 + pos * vs2;
              for (int64_t d = 0; d < HEAD_DIM; ++d) dst[d] = float_to_half(head[d]);
            } else if (h >= heads_) {
              uint16_t* dst = kc + (h - heads_) * ks1 + pos;
              for (int64_t d = 0; d < HEAD_DIM; ++d) dst[d * ks3] = float_to_half(head[d]);
            }
          }
        pool_.barrier();
        // attention: the tasks round-robin over threads (a row's numbers do not depend on who runs it)
        for (size_t i = tid; i < tasks.size(); i += n) {
          const Task& task = tasks[i];
          const int64_t rows = group * task.tn, l0 = task.chunk * attention::CHUNK;
          const int64_t len = std::min(attention::CHUNK, start + task.t0 + task.tn - l0);
          alignas(64) float q_rows[attention::MAX_ROWS * HEAD_DIM];
          int64_t visible[attention::MAX_ROWS];
          for (int64_t g = 0; g < group; ++g)
            for (int64_t i = 0; i < task.tn; ++i) {
              const int64_t r = g * task.tn + i;
              const float* src = qkv + (task.t0 + i) * qkv_dim + (task.h * group + g) * HEAD_DIM;
              for (int64_t d = 0; d < HEAD_DIM; ++d) q_rows[r * HEAD_DIM + d] = src[d] * 0.125f;  // 1/sqrt(64)
              visible[r] = std::clamp<int64_t>(start + task.t0 + i + 1 - l0, 0, len);
            }
          attention::chunk_attention<HEAD_DIM, attention::F16>(
              q_rows, rows, visible, kc + task.h * ks1 + l0, ks3, vc + task.h * vs1 + l0 * vs2, vs2, len,
              m_.data() + task.at, s_.data() + task.at, acc_.data() + task.at * HEAD_DIM);
        }
        pool_.barrier();
        // every thread combines every row into its own y (cheap; saves a barrier), then O
        for (size_t i = 0; i < tasks.size(); ++i) {
          const Task& task = tasks[i];
          if (task.chunk != 0) continue;
          const int64_t rows = group * task.tn;
          for (int64_t g = 0; g < group; ++g)
            for (int64_t j = 0; j < task.tn; ++j) {
              const int64_t at = task.at + g * task.tn + j;
              attention::combine_chunks<HEAD_DIM>(task.chunks, m_.data() + at, s_.data() + at,
                                                  acc_.data() + at * HEAD_DIM, rows,
                                                  y + (task.t0 + j) * dim_ + (task.h * group + g) * HEAD_DIM);
            }
        }
        for (int64_t t = 0; t < T; ++t) act.quantize(t, y + t * dim_);
        {
          const auto [g0, g1] = share(dim_ / GROUP);
          matmul(layer.wo, act, T, o, dim_, g0, g1);
        }
        pool_.barrier();
        for (int64_t t = 0; t < T; ++t) {
          add(x + t * dim_, o + t * dim_, dim_);
          rms_norm(x + t * dim_, layer.ffn_norm.data_ptr<float>(), dim_, eps_, tmp);
          act.quantize(t, tmp);
        }
        {
          const auto [g0, g1] = share(2 * ffn_ / GROUP);
          matmul(layer.w_gate_up, act, T, gu, 2 * ffn_, g0, g1);
        }
        pool_.barrier();
        act.set_width(ffn_);
        for (int64_t t = 0; t < T; ++t) {
          const float* g = gu + t * 2 * ffn_;
          for (int64_t i = 0; i < ffn_; ++i) tmp[i] = g[i] / (1.0f + attention::exp_clamped(-g[i])) * g[ffn_ + i];
          act.quantize(t, tmp);
        }
        {
          const auto [g0, g1] = share(dim_ / GROUP);
          matmul(layer.w_down, act, T, o, dim_, g0, g1);
        }
        pool_.barrier();
        for (int64_t t = 0; t < T; ++t) add(x + t * dim_, o + t * dim_, dim_);
      }

      act.set_width(dim_);
      const int64_t first = T - out_rows;
      for (int64_t t = first; t < T; ++t) {
        rms_norm(x + t * dim_, norm_.data_ptr<float>(), dim_, eps_, tmp);
        act.quantize(t - first, tmp);
      }
      const auto [g0, g1] = share(vocab / GROUP);
      matmul(head_, act, out_rows, logits.data_ptr<float>(), vocab, g0, g1);
    });
    return logits;
  }

 private:
  int64_t dim_, heads_, kv_heads_, ffn_, max_len_;
  float eps_;
  at::Tensor rope_cos_, rope_sin_, norm_;
  Matrix head_, embed_;
  std::vector<Layer> layers_;
  std::vector<float> qkv_, o_, gu_, m_, s_, acc_;
  std::vector<Private> private_;
  Pool pool_;
};

}  // namespace lingcode::step

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace lingcode::step;
  namespace py = pybind11;
  py::class_<Matrix>(m, "Matrix")
      .def_readonly("rows", &Matrix::rows)
      .def_readonly("cols", &Matrix::cols)
      .def_readonly("kind", &Matrix::kind)
      .def("nbytes", &Matrix::bytes)
      .def("matmul", &matmul_op, py::call_guard<py::gil_scoped_release>());
  m.def("repack", &repack, py::arg("path"), py::arg("kind"), py::arg("cols"), py::arg("parts"),
        py::call_guard<py::gil_scoped_release>());
  py::class_<Step>(m, "Step")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, double, at::Tensor, at::Tensor, at::Tensor, Matrix, Matrix>())
      .def("add_layer", &Step::add_layer)
      .def("weight_bytes", &Step::weight_bytes)
      .def("gather_weights", &Step::gather_weights)
      .def("sleeps", &Step::sleeps)
      .def("lost_wakes", &Step::lost_wakes)
      .def("forward", &Step::forward, py::arg("tokens"), py::arg("start"), py::arg("all_logits") = false,
           py::arg("n_layers") = -1, py::call_guard<py::gil_scoped_release>());
  m.def("isa", &isa);
}
