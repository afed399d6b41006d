// GGUF's quantized blocks on the CPU: the native step's block formats, in one place (cpu_step.cpp
// runs the model; this file is how a matrix is stored, and how a matmul reads it).
//
// What a matrix keeps: the file's own codes and scales, never a dense copy. At load each tensor is
// repacked into groups of 16 rows (ggml types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 in blocks of 32 weights,
// Q4_K, Q5_K, Q6_K in super-blocks of 256): for every 32 weights, the 16 rows' codes interleaved 4
// bytes at a time in 64-byte lines, so that one 512-bit vector holds 4 codes of each of 16 rows and
// an integer dot product (vpdpbusd) gives 16 rows' partial sums at once, with no horizontal sums.
// A row's bytes per weight stay the file's (Q4_K 4.625 bits against the file's 4.5: its 6-bit
// scales are kept as bytes). A fused matrix (QKV, gate/up) is a list of parts, each in its own type:
// Q4_K_M files store some V and down projections as Q6_K.
//
// Activations are quantized to int8 as llama.cpp does for each type: per block of 32 (one f32
// scale, ggml's Q8_0/Q8_1) for the 32-weight types, per 256 (ggml's Q8_K: one scale, and sums of
// every 16 codes) for the K types, whose 6/8-bit sub-block scales then multiply integer sums.
//
// Row-exact, which lossless speculation needs: a matmul's output for (row, token) is one fixed chain
// of float operations over the row's blocks, whatever the number of tokens, the tiling and the
// thread that runs it. Integer sums are exact, so every ISA path gives the same bits: AVX-512 (with
// or without VNNI), AVX2 (with or without AVX-VNNI) and portable C++, chosen at build time by the
// machine's flags (-march=native).

#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <tuple>
#include <tuple>
#include <utility>
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

namespace lingcode::blocks {

using attention::half_to_float;
using attention::float_to_half;

constexpr int64_t GROUP = 16;  // rows interleaved together
constexpr int64_t QK = 32;     // weights per block of the 32-weight types, and per K sub-block
constexpr int64_t QKK = 256;   // weights per K super-block

// ggml's type ids (GGMLQuantizationType)
enum Ggml : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

// How a part is packed. P4: Q4_0 (as Q4_1 with m = -8 d), Q4_1; P5: Q5_0 (m = -16 d), Q5_1;
// P8: Q8_0; K4: Q4_K; K5: Q5_K; K6: Q6_K.
enum Pack : int { P4, P5, P8, K4, K5, K6 };

// Per group and block: bytes of codes (64-byte lines) and of meta (scales, mins).
//   P4, P5  meta: d[16] f16, m[16] f16.              codes: 4 nibble lines (+ P5: 1 high-bit line)
//   P8      meta: d[16] f16.                          codes: 8 lines of int8
//   K4, K5  meta: d[16], dmin[16] f16, sc[8][16] u8, mins in pairs [4][16][2] u8.
//           codes: per sub-block of 32, 4 nibble lines (+ K5: 1 high-bit line)
//   K6      meta: d[16] f16, scales in pairs [8][16][2] i8. codes: per sub-block, 4 nibble lines + 2 lines of 2 high bits
// A nibble line l of a 32-weight (sub-)block holds for row r, byte e: code 4l+e in the low nibble,
// code 16+4l+e in the high one. The high-bit line: bit l = bit 4 of code 4l+e, bit 4+l that of
// code 16+4l+e. K6's two lines: bits 2l, 2l+1 = bits 4, 5 of code 4l+e (the first) / 16+4l+e.
struct Layout {
  int64_t block, code_bytes, meta_bytes;
  bool k;
};
inline Layout layout(Pack p) {
  switch (p) {
    case P4: return {QK, 256, 64, false};
    case P5: return {QK, 320, 64, false};
    case P8: return {QK, 512, 32, false};
    case K4: return {QKK, 8 * 256, 320, true};
    case K5: return {QKK, 8 * 320, 320, true};
    case K6: return {QKK, 8 * 384, 288, true};
  }
  return {};
}

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// --- the file's blocks, one row's block at a time ---------------------------------------------------

// A row's block of any type, unpacked: integer codes and the scales that make them weights.
struct Unpacked {
  uint16_t d = 0, m = 0;  // f16: d, and m (32-weight types) or dmin (K4, K5)
  uint8_t sc[16] = {};    // K4/K5: 8 six-bit scales; K6: 16 int8 scales (as bytes)
  uint8_t mins[8] = {};   // K4/K5: 8 six-bit mins
  uint8_t q[QKK] = {};    // codes: P4 0..15, P5 0..31, P8 int8 (as bytes), K4 0..15, K5 0..31, K6 0..63
};

inline Pack pack_of(int64_t type) {
  switch (type) {
    case Q4_0: case Q4_1: return P4;
    case Q5_0: case Q5_1: return P5;
    case Q8_0: return P8;
    case Q4_K: return K4;
    case Q5_K: return K5;
    case Q6_K: return K6;
  }
  TORCH_CHECK(false, "native step: unsupported GGUF type ", type);
}

// Bytes of one block of `type` in the file.
inline int64_t file_block_bytes(int64_t type) {
  switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
  }
  TORCH_CHECK(false, "native step: unsupported GGUF type ", type);
}

// ggml's get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K / Q5_K super-block.
inline void scale_min_k4(int j, const uint8_t* s, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// One block of the file (ggml-common.h's layouts) into `u`.
inline void unpack(int64_t type, const uint8_t* src, Unpacked& u) {
  switch (type) {
    case Q4_0:
    case Q4_1: {
      u.d = load_u16(src);
      u.m = type == Q4_1 ? load_u16(src + 2) : float_to_half(-8.0f * half_to_float(u.d));  // exact: * 2^3
      const uint8_t* qs = src + (type == Q4_1 ? 4 : 2);
      for (int e = 0; e < 16; ++e) u.q[e] = qs[e] & 15, u.q[16 + e] = qs[e] >> 4;
      break;
    }
    case Q5_0:
    case Q5_1: {
      const bool one = type == Q5_1;
      u.d = load_u16(src);
      u.m = one ? load_u16(src + 2) : float_to_half(-16.0f * half_to_float(u.d));  // exact: * 2^4
      const uint32_t qh = uint32_t(load_i32(src + (one ? 4 : 2)));
      const uint8_t* qs = src + (one ? 8 : 6);
      for (int e = 0; e < 16; ++e) {
        u.q[e] = (qs[e] & 15) | (((qh >> e) & 1) << 4);
        u.q[16 + e] = (qs[e] >> 4) | (((qh >> (e + 16)) & 1) << 4);
      }
      break;
    }
    case Q8_0:
      u.d = load_u16(src);
      std::memcpy(u.q, src + 2, QK);
      break;
    case Q4_K:
    case Q5_K: {
      const bool five = type == Q5_K;
      u.d = load_u16(src);
      u.m = load_u16(src + 2);
      const uint8_t* scales = src + 4;
      for (int j = 0; j < 8; ++j) scale_min_k4(j, scales, u.sc[j], u.mins[j]);
      const uint8_t* qh = src + 16;
      const uint8_t* qs = src + (five ? 48 : 16);
      for (int c = 0; c < 4; ++c)  // 64 weights per 32 bytes: low nibbles first, then high
        for (int l = 0; l < 32; ++l) {
          uint8_t lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
          if (five) {
            lo |= ((qh[l] >> (2 * c)) & 1) << 4;
            hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
          }
          u.q[64 * c + l] = lo;
          u.q[64 * c + 32 + l] = hi;
        }
      break;
    }
    case Q6_K: {
      const uint8_t *ql = src, *qh = src + 128;
      std::memcpy(u.sc, src + 192, 16);
      u.d = load_u16(src + 208);
      for (int n = 0; n < 2; ++n)  // 128 weights per 64 bytes of ql and 32 of qh
        for (int l = 0; l < 32; ++l) {
          const uint8_t* a = ql + 64 * n;
          const uint8_t h = qh[32 * n + l];
          u.q[128 * n + l] = (a[l] & 15) | ((h & 3) << 4);
          u.q[128 * n + 32 + l] = (a[l + 32] & 15) | (((h >> 2) & 3) << 4);
          u.q[128 * n + 64 + l] = (a[l] >> 4) | (((h >> 4) & 3) << 4);
          u.q[128 * n + 96 + l] = (a[l + 32] >> 4) | (((h >> 6) & 3) << 4);
        }
      break;
    }
    default:
      TORCH_CHECK(false, "native step: unsupported GGUF type ", type);
  }
}

// One block of the file as weights, as the matmuls weigh them (Matrix::dequantize_row's values).
inline void dequantize_block(int64_t type, const uint8_t* src, float* out) {
  Unpacked u;
  unpack(type, src, u);
  const float d = half_to_float(u.d), m = half_to_float(u.m);
  switch (pack_of(type)) {
    case P4:
    case P5:
      for (int e = 0; e < QK; ++e) out[e] = std::fma(d, float(u.q[e]), m);
      break;
    case P8:
      for (int e = 0; e < QK; ++e) out[e] = d * float(int8_t(u.q[e]));
      break;
    case K4:
    case K5:
      for (int j = 0; j < 8; ++j) {
        const float scale = d * float(u.sc[j]), min = m * float(u.mins[j]);
        for (int e = 0; e < QK; ++e) out[32 * j + e] = std::fma(scale, float(u.q[32 * j + e]), -min);
      }
      break;
    case K6:
      for (int e = 0; e < QKK; ++e) out[e] = d * float(int8_t(u.sc[e / 16])) * float(int(u.q[e]) - 32);
      break;
  }
}

// --- matrices -----------------------------------------------------------------------------------------

// Consecutive rows of a matrix stored in one type, repacked (see Layout): group g's block b has its
// codes at (g * blocks + b) * code_bytes and its meta at (g * blocks + b) * meta_bytes.
struct Part {
  Pack pack = P4;
  int64_t type = 0, group0 = 0, groups = 0, blocks = 0;  // type: the file's; group0: its first group in the matrix
  at::Tensor codes, meta;

  const uint8_t* group_codes(int64_t g) const {
    return codes.data_ptr<uint8_t>() + g * blocks * layout(pack).code_bytes;
  }
  const uint8_t* group_meta(int64_t g) const { return meta.data_ptr<uint8_t>() + g * blocks * layout(pack).meta_bytes; }
  int64_t bytes() const { return codes.nbytes() + meta.nbytes(); }
};

struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<Part> parts;

  bool needs_k() const {  // activations per 256 (Q8_K)
    return std::any_of(parts.begin(), parts.end(), [](const Part& p) { return layout(p.pack).k; });
  }
  bool needs_32() const {  // activations per 32 (Q8_0 / Q8_1)
    return std::any_of(parts.begin(), parts.end(), [](const Part& p) { return !layout(p.pack).k; });
  }
  int64_t bytes() const {
    int64_t n = 0;
    for (const Part& p : parts) n += p.bytes();
    return n;
  }
  std::vector<int64_t> types() const {
    std::vector<int64_t> t;
    for (const Part& p : parts) t.push_back(p.type);
    return t;
  }

  // One row as floats (the token embedding): code times scale, plus min, as the matmuls weigh them.
  void dequantize_row(int64_t row, float* out) const;
};

// Write the unpacked block of row `lane` of a group into the group's block (codes c, meta s).
inline void put_block(Pack pack, const Unpacked& u, int64_t lane, uint8_t* c, uint8_t* s) {
  const auto nibbles = [&](const uint8_t* q, uint8_t* lines) {  // a 32-weight block's 4 nibble lines
    for (int l = 0; l < 4; ++l)
      for (int e = 0; e < 4; ++e) lines[64 * l + 4 * lane + e] = (q[4 * l + e] & 15) | ((q[16 + 4 * l + e] & 15) << 4);
  };
  const auto high_bits = [&](const uint8_t* q, uint8_t* line) {  // bit 4 of each code
    for (int e = 0; e < 4; ++e) {
      uint8_t b = 0;
      for (int l = 0; l < 4; ++l) b |= ((q[4 * l + e] >> 4) & 1) << l | ((q[16 + 4 * l + e] >> 4) & 1) << (4 + l);
      line[4 * lane + e] = b;
    }
  };
  uint16_t* h = reinterpret_cast<uint16_t*>(s);
  switch (pack) {
    case P4:
    case P5:
      h[lane] = u.d;
      h[16 + lane] = u.m;
      nibbles(u.q, c);
      if (pack == P5) high_bits(u.q, c + 256);
      break;
    case P8:
      h[lane] = u.d;
      for (int l = 0; l < 8; ++l) std::memcpy(c + 64 * l + 4 * lane, u.q + 4 * l, 4);
      break;
    case K4:
    case K5: {
      h[lane] = u.d;
      h[16 + lane] = u.m;
      const int64_t sub = pack == K5 ? 320 : 256;
      for (int j = 0; j < 8; ++j) {
        s[64 + 16 * j + lane] = u.sc[j];
        s[192 + 32 * (j / 2) + 2 * lane + j % 2] = u.mins[j];
        nibbles(u.q + 32 * j, c + sub * j);
        if (pack == K5) high_bits(u.q + 32 * j, c + sub * j + 256);
      }
      break;
    }
    case K6:
      h[lane] = u.d;
      for (int k = 0; k < 16; ++k) s[32 + 32 * (k / 2) + 2 * lane + k % 2] = u.sc[k];
      for (int j = 0; j < 8; ++j) {
        const uint8_t* q = u.q + 32 * j;
        uint8_t* lines = c + 384 * j;
        nibbles(q, lines);
        for (int e = 0; e < 4; ++e) {
          uint8_t lo = 0, hi = 0;
          for (int l = 0; l < 4; ++l) {
            lo |= ((q[4 * l + e] >> 4) & 3) << (2 * l);
            hi |= ((q[16 + 4 * l + e] >> 4) & 3) << (2 * l);
          }
          lines[256 + 4 * lane + e] = lo;
          lines[320 + 4 * lane + e] = hi;
        }
      }
      break;
  }
}

// (ggml type, byte offset of the tensor's data in the file, rows, row order or None: row i of the
// part is the file's row order[i])
using PartSpec = std::tuple<int64_t, int64_t, int64_t, std::optional<at::Tensor>>;

// Bytes of a part's repacked codes and meta.
inline std::pair<int64_t, int64_t> part_bytes(int64_t type, int64_t rows, int64_t cols) {
  const Layout lay = layout(pack_of(type));
  const int64_t n = rows / GROUP * (cols / lay.block);
  return {n * lay.code_bytes, n * lay.meta_bytes};
}

// Where a part's codes and meta go: (code bytes, meta bytes) -> two byte tensors.
using Allocate = std::function<std::pair<at::Tensor, at::Tensor>(int64_t, int64_t)>;

inline std::pair<at::Tensor, at::Tensor> allocate_apart(int64_t code_bytes, int64_t meta_bytes) {
  return {at::empty({code_bytes}, at::kByte), at::empty({meta_bytes}, at::kByte)};
}

// The parts stacked in order (fused QKV, gate/up) as one matrix, repacked from `file`.
inline Matrix repack(const uint8_t* file, size_t file_size, int64_t cols, const std::vector<PartSpec>& parts,
                     const Allocate& allocate = allocate_apart) {
  Matrix m;
  m.cols = cols;
  for (const auto& [type, offset, rows, order] : parts) {
    const Pack pack = pack_of(type);
    const Layout lay = layout(pack);
    TORCH_CHECK(cols % lay.block == 0, "native step: ", cols, " columns are not whole blocks of ", lay.block);
    TORCH_CHECK(rows % GROUP == 0, "native step: rows must be a multiple of 16");
    const int64_t nb = cols / lay.block, in_row = nb * file_block_bytes(type);
    TORCH_CHECK(offset >= 0 && size_t(offset + rows * in_row) <= file_size, "native step: tensor past the file's end");
    at::Tensor o;
    if (order) {
      o = order->to(at::kLong).contiguous();
      TORCH_CHECK(o.numel() == rows, "native step: a row order must name every row");
      for (int64_t i = 0; i < rows; ++i) TORCH_CHECK(o.data_ptr<int64_t>()[i] >= 0 && o.data_ptr<int64_t>()[i] < rows,
                                                     "native step: row order out of range");
    }
    Part p;
    p.pack = pack;
    p.type = type;
    p.group0 = m.rows / GROUP;
    p.groups = rows / GROUP;
    p.blocks = nb;
    std::tie(p.codes, p.meta) = allocate(p.groups * nb * lay.code_bytes, p.groups * nb * lay.meta_bytes);
    uint8_t *codes = p.codes.data_ptr<uint8_t>(), *meta = p.meta.data_ptr<uint8_t>();
    const int64_t* rows_from = order ? o.data_ptr<int64_t>() : nullptr;
    const int64_t block_bytes = file_block_bytes(type);
    at::parallel_for(0, p.groups, 1, [&](int64_t g0, int64_t g1) {
      Unpacked u;
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t lane = 0; lane < GROUP; ++lane) {
          const int64_t row = g * GROUP + lane;
          const uint8_t* src = file + offset + (rows_from ? rows_from[row] : row) * in_row;
          for (int64_t b = 0; b < nb; ++b, src += block_bytes)
            put_block(pack, (unpack(type, src, u), u), lane, codes + (g * nb + b) * lay.code_bytes,
                      meta + (g * nb + b) * lay.meta_bytes);
        }
    });
    m.rows += rows;
    m.parts.push_back(std::move(p));
  }
  return m;
}

inline void Matrix::dequantize_row(int64_t row, float* out) const {
  const int64_t g = row / GROUP, lane = row % GROUP;
  const Part* p = &parts[0];
  for (const Part& part : parts)
    if (g >= part.group0 && g < part.group0 + part.groups) p = &part;
  const Layout lay = layout(p->pack);
  const uint8_t *c = p->group_codes(g - p->group0), *s = p->group_meta(g - p->group0);
  const auto nibble = [&](const uint8_t* lines, int64_t e) {  // code e of a 32-weight block's nibble lines
    const uint8_t byte = lines[64 * ((e % 16) / 4) + 4 * lane + e % 4];
    return e < 16 ? byte & 15 : byte >> 4;
  };
  const auto high = [&](const uint8_t* line, int64_t e) {  // bit 4 of code e
    const uint8_t byte = line[4 * lane + e % 4];
    return ((byte >> ((e % 16) / 4 + (e < 16 ? 0 : 4))) & 1) << 4;
  };
  for (int64_t b = 0; b < p->blocks; ++b, c += lay.code_bytes, s += lay.meta_bytes) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(s);
    float* o = out + b * lay.block;
    switch (p->pack) {
      case P4:
      case P5: {
        const float d = half_to_float(h[lane]), m = half_to_float(h[16 + lane]);
        for (int64_t e = 0; e < QK; ++e)
          o[e] = std::fma(d, float(nibble(c, e) | (p->pack == P5 ? high(c + 256, e) : 0)), m);
        break;
      }
      case P8: {
        const float d = half_to_float(h[lane]);
        for (int64_t e = 0; e < QK; ++e) o[e] = d * float(int8_t(c[64 * (e / 4) + 4 * lane + e % 4]));
        break;
      }
      case K4:
      case K5: {
        const float d = half_to_float(h[lane]), dmin = half_to_float(h[16 + lane]);
        const int64_t sub = p->pack == K5 ? 320 : 256;
        for (int64_t j = 0; j < 8; ++j) {
          const float scale = d * float(s[64 + 16 * j + lane]);
          const float min = dmin * float(s[192 + 32 * (j / 2) + 2 * lane + j % 2]);
          const uint8_t* lines = c + sub * j;
          for (int64_t e = 0; e < QK; ++e)
            o[32 * j + e] = std::fma(scale, float(nibble(lines, e) | (p->pack == K5 ? high(lines + 256, e) : 0)), -min);
        }
        break;
      }
      case K6: {
        const float d = half_to_float(h[lane]);
        for (int64_t j = 0; j < 8; ++j) {
          const uint8_t* lines = c + 384 * j;
          for (int64_t e = 0; e < QK; ++e) {
            const uint8_t bits = lines[(e < 16 ? 256 : 320) + 4 * lane + e % 4];
            const int q = nibble(lines, e) | (((bits >> (2 * ((e % 16) / 4))) & 3) << 4);
            o[32 * j + e] = d * float(int8_t(s[32 + 32 * j + 2 * lane + e / 16])) * float(q - 32);
          }
        }
        break;
      }
    }
  }
}

// --- activations --------------------------------------------------------------------------------------

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
    const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packs_epi16(q16, q16));
  }
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
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

// The group of 4 activations i groups after x (the kernels broadcast one group to every row).
inline const int8_t* xg(const int8_t* x, int64_t i) { return x + 4 * i; }

// T tokens' activations [T, k] as int8, in either or both forms:
//   per 32 (for the 32-weight types): q = round(x / d), d = max |x| / 127; kept: d, the sum of q,
//     and d times it (Q4_1's and Q5's min term);
//   per 256 (for the K types): one d per 256; kept: the sum of every 16 codes (k16), and in int16
//     pairs, as vpmaddwd takes them, the sums of every 32 (kpair: the K4/K5 mins) and of every 16
//     (kpair16: K6's -32).
struct Act {
  int64_t k = 0, blocks = 0, super = 0;
  bool has32 = false, has256 = false;
  std::vector<int8_t> q, qk;
  std::vector<float> d, sum, dk;
  std::vector<int32_t> isum, k16, kpair, kpair16;

  void resize(int64_t tokens, int64_t k_max) {
    if (int64_t(q.size()) < tokens * k_max) {
      q.resize(tokens * k_max);
      qk.resize(tokens * k_max);
      d.resize(tokens * k_max / QK);
      sum.resize(tokens * k_max / QK);
      isum.resize(tokens * k_max / QK);
      dk.resize(tokens * k_max / QKK + 1);
      k16.resize(tokens * k_max / 16 + 16);
      kpair.resize(tokens * k_max / 64 + 4);
      kpair16.resize(tokens * k_max / 32 + 8);
    }
  }
  // The width of the next matrix's input, and which forms it needs.
  void set_width(int64_t k_, const Matrix& w) {
    k = k_;
    blocks = k_ / QK;
    super = k_ / QKK;
    has32 = w.needs_32();
    has256 = w.needs_k();
  }
  const int8_t* qt(int64_t t, int64_t b) const { return q.data() + t * k + b * QK; }
  int64_t at(int64_t t, int64_t b) const { return t * blocks + b; }
  const int8_t* qkt(int64_t t, int64_t b) const { return qk.data() + t * k + b * QKK; }
  int64_t atk(int64_t t, int64_t b) const { return t * super + b; }

  void quantize(int64_t t, const float* x) {
    if (has32)
      for (int64_t b = 0; b < blocks; ++b) {
        const float amax = block_amax(x + b * QK);
        const float dq = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const int32_t s = quantize_block(x + b * QK, id, q.data() + t * k + b * QK);
        d[at(t, b)] = dq;
        sum[at(t, b)] = dq * float(s);  // of the quantized values: its error cancels the codes' (Q4_1 mins)
        isum[at(t, b)] = s;
      }
    if (has256)
      for (int64_t b = 0; b < super; ++b) {
        const float* xb = x + b * QKK;
        float amax = 0.0f;
        for (int j = 0; j < 8; ++j) amax = std::max(amax, block_amax(xb + QK * j));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t* out = qk.data() + t * k + b * QKK;
        dk[atk(t, b)] = amax / 127.0f;
        int32_t* s16 = k16.data() + atk(t, b) * 16;
        for (int j = 0; j < 8; ++j) {
          int8_t* sub = out + QK * j;
          quantize_block(xb + QK * j, id, sub);
          for (int half = 0; half < 2; ++half) {
            int32_t sum = 0;
            for (int e = 0; e < 16; ++e) sum += sub[16 * half + e];
            s16[2 * j + half] = sum;
          }
        }
        const auto pair = [](int32_t lo, int32_t hi) {  // two int16 in an int32, as vpmaddwd reads them
          return int32_t(uint32_t(uint16_t(int16_t(lo))) | (uint32_t(uint16_t(int16_t(hi))) << 16));
        };
        for (int p = 0; p < 4; ++p)  // sums of 32 (|s| <= 4064) for the K4/K5 mins
          kpair[atk(t, b) * 4 + p] = pair(s16[4 * p] + s16[4 * p + 1], s16[4 * p + 2] + s16[4 * p + 3]);
        for (int p = 0; p < 8; ++p) kpair16[atk(t, b) * 8 + p] = pair(s16[2 * p], s16[2 * p + 1]);  // K6's
      }
  }
};

// --- vector operations, per ISA -------------------------------------------------------------------------
// V::R rows at a time (a 16-row group in 16 / R passes); B holds R rows' 4 bytes of a line, I their
// int32 sums, F their float results. The kernels below are written once over these.
//
// Dot products of codes (u8) with activations (int8) accumulate in A: with VNNI, vpdpbusd adds them
// to int32 sums directly; without it, vpmaddubsw gives 16-bit sums of pairs, which are added up in
// 16 bits (V::terms<Q>() of them at most, for codes up to Q: no sum can pass 32767) and widened
// once, by vpmaddwd with ones or with the rows' scales (total, total_scaled), where a widening per
// line cost three instructions instead of one. Either way the same exact integers.
// S: the rows' scales as total_scaled takes them (int32 lanes with VNNI, each scale in both 16-bit
// halves of a lane without).

#if LC_ISA_512

struct V {
  static constexpr int R = 16;
  static constexpr int NT = 8;  // tokens per register tile
  using B = __m512i;
  using I = __m512i;
  using A = __m512i;
  using S = __m512i;
  using F = __m512;
#ifdef __AVX512VNNI__
  static constexpr bool VNNI = true;
#else
  static constexpr bool VNNI = false;
#endif
  static constexpr bool S8_BIAS = VNNI;  // dot_s8 takes codes + 128: its sums have 128 * sum(x) too much
  static B line(const uint8_t* p) { return _mm512_load_si512(p); }
  static B lo4(B v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }
  static B hi4(B v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)); }
  template <int SH>
  static B bits(B v, uint8_t mask) {  // (v shifted left by SH, right by -SH) & mask, per byte
    const B s = SH > 0 ? _mm512_slli_epi16(v, SH > 0 ? SH : 0) : SH < 0 ? _mm512_srli_epi16(v, SH < 0 ? -SH : 0) : v;
    return _mm512_and_si512(s, _mm512_set1_epi8(char(mask)));
  }
  static B bor(B a, B b) { return _mm512_or_si512(a, b); }
  static I zero() { return _mm512_setzero_si512(); }
  static A azero() { return _mm512_setzero_si512(); }
  static A dot(A acc, B u8, const int8_t* x) {  // + u8 . x (4 int8 broadcast), per row
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(acc, u8, _mm512_set1_epi32(load_i32(x)));
#else
    return _mm512_add_epi16(acc, _mm512_maddubs_epi16(u8, _mm512_set1_epi32(load_i32(x))));
#endif
  }
  static I total(A acc) { return VNNI ? acc : _mm512_madd_epi16(acc, _mm512_set1_epi16(1)); }
  static void keep(A& acc) { asm("" : "+v"(acc)); }
  static I total_scaled(A acc, S sc) { return VNNI ? _mm512_mullo_epi32(acc, sc) : _mm512_madd_epi16(acc, sc); }
  static S scales_u8(const uint8_t* p) {  // R rows' u8 scales
    const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return VNNI ? s : _mm512_or_si512(s, _mm512_slli_epi32(s, 16));
  }
  static std::pair<S, S> scales_i8_pairs(const uint8_t* p) {  // R rows' (first, second) int8 scales
    const __m512i s = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    if (VNNI) return {_mm512_srai_epi32(_mm512_slli_epi32(s, 16), 16), _mm512_srai_epi32(s, 16)};
    return {_mm512_shufflehi_epi16(_mm512_shufflelo_epi16(s, 0xA0), 0xA0),
            _mm512_shufflehi_epi16(_mm512_shufflelo_epi16(s, 0xF5), 0xF5)};
  }
  static B s8_u(B w) {  // what dot_s8 multiplies: codes + 128 (VNNI) or |codes|
    return VNNI ? _mm512_xor_si512(w, _mm512_set1_epi8(char(0x80))) : _mm512_abs_epi8(w);
  }
  static I dot_s8(I acc, B u, B w, const int8_t* x) {  // + w . x for int8 codes w (u = s8_u(w))
    __m512i xv = _mm512_set1_epi32(load_i32(x));
#ifdef __AVX512VNNI__
    (void)w;
    return _mm512_dpbusd_epi32(acc, u, xv);
#else  // |codes| times x with the codes' signs (16-bit pair sums stay below 2^15)
    xv = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(w), _mm512_setzero_si512(), xv);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, xv), _mm512_set1_epi16(1)));
#endif
  }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I times32(I v) { return _mm512_slli_epi32(v, 5); }
  static I madd_pairs(const uint8_t* p, int32_t pair, bool is_signed = false) {  // R rows' two 8-bit values . two int16
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_madd_epi16(is_signed ? _mm512_cvtepi8_epi16(raw) : _mm512_cvtepu8_epi16(raw), _mm512_set1_epi32(pair));
  }
  static F fzero() { return _mm512_setzero_ps(); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F fset1(float v) { return _mm512_set1_ps(v); }
  static F fmul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
  static F f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};

inline const char* isa() { return V::VNNI ? "avx512-vnni" : "avx512bw"; }

#elif LC_ISA_256

struct V {
  static constexpr int R = 8;
  static constexpr int NT = 8;  // tokens per tile: a line of codes at a time leaves room for 8 sums
  using B = __m256i;
  using I = __m256i;
  using A = __m256i;
  using S = __m256i;
  using F = __m256;
#ifdef __AVXVNNI__
  static constexpr bool VNNI = true;
#else
  static constexpr bool VNNI = false;
#endif
  static constexpr bool S8_BIAS = VNNI;
  static B line(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static B lo4(B v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
  static B hi4(B v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }
  template <int SH>
  static B bits(B v, uint8_t mask) {
    const B s = SH > 0 ? _mm256_slli_epi16(v, SH > 0 ? SH : 0) : SH < 0 ? _mm256_srli_epi16(v, SH < 0 ? -SH : 0) : v;
    return _mm256_and_si256(s, _mm256_set1_epi8(char(mask)));
  }
  static B bor(B a, B b) { return _mm256_or_si256(a, b); }
  static I zero() { return _mm256_setzero_si256(); }
  static A azero() { return _mm256_setzero_si256(); }
  static __m256i xs(const int8_t* x) { return _mm256_set1_epi32(load_i32(x)); }  // one group, to every row
  static A dot(A acc, B u8, const int8_t* x) {
#ifdef __AVXVNNI__
    return _mm256_dpbusd_avx_epi32(acc, u8, xs(x));
#else
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u8, xs(x)));
#endif
  }
  static I total(A acc) { return VNNI ? acc : _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
  static void keep(A& acc) { asm("" : "+x"(acc)); }
  static I total_scaled(A acc, S sc) { return VNNI ? _mm256_mullo_epi32(acc, sc) : _mm256_madd_epi16(acc, sc); }
  static S scales_u8(const uint8_t* p) {
    const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return VNNI ? s : _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
  }
  static std::pair<S, S> scales_i8_pairs(const uint8_t* p) {
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    if (VNNI) return {_mm256_srai_epi32(_mm256_slli_epi32(s, 16), 16), _mm256_srai_epi32(s, 16)};
    return {_mm256_shufflehi_epi16(_mm256_shufflelo_epi16(s, 0xA0), 0xA0),
            _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(s, 0xF5), 0xF5)};
  }
  static B s8_u(B w) { return VNNI ? _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80))) : _mm256_sign_epi8(w, w); }
  static I dot_s8(I acc, B u, B w, const int8_t* x) {
    const __m256i xv = xs(x);
#ifdef __AVXVNNI__
    (void)w;
    return _mm256_dpbusd_avx_epi32(acc, u, xv);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(xv, w)),
                                                   _mm256_set1_epi16(1)));
#endif
  }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  static I times32(I v) { return _mm256_slli_epi32(v, 5); }
  static I madd_pairs(const uint8_t* p, int32_t pair, bool is_signed = false) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_madd_epi16(is_signed ? _mm256_cvtepi8_epi16(raw) : _mm256_cvtepu8_epi16(raw), _mm256_set1_epi32(pair));
  }
  static F fzero() { return _mm256_setzero_ps(); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F fset1(float v) { return _mm256_set1_ps(v); }
  static F fmul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F f16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};

inline const char* isa() { return V::VNNI ? "avx2-vnni" : "avx2"; }

#else  // portable C++: the same operations, lane by lane, in int32 (as VNNI)

struct V {
  static constexpr int R = 16;
  static constexpr int NT = 4;
  static constexpr bool VNNI = true;
  static constexpr bool S8_BIAS = false;
  struct B {
    uint8_t b[4 * R];
  };
  struct I {
    int32_t v[R];
  };
  using A = I;
  using S = I;
  struct F {
    float v[R];
  };
  static B line(const uint8_t* p) {
    B r;
    std::memcpy(r.b, p, sizeof r.b);
    return r;
  }
  static B lo4(B v) {
    for (auto& x : v.b) x &= 15;
    return v;
  }
  static B hi4(B v) {
    for (auto& x : v.b) x >>= 4;
    return v;
  }
  template <int SH>
  static B bits(B v, uint8_t mask) {  // the vector paths shift 16-bit lanes; under these masks, the same
    for (auto& x : v.b) x = uint8_t((SH >= 0 ? x << SH : x >> -SH) & mask);
    return v;
  }
  static B bor(B a, B b) {
    for (int i = 0; i < 4 * R; ++i) a.b[i] |= b.b[i];
    return a;
  }
  static I zero() { return I{}; }
  static A azero() { return I{}; }
  static A dot(A acc, B u8, const int8_t* x) {
    for (int r = 0; r < R; ++r)
      for (int e = 0; e < 4; ++e) acc.v[r] += int32_t(u8.b[4 * r + e]) * x[e];
    return acc;
  }
  static I total(A acc) { return acc; }
  static void keep(A&) {}
  static I total_scaled(A acc, S sc) {
    for (int r = 0; r < R; ++r) acc.v[r] *= sc.v[r];
    return acc;
  }
  static S scales_u8(const uint8_t* p) {
    I a;
    for (int r = 0; r < R; ++r) a.v[r] = p[r];
    return a;
  }
  static std::pair<S, S> scales_i8_pairs(const uint8_t* p) {
    I a, b;
    for (int r = 0; r < R; ++r) a.v[r] = int8_t(p[2 * r]), b.v[r] = int8_t(p[2 * r + 1]);
    return {a, b};
  }
  static B s8_u(B w) { return w; }
  static I dot_s8(I acc, B, B w, const int8_t* x) {
    for (int r = 0; r < R; ++r)
      for (int e = 0; e < 4; ++e) acc.v[r] += int32_t(int8_t(w.b[4 * r + e])) * x[e];
    return acc;
  }
  static I add(I a, I b) {
    for (int r = 0; r < R; ++r) a.v[r] += b.v[r];
    return a;
  }
  static I sub(I a, I b) {
    for (int r = 0; r < R; ++r) a.v[r] -= b.v[r];
    return a;
  }
  static I set1(int32_t x) {
    I a;
    for (auto& v : a.v) v = x;
    return a;
  }
  static I times32(I a) {
    for (auto& v : a.v) v *= 32;
    return a;
  }
  static I madd_pairs(const uint8_t* p, int32_t pair, bool is_signed = false) {
    I a;
    const int32_t lo = int16_t(pair & 0xFFFF), hi = int16_t(uint32_t(pair) >> 16);
    for (int r = 0; r < R; ++r) {
      const int32_t x = is_signed ? int8_t(p[2 * r]) : p[2 * r], y = is_signed ? int8_t(p[2 * r + 1]) : p[2 * r + 1];
      a.v[r] = x * lo + y * hi;
    }
    return a;
  }
  static F fzero() { return F{}; }
  static F cvt(I a) {
    F f;
    for (int r = 0; r < R; ++r) f.v[r] = float(a.v[r]);
    return f;
  }
  static F fset1(float x) {
    F f;
    for (auto& v : f.v) v = x;
    return f;
  }
  static F fmul(F a, F b) {
    for (int r = 0; r < R; ++r) a.v[r] = a.v[r] * b.v[r];
    return a;
  }
  static F fma(F a, F b, F c) {
    for (int r = 0; r < R; ++r) c.v[r] = std::fma(a.v[r], b.v[r], c.v[r]);
    return c;
  }
  static F fnma(F a, F b, F c) {
    for (int r = 0; r < R; ++r) c.v[r] = std::fma(-a.v[r], b.v[r], c.v[r]);
    return c;
  }
  static F f16(const uint8_t* p) {
    F f;
    for (int r = 0; r < R; ++r) f.v[r] = half_to_float(load_u16(p + 2 * r));
    return f;
  }
  static void store(float* p, F v) { std::memcpy(p, v.v, sizeof v.v); }
};

inline const char* isa() { return "portable"; }

#endif

// Reading ahead: a group's codes and meta are each one stream through memory (groups follow each
// other), and a decode step waits on it; prefetching a fixed distance ahead keeps more of it in
// flight than the hardware prefetcher did (docs/engine-notes.md).
constexpr int64_t PREFETCH_AHEAD = 2048;
inline void prefetch(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + PREFETCH_AHEAD + i);
}

// How many 16-bit pair sums of codes up to Q times int8 activations one accumulator may take.
template <int Q>
constexpr int terms() {
  return V::VNNI ? 1 << 20 : 32767 / (2 * Q * 127);
}

// --- matmul kernels: one group's 16 rows x N tokens --------------------------------------------------
// out[t * ldo + lane] = the row's dot product with token t0 + t. The float chain per (row, token):
//   P4/P5  per block: acc = fma(isum, d * dx, acc); acc = fma(m, dx * sum(qx), acc)
//   P8     per block: acc = fma(isum, d * dx, acc)
//   K4/K5  per super-block: acc = fma(S, d * dx, acc); acc = acc - M * (dmin * dx), with the exact
//          integers S = sum_j sc_j * isum_j, M = sum_j m_j * sum(qx)_j
//   K6     per super-block: acc = fma(S - 32 M, d * dx, acc), S = sum_k sc_k * isum_k, M = sum_k sc_k * sum(qx)_k

// Line L of a 32-weight block (its 4 nibble lines at c, and where EXTRA their high bits): R rows'
// u8 codes for activation groups L (lo) and 4 + L (hi).
template <int EXTRA, int L>  // EXTRA 0: none; 1: a line of 5th bits at c + 256; 2: lines of 5th/6th bits at c + 256, + 320
inline void line_codes(const uint8_t* c, int64_t off, V::B& lo, V::B& hi) {
  const V::B v = V::line(c + 64 * L + off);
  lo = V::lo4(v);
  hi = V::hi4(v);
  if constexpr (EXTRA == 1) {
    const V::B h = V::line(c + 256 + off);
    lo = V::bor(lo, V::bits<4 - L>(h, 0x10));
    hi = V::bor(hi, V::bits<-L>(h, 0x10));
  } else if constexpr (EXTRA == 2) {
    lo = V::bor(lo, V::bits<4 - 2 * L>(V::line(c + 256 + off), 0x30));
    hi = V::bor(hi, V::bits<4 - 2 * L>(V::line(c + 320 + off), 0x30));
  }
}

// f(L, lo, hi) for the block's 4 lines in turn, lo[k] and hi[k] the codes of HI consecutive R-row
// slices of the line: one line's codes live at a time, beside the tokens' accumulators (with 16
// registers, holding all 8 code vectors spilled the rest to memory).
template <int EXTRA, int HI, typename Fn, int... L>
inline void each_line(const uint8_t* c, int64_t off, Fn&& f, std::integer_sequence<int, L...>) {
  (
      [&] {
        V::B lo[HI], hi[HI];
        for (int k = 0; k < HI; ++k) line_codes<EXTRA, L>(c, off + 4 * V::R * k, lo[k], hi[k]);
        f(std::integral_constant<int, L>{}, lo, hi);
      }(),
      ...);
}

template <int EXTRA, int HI = 1, typename Fn>
inline void each_line(const uint8_t* c, int64_t off, Fn&& f) {
  each_line<EXTRA, HI>(c, off, f, std::make_integer_sequence<int, 4>{});
}

// V::keep(acc): the sum so far, in a register, here: GCC otherwise hoisted the dot products of a
// block's 4 lines for every token ahead of their additions (summing them as a tree), which held 32
// products at once and spilled them to memory on AVX2's 16 registers.

// Lines whose products one accumulator takes before it is widened: each line adds `per_line` terms.
template <int Q, int PER_LINE>
constexpr int lines_per_total() {
  return terms<Q>() / PER_LINE >= 4 ? 4 : terms<Q>() / PER_LINE;
}

// The 16 rows of a group go in GROUP / V::R passes (H). Each pass runs a block over every token of
// the tile; a block's codes are fetched from memory once, by the first pass.
constexpr int H = GROUP / V::R;

// Passes that run at once (HI of the H): for one token, every pass of a line together, so that each
// line of codes is read whole in one go and its cache misses spread over the block's work, as with
// 16-row registers; more tokens need the registers for their sums.
template <int N>
constexpr int halves_at_once() {
  return N == 1 ? H : 1;
}

template <int N, bool FIVE>
void tile_p45(const Part& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  constexpr int64_t CB = FIVE ? 320 : 256;
  constexpr int EVERY = lines_per_total<FIVE ? 31 : 15, 2>();
  constexpr int HI = halves_at_once<N>();
  V::F acc[H][N];
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < N; ++t) acc[h][t] = V::fzero();
  const uint8_t *c = w.group_codes(g), *s = w.group_meta(g);
  for (int64_t b = 0; b < w.blocks; ++b, c += CB, s += 64) {
    prefetch(c, CB), prefetch(s, 64);
    const int8_t* x[N];
    for (int t = 0; t < N; ++t) x[t] = a.qt(t0 + t, b);
    for (int h0 = 0; h0 < H; h0 += HI) {
      V::A dots[HI][N];
      V::I sum[HI][N];
      for (int k = 0; k < HI; ++k)
        for (int t = 0; t < N; ++t) dots[k][t] = V::azero(), sum[k][t] = V::zero();
      each_line<FIVE ? 1 : 0, HI>(c, 4 * V::R * h0, [&](auto L, const V::B* lo, const V::B* hi) {
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t)
          for (int k = 0; k < HI; ++k) {
            dots[k][t] = V::dot(V::dot(dots[k][t], lo[k], xg(x[t], L)), hi[k], xg(x[t], 4 + L));
            V::keep(dots[k][t]);
          }
        if constexpr ((L + 1) % EVERY == 0) {
#pragma GCC unroll 8
          for (int t = 0; t < N; ++t)
            for (int k = 0; k < HI; ++k) sum[k][t] = V::add(sum[k][t], V::total(dots[k][t])), dots[k][t] = V::azero();
        }
      });
      for (int k = 0; k < HI; ++k) {
        const int h = h0 + k;
        const V::F d = V::f16(s + 2 * V::R * h), m = V::f16(s + 32 + 2 * V::R * h);
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) {
          const int64_t i = a.at(t0 + t, b);
          acc[h][t] = V::fma(V::cvt(sum[k][t]), V::fmul(d, V::fset1(a.d[i])), acc[h][t]);
          acc[h][t] = V::fma(m, V::fset1(a.sum[i]), acc[h][t]);
        }
      }
    }
  }
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < N; ++t) V::store(out + t * ldo + V::R * h, acc[h][t]);
}

template <int N>
void tile_p8(const Part& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  V::F acc[H][N];
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < N; ++t) acc[h][t] = V::fzero();
  const uint8_t *c = w.group_codes(g), *s = w.group_meta(g);
  for (int64_t b = 0; b < w.blocks; ++b, c += 512, s += 32) {
    prefetch(c, 512), prefetch(s, 32);
    for (int h = 0; h < H; ++h) {
      V::I sum[N];
      for (int t = 0; t < N; ++t) sum[t] = V::zero();
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) {
        const V::B codes = V::line(c + 64 * l + 4 * V::R * h), u = V::s8_u(codes);
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) sum[t] = V::dot_s8(sum[t], u, codes, xg(a.qt(t0 + t, b), l));
      }
      const V::F d = V::f16(s + 2 * V::R * h);
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const int64_t i = a.at(t0 + t, b);
        if constexpr (V::S8_BIAS) sum[t] = V::sub(sum[t], V::set1(128 * a.isum[i]));
        acc[h][t] = V::fma(V::cvt(sum[t]), V::fmul(d, V::fset1(a.d[i])), acc[h][t]);
      }
    }
  }
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < N; ++t) V::store(out + t * ldo + V::R * h, acc[h][t]);
}

template <int N, bool FIVE>
void tile_k45(const Part& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  constexpr int64_t SUB = FIVE ? 320 : 256;
  constexpr int EVERY = lines_per_total<FIVE ? 31 : 15, 2>();
  constexpr int HI = halves_at_once<N>();
  V::F acc[H][N];
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < N; ++t) acc[h][t] = V::fzero();
  const uint8_t *c = w.group_codes(g), *s = w.group_meta(g);
  for (int64_t b = 0; b < w.blocks; ++b, c += 8 * SUB, s += 320) {
    prefetch(s, 320);
    const int8_t* x[N];
    for (int t = 0; t < N; ++t) x[t] = a.qkt(t0 + t, b);
    for (int h0 = 0; h0 < H; h0 += HI) {
      V::I S[HI][N];
      for (int k = 0; k < HI; ++k)
        for (int t = 0; t < N; ++t) S[k][t] = V::zero();
      for (int j = 0; j < 8; ++j) {
        if (h0 == 0) prefetch(c + SUB * j, SUB);
        V::S sc[HI];
        for (int k = 0; k < HI; ++k) sc[k] = V::scales_u8(s + 64 + 16 * j + V::R * (h0 + k));
        V::A dots[HI][N];
        for (int k = 0; k < HI; ++k)
          for (int t = 0; t < N; ++t) dots[k][t] = V::azero();
        each_line<FIVE ? 1 : 0, HI>(c + SUB * j, 4 * V::R * h0, [&](auto L, const V::B* lo, const V::B* hi) {
#pragma GCC unroll 8
          for (int t = 0; t < N; ++t)
            for (int k = 0; k < HI; ++k) {
              dots[k][t] = V::dot(V::dot(dots[k][t], lo[k], xg(x[t], 8 * j + L)), hi[k], xg(x[t], 8 * j + 4 + L));
              V::keep(dots[k][t]);
            }
          if constexpr ((L + 1) % EVERY == 0) {
#pragma GCC unroll 8
            for (int t = 0; t < N; ++t)
              for (int k = 0; k < HI; ++k) S[k][t] = V::add(S[k][t], V::total_scaled(dots[k][t], sc[k])), dots[k][t] = V::azero();
          }
        });
      }
      for (int k = 0; k < HI; ++k) {
        const int h = h0 + k;
        const V::F d = V::f16(s + 2 * V::R * h), dmin = V::f16(s + 32 + 2 * V::R * h);
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) {
          const int64_t i = a.atk(t0 + t, b);
          const int32_t* pairs = a.kpair.data() + 4 * i;
          V::I M = V::madd_pairs(s + 192 + 2 * V::R * h, pairs[0]);
#pragma GCC unroll 4
          for (int p = 1; p < 4; ++p) M = V::add(M, V::madd_pairs(s + 192 + 32 * p + 2 * V::R * h, pairs[p]));
          const V::F dx = V::fset1(a.dk[i]);
          acc[h][t] = V::fma(V::cvt(S[k][t]), V::fmul(d, dx), acc[h][t]);
          acc[h][t] = V::fnma(V::cvt(M), V::fmul(dmin, dx), acc[h][t]);
        }
      }
    }
  }
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < N; ++t) V::store(out + t * ldo + V::R * h, acc[h][t]);
}

template <int N>
void tile_k6(const Part& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  constexpr int EVERY = lines_per_total<63, 1>();  // lo and hi have scales of their own: a term a line each
  constexpr int HI = halves_at_once<N>();
  V::F acc[H][N];
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < N; ++t) acc[h][t] = V::fzero();
  const uint8_t *c = w.group_codes(g), *s = w.group_meta(g);
  for (int64_t b = 0; b < w.blocks; ++b, c += 8 * 384, s += 288) {
    prefetch(s, 288);
    const int8_t* x[N];
    for (int t = 0; t < N; ++t) x[t] = a.qkt(t0 + t, b);
    for (int h0 = 0; h0 < H; h0 += HI) {
      V::I S[HI][N];
      for (int k = 0; k < HI; ++k)
        for (int t = 0; t < N; ++t) S[k][t] = V::zero();
      for (int j = 0; j < 8; ++j) {
        if (h0 == 0) prefetch(c + 384 * j, 384);
        V::S sc_lo[HI], sc_hi[HI];
        for (int k = 0; k < HI; ++k) std::tie(sc_lo[k], sc_hi[k]) = V::scales_i8_pairs(s + 32 + 32 * j + 2 * V::R * (h0 + k));
        V::A dots_lo[HI][N], dots_hi[HI][N];
        for (int k = 0; k < HI; ++k)
          for (int t = 0; t < N; ++t) dots_lo[k][t] = dots_hi[k][t] = V::azero();
        each_line<2, HI>(c + 384 * j, 4 * V::R * h0, [&](auto L, const V::B* lo, const V::B* hi) {
#pragma GCC unroll 8
          for (int t = 0; t < N; ++t)
            for (int k = 0; k < HI; ++k) {
              dots_lo[k][t] = V::dot(dots_lo[k][t], lo[k], xg(x[t], 8 * j + L));
              dots_hi[k][t] = V::dot(dots_hi[k][t], hi[k], xg(x[t], 8 * j + 4 + L));
            }
          if constexpr ((L + 1) % EVERY == 0) {
#pragma GCC unroll 8
            for (int t = 0; t < N; ++t)
              for (int k = 0; k < HI; ++k) {
                S[k][t] = V::add(S[k][t], V::add(V::total_scaled(dots_lo[k][t], sc_lo[k]), V::total_scaled(dots_hi[k][t], sc_hi[k])));
                dots_lo[k][t] = dots_hi[k][t] = V::azero();
              }
          }
        });
      }
      for (int k = 0; k < HI; ++k) {
        const int h = h0 + k;
        const V::F d = V::f16(s + 2 * V::R * h);
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) {
          const int64_t i = a.atk(t0 + t, b);
          const int32_t* pairs = a.kpair16.data() + 8 * i;  // sums of 16 in int16 pairs
          V::I M = V::madd_pairs(s + 32 + 2 * V::R * h, pairs[0], true);
#pragma GCC unroll 8
          for (int p = 1; p < 8; ++p) M = V::add(M, V::madd_pairs(s + 32 + 32 * p + 2 * V::R * h, pairs[p], true));
          acc[h][t] = V::fma(V::cvt(V::sub(S[k][t], V::times32(M))), V::fmul(d, V::fset1(a.dk[i])), acc[h][t]);
        }
      }
    }
  }
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < N; ++t) V::store(out + t * ldo + V::R * h, acc[h][t]);
}

template <int N>
void tile(const Part& w, int64_t g, const Act& a, int64_t t0, float* out, int64_t ldo) {
  switch (w.pack) {
    case P4: return tile_p45<N, false>(w, g, a, t0, out, ldo);
    case P5: return tile_p45<N, true>(w, g, a, t0, out, ldo);
    case P8: return tile_p8<N>(w, g, a, t0, out, ldo);
    case K4: return tile_k45<N, false>(w, g, a, t0, out, ldo);
    case K5: return tile_k45<N, true>(w, g, a, t0, out, ldo);
    case K6: return tile_k6<N>(w, g, a, t0, out, ldo);
  }
}

// out[t * ldo + row] for the rows of groups [g0, g1) and tokens [0, tokens): the tokens in tiles of
// V::NT (then one tile of the rest), each group's weights read once per tile.
inline void matmul(const Matrix& w, const Act& a, int64_t tokens, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  for (const Part& p : w.parts) {
    const int64_t first = std::max(g0, p.group0), last = std::min(g1, p.group0 + p.groups);
    for (int64_t g = first; g < last; ++g)
      for (int64_t t0 = 0; t0 < tokens; t0 += V::NT) {
        float* o = out + t0 * ldo + g * GROUP;
        attention::with_rows<V::NT>(std::min<int64_t>(V::NT, tokens - t0),
                                    [&](auto n) { tile<n>(p, g - p.group0, a, t0, o, ldo); });
      }
  }
}

}  // namespace lingcode::blocks
