// Products with weights in their GGUF blocks (an XLA FFI handler for CPU programs): no f32
// or int8 copy of a quantized matrix. Built by `python -m radixjax.model.gguf_blocks
// --build` (scripts/setup.sh, -march=native: AVX-512 VNNI); model/gguf_blocks.py loads it
// and says why it exists.
//
//   RadixjaxGgufPack (C): a matrix's rows as the file holds them -> the same bits in tiles
//       (below); RadixjaxGgufPackedBytes says how many bytes.
//   RadixjaxGgufMatmul (FFI): x [M, K] f32, data [bytes] u8, segs [S, 2] s32, attrs
//       rows [S] i64  ->  y [M, N] f32, N = sum(rows). The weight's N rows come in S
//       segments (q | k | v fused, say), segment s packed at byte 64 * segs[s, 0] of data,
//       in GGML type segs[s, 1], rows[s] rows of K values each.
//   RadixjaxGgufRows (FFI): ids [T] s32, data, segs [1, 2]  ->  y [T, K] f32: those rows
//       dequantized (the embedding's gather), the gguf package's numbers bit for bit.
//
// Tiles. 16 rows (one per lane of a 512-bit register of int32) interleave: for each 8
// values of a block, 64 bytes hold the 16 rows' codes as VNNI wants them, byte 4r + j =
// row r's value j (low nibble) and value 4 + j (high nibble); 5- and 6-bit types add
// their high bits in a plane of their own (Q6_K: a byte a lane for two steps), Q8_0
// takes a byte a value (its code + 128).
// After the codes, the block's scales for the 16 rows (f16 d / dmin / min as in the file;
// the K-quants' 6-bit sub-block scales as bytes). Every code is unsigned, so
// w = scale * (code - offset) or w = scale * code + min, per group of 32 values (16 for
// Q6_K). Q4_K and Q5_K tiles are 2.8 % larger than the file's rows (the scales unpacked
// to bytes), the others the same size.
//
// Products. Activations: each 32 values of a row as int8 with an f32 scale (llama.cpp
// takes one per 256 values for K-quants). One instruction multiplies 4 values of one
// activation row (broadcast) by the same 4 values of the tile's 16 rows (vpdpbusd: u8
// codes x s8 activations), so a group's 16 sums are exact integers (the offset taken off
// by starting at -offset * sum(x)), scaled in f32 once a group: per 512 multiply-adds one
// convert, a multiply and an FMA or two, the codes decoded once for up to 8 activation
// rows. Each (row, output) is the same instructions in the same order whatever M, the
// row's place in the batch, or the thread: a row's bits never depend on its batch.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// GGML type ids
enum : int32_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13,
                 Q6_K = 14 };

constexpr int kLanes = 16;  // a tile's rows

// A type's form. Bits: code bits. Unit: values a block (and a tile unit). Group: values a
// scale. Off: w = scale * (code - Off). Min: w = scale * code + min. File: a block's bytes.
template <int Bits, int Unit, int Group, int Off, bool Min, int File> struct Form {
  static constexpr int kBits = Bits, kUnit = Unit, kGroup = Group, kOff = Off, kFile = File;
  static constexpr bool kMin = Min, kK = Unit == 256;
  // a tile unit: codes (low nibbles / bytes), high bits, scales
  static constexpr int kCodes = Bits == 8 ? Unit * 16 : Unit * 8;
  static constexpr int kHigh = Bits == 5 ? Unit * 2 : Bits == 6 ? Unit * 4 : 0;
  static constexpr int kScales = !kK ? 32 + 32 * Min : Bits == 6 ? 32 + 16 * 16 : 64 + 2 * 8 * 16;
  static constexpr int kTileUnit = kCodes + kHigh + kScales;
};

template <int T> struct Type;
template <> struct Type<Q4_0> : Form<4, 32, 32, 8, false, 18> {};
template <> struct Type<Q4_1> : Form<4, 32, 32, 0, true, 20> {};
template <> struct Type<Q5_0> : Form<5, 32, 32, 16, false, 22> {};
template <> struct Type<Q5_1> : Form<5, 32, 32, 0, true, 24> {};
template <> struct Type<Q8_0> : Form<8, 32, 32, 128, false, 34> {};
template <> struct Type<Q4_K> : Form<4, 256, 32, 0, true, 144> {};
template <> struct Type<Q5_K> : Form<5, 256, 32, 0, true, 176> {};
template <> struct Type<Q6_K> : Form<6, 256, 16, 32, false, 210> {};

#define RJ_TYPES(X) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// ---- packing (at load; plain scalar code) ----

struct Block {  // one row's block, unpacked
  uint8_t code[256];
  uint16_t d, dmin;  // f16 bits (dmin: Q4_1 / Q5_1's m too)
  uint8_t sc[16], mn[8];
};

template <int T> void unpack(const uint8_t* b, Block* o);

template <int T> void unpack_legacy(const uint8_t* b, Block* o) {  // Q4_0 Q4_1 Q5_0 Q5_1
  using F = Type<T>;
  o->d = u16(b);
  o->dmin = F::kMin ? u16(b + 2) : 0;
  const int qs = F::kFile - 16;  // the nibbles end the block
  uint32_t qh = 0;
  if (F::kBits == 5) std::memcpy(&qh, b + qs - 4, 4);
  for (int i = 0; i < 32; ++i) {
    const uint8_t nib = i < 16 ? b[qs + i] & 0xF : b[qs + i - 16] >> 4;
    o->code[i] = nib | (((qh >> i) & 1) << 4);
  }
}
template <> void unpack<Q4_0>(const uint8_t* b, Block* o) { unpack_legacy<Q4_0>(b, o); }
template <> void unpack<Q4_1>(const uint8_t* b, Block* o) { unpack_legacy<Q4_1>(b, o); }
template <> void unpack<Q5_0>(const uint8_t* b, Block* o) { unpack_legacy<Q5_0>(b, o); }
template <> void unpack<Q5_1>(const uint8_t* b, Block* o) { unpack_legacy<Q5_1>(b, o); }

template <> void unpack<Q8_0>(const uint8_t* b, Block* o) {
  o->d = u16(b);
  for (int i = 0; i < 32; ++i) o->code[i] = static_cast<uint8_t>(static_cast<int8_t>(b[2 + i]) + 128);
}

template <int T> void unpack_k(const uint8_t* b, Block* o) {  // Q4_K Q5_K
  o->d = u16(b);
  o->dmin = u16(b + 2);
  const uint8_t* s = b + 4;  // 12 bytes: 8 6-bit scales and mins
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      o->sc[j] = s[j] & 63;
      o->mn[j] = s[j + 4] & 63;
    } else {
      o->sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      o->mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
  }
  const uint8_t* qh = b + 16;                    // Q5_K: 32 bytes of high bits
  const uint8_t* qs = b + (T == Q5_K ? 48 : 16);  // 128 bytes of nibbles
  for (int c = 0; c < 4; ++c) {                  // 64 values: sub-blocks 2c, 2c + 1
    for (int l = 0; l < 32; ++l) {
      uint8_t lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
      if (T == Q5_K) {
        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      o->code[64 * c + l] = lo;
      o->code[64 * c + 32 + l] = hi;
    }
  }
}
template <> void unpack<Q4_K>(const uint8_t* b, Block* o) { unpack_k<Q4_K>(b, o); }
template <> void unpack<Q5_K>(const uint8_t* b, Block* o) { unpack_k<Q5_K>(b, o); }

template <> void unpack<Q6_K>(const uint8_t* b, Block* o) {
  // ql [128], qh [64], scales [16] s8, d: value 128h + 32c + l (l < 32) takes ql's nibble
  // and qh's bits 2c, 2c + 1 of half h
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    for (int l = 0; l < 32; ++l) {
      const uint8_t nib[4] = {static_cast<uint8_t>(ql[l] & 0xF), static_cast<uint8_t>(ql[l + 32] & 0xF),
                              static_cast<uint8_t>(ql[l] >> 4), static_cast<uint8_t>(ql[l + 32] >> 4)};
      for (int c = 0; c < 4; ++c) {
        o->code[128 * h + 32 * c + l] = nib[c] | (((qh[l] >> (2 * c)) & 3) << 4);
      }
    }
  }
  std::memcpy(o->sc, b + 192, 16);
  o->d = u16(b + 208);
}

// Where value v of row r lies in a tile unit: byte (of the codes), shift (0 / 4).
struct Spot {
  int step, lane, part;
};
inline Spot spot(int r, int v) { return {v / 8, 4 * r + v % 4, (v % 8) / 4}; }

template <int T> void put(const Block& b, int r, uint8_t* p) {
  using F = Type<T>;
  for (int v = 0; v < F::kUnit; ++v) {
    const Spot s = spot(r, v);
    const uint8_t c = b.code[v];
    if (F::kBits == 8) {
      p[128 * s.step + 64 * s.part + s.lane] = c;
      continue;
    }
    p[64 * s.step + s.lane] |= (c & 0xF) << (4 * s.part);
    uint8_t* hp = p + F::kCodes;
    if (F::kBits == 5) {
      hp[16 * s.step + 8 * s.part + s.lane / 8] |= ((c >> 4) & 1) << (s.lane % 8);
    } else if (F::kBits == 6) {  // steps 2t, 2t + 1 share 64 bytes: lane l's byte
      hp[64 * (s.step / 2) + s.lane] |= ((c >> 4) & 3) << (4 * (s.step % 2) + 2 * s.part);
    }
  }
  uint8_t* S = p + F::kCodes + F::kHigh;
  std::memcpy(S + 2 * r, &b.d, 2);
  if (!F::kK) {
    if (F::kMin) std::memcpy(S + 32 + 2 * r, &b.dmin, 2);
  } else if (F::kBits == 6) {
    for (int g = 0; g < 16; ++g) S[32 + 16 * g + r] = b.sc[g];
  } else {
    std::memcpy(S + 32 + 2 * r, &b.dmin, 2);
    for (int g = 0; g < 8; ++g) {
      S[64 + 16 * g + r] = b.sc[g];
      S[192 + 16 * g + r] = b.mn[g];
    }
  }
}

template <int T> int64_t packed_bytes(int64_t n, int64_t k) {
  return (n + kLanes - 1) / kLanes * (k / Type<T>::kUnit) * Type<T>::kTileUnit;
}

template <int T> void pack_tiles(const uint8_t* src, int64_t n, int64_t k, int64_t t0, int64_t t1,
                                 uint8_t* dst) {
  using F = Type<T>;
  const int64_t units = k / F::kUnit, rb = units * F::kFile;
  Block b;
  for (int64_t t = t0; t < t1; ++t) {
    uint8_t* tile = dst + t * units * F::kTileUnit;
    std::memset(tile, 0, units * F::kTileUnit);  // rows past n: zero scales, zero weights
    for (int r = 0; r < kLanes && t * kLanes + r < n; ++r) {
      for (int64_t u = 0; u < units; ++u) {
        unpack<T>(src + (t * kLanes + r) * rb + u * F::kFile, &b);
        put<T>(b, r, tile + u * F::kTileUnit);
      }
    }
  }
}

template <int T> void pack(const uint8_t* src, int64_t n, int64_t k, uint8_t* dst) {
  const int64_t tiles = (n + kLanes - 1) / kLanes;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), tiles / 64));
  std::vector<std::thread> pool;
  for (int64_t i = 0; i < threads; ++i) {
    pool.emplace_back(pack_tiles<T>, src, n, k, tiles * i / threads, tiles * (i + 1) / threads, dst);
  }
  for (auto& th : pool) th.join();
}

// ---- dequantized rows (the embedding's gather): the gguf package's arithmetic ----

template <int T> int code_at(const uint8_t* p, int r, int v) {
  using F = Type<T>;
  const Spot s = spot(r, v);
  if (F::kBits == 8) return p[128 * s.step + 64 * s.part + s.lane];
  int c = (p[64 * s.step + s.lane] >> (4 * s.part)) & 0xF;
  const uint8_t* hp = p + F::kCodes;
  if (F::kBits == 5) c |= ((hp[16 * s.step + 8 * s.part + s.lane / 8] >> (s.lane % 8)) & 1) << 4;
  if (F::kBits == 6) c |= ((hp[64 * (s.step / 2) + s.lane] >> (4 * (s.step % 2) + 2 * s.part)) & 3) << 4;
  return c;
}

template <int T> void dequant_row(const uint8_t* tile, int r, int64_t k, float* out) {
  using F = Type<T>;
  for (int64_t u = 0; u < k / F::kUnit; ++u) {
    const uint8_t* p = tile + u * F::kTileUnit;
    const uint8_t* S = p + F::kCodes + F::kHigh;
    const float d = h2f(u16(S + 2 * r));
    for (int v = 0; v < F::kUnit; ++v) {
      const int c = code_at<T>(p, r, v);
      float w;
      if (!F::kK) {
        w = F::kMin ? d * static_cast<float>(c) + h2f(u16(S + 32 + 2 * r))
                    : d * static_cast<float>(c - F::kOff);
      } else if (F::kBits == 6) {
        w = (d * static_cast<float>(static_cast<int8_t>(S[32 + 16 * (v / 16) + r]))) *
            static_cast<float>(c - 32);
      } else {
        const float scale = d * static_cast<float>(S[64 + 16 * (v / 32) + r]);
        const float min = -(h2f(u16(S + 32 + 2 * r)) * static_cast<float>(S[192 + 16 * (v / 32) + r]));
        w = scale * static_cast<float>(c) + min;
      }
      out[u * F::kUnit + v] = w;
    }
  }
}

// ---- products ----

// x's rows as the products read them: int8 codes, and per 32 values the scale (amax / 127)
// and scale * sum(codes); per 16 values sum(codes).
struct Act {
  int64_t k, nb;
  std::vector<int8_t> q;    // [m, k]
  std::vector<float> sx, xs;  // [m, nb]
  std::vector<int32_t> sum16;  // [m, 2 nb]

  Act(const float* x, int64_t m, int64_t k_)
      : k(k_), nb(k_ / 32), q(m * k_), sx(m * nb), xs(m * nb), sum16(2 * m * nb) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + r * k + b * 32;
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float amax = std::max(_mm512_reduce_max_ps(_mm512_abs_ps(v0)),
                                    _mm512_reduce_max_ps(_mm512_abs_ps(v1)));
        const float s = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
        const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
        int8_t* qb = q.data() + r * k + b * 32;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtsepi32_epi8(i1));
        const int32_t s0 = _mm512_reduce_add_epi32(i0), s1 = _mm512_reduce_add_epi32(i1);
        sum16[r * 2 * nb + 2 * b] = s0;
        sum16[r * 2 * nb + 2 * b + 1] = s1;
        sx[r * nb + b] = s;
        xs[r * nb + b] = s * static_cast<float>(s0 + s1);
      }
    }
  }
};

// Step s of a tile unit (8 values of 16 rows): lo = values 0-3, hi = 4-7, as u8 codes.
template <int T> inline void codes(const uint8_t* p, int s, __m512i* lo, __m512i* hi) {
  using F = Type<T>;
  if (F::kBits == 8) {
    *lo = _mm512_loadu_si512(p + 128 * s);
    *hi = _mm512_loadu_si512(p + 128 * s + 64);
    return;
  }
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i b = _mm512_loadu_si512(p + 64 * s);
  __m512i l = _mm512_and_si512(b, m4), h = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
  const uint8_t* hp = p + F::kCodes;
  if (F::kBits == 5) {
    uint64_t ml, mh;
    std::memcpy(&ml, hp + 16 * s, 8);
    std::memcpy(&mh, hp + 16 * s + 8, 8);
    l = _mm512_or_si512(l, _mm512_maskz_set1_epi8(ml, 0x10));
    h = _mm512_or_si512(h, _mm512_maskz_set1_epi8(mh, 0x10));
  } else if (F::kBits == 6) {  // byte bits 4t + 0-1: step 2u + t's lo, 4t + 2-3: its hi
    const __m512i hb = _mm512_loadu_si512(hp + 64 * (s / 2));
    const __m512i m30 = _mm512_set1_epi8(0x30);  // (a | (b & c)): ternary logic 0xF8
    if (s % 2 == 0) {
      l = _mm512_ternarylogic_epi32(l, _mm512_slli_epi16(hb, 4), m30, 0xF8);
      h = _mm512_ternarylogic_epi32(h, _mm512_slli_epi16(hb, 2), m30, 0xF8);
    } else {
      l = _mm512_ternarylogic_epi32(l, hb, m30, 0xF8);
      h = _mm512_ternarylogic_epi32(h, _mm512_srli_epi16(hb, 2), m30, 0xF8);
    }
  }
  *lo = l;
  *hi = h;
}

inline __m512 f16x16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 u8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline __m512 s8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Rows m0 .. m0 + MM - 1 of x times one tile (16 outputs, `valid` of them real) -> y.
template <int T, int MM>
void tile_product(const uint8_t* tile, const Act& a, int64_t m0, float* y, int64_t ldy,
                  __mmask16 valid) {
  using F = Type<T>;
  constexpr int kGroups = F::kUnit / F::kGroup, kSteps = F::kGroup / 8;
  constexpr int kLines = (F::kTileUnit + 63) / 64, kAhead = 4;  // units prefetched ahead (measured: 1 2 4)
  __m512 acc[MM];
  for (int i = 0; i < MM; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t u = 0; u < a.k / F::kUnit; ++u) {
    const uint8_t* p = tile + u * F::kTileUnit;
    const uint8_t* S = p + F::kCodes + F::kHigh;
    const __m512 d = f16x16(S);
    __m512 dmin = _mm512_setzero_ps();
    if (F::kK && F::kMin) dmin = _mm512_sub_ps(_mm512_setzero_ps(), f16x16(S + 32));
    for (int g = 0; g < kGroups; ++g) {
      __m512 fw = d, fb = _mm512_setzero_ps();  // w = fw * code + fb (or fw * (code - Off))
      if (!F::kK) {
        if (F::kMin) fb = f16x16(S + 32);
      } else if (F::kBits == 6) {
        fw = _mm512_mul_ps(d, s8x16(S + 32 + 16 * g));
      } else {
        fw = _mm512_mul_ps(d, u8x16(S + 64 + 16 * g));
        fb = _mm512_mul_ps(dmin, u8x16(S + 192 + 16 * g));
      }
      const int64_t v0 = u * F::kUnit + g * F::kGroup;  // the group's first value
      __m512i isum[MM];
      for (int i = 0; i < MM; ++i) {
        const int32_t* s16 = a.sum16.data() + (m0 + i) * 2 * a.nb + v0 / 16;
        const int32_t sum = F::kGroup == 16 ? s16[0] : s16[0] + s16[1];
        isum[i] = _mm512_set1_epi32(-F::kOff * sum);
      }
      for (int s = 0; s < kSteps; ++s) {
        // the unit after next: ~kTileUnit / 64 lines over the unit's kUnit / 8 steps
        const int step = g * kSteps + s;
        for (int l = step * kLines / (F::kUnit / 8); l < (step + 1) * kLines / (F::kUnit / 8); ++l) {
          _mm_prefetch(reinterpret_cast<const char*>(p + kAhead * F::kTileUnit + 64 * l), _MM_HINT_T0);
        }
        __m512i lo, hi;
        codes<T>(p, g * kSteps + s, &lo, &hi);
        for (int i = 0; i < MM; ++i) {
          const int8_t* x = a.q.data() + (m0 + i) * a.k + v0 + 8 * s;
          isum[i] = _mm512_dpbusd_epi32(isum[i], lo, _mm512_set1_epi32(load_i32(x)));
          isum[i] = _mm512_dpbusd_epi32(isum[i], hi, _mm512_set1_epi32(load_i32(x + 4)));
        }
      }
      for (int i = 0; i < MM; ++i) {
        const int64_t b = (m0 + i) * a.nb + v0 / 32;
        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[i]), fw);
        acc[i] = _mm512_fmadd_ps(t, _mm512_set1_ps(a.sx[b]), acc[i]);
        if (F::kMin) acc[i] = _mm512_fmadd_ps(fb, _mm512_set1_ps(a.xs[b]), acc[i]);
      }
    }
  }
  for (int i = 0; i < MM; ++i) _mm512_mask_storeu_ps(y + (m0 + i) * ldy, valid, acc[i]);
}

constexpr int kTile = 8;     // activation rows a tile's codes are decoded for
constexpr int kBlockM = 64;  // activation rows kept hot while a task's tiles pass

struct Segment {
  const uint8_t* data;
  int32_t type;
  int64_t rows, col;  // col: its first output column
};

template <int T>
void product_tiles(const Segment& s, int64_t t0, int64_t t1, const Act& a, int64_t m, float* y,
                   int64_t ldy) {
  using Fn = void (*)(const uint8_t*, const Act&, int64_t, float*, int64_t, __mmask16);
  static constexpr Fn fns[kTile] = {tile_product<T, 1>, tile_product<T, 2>, tile_product<T, 3>,
                                    tile_product<T, 4>, tile_product<T, 5>, tile_product<T, 6>,
                                    tile_product<T, 7>, tile_product<T, 8>};
  const int64_t tile_bytes = a.k / Type<T>::kUnit * Type<T>::kTileUnit;
  for (int64_t mb = 0; mb < m; mb += kBlockM) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t left = s.rows - t * kLanes;
      const __mmask16 valid = left >= kLanes ? 0xFFFF : (1u << left) - 1;
      for (int64_t m0 = mb; m0 < std::min(m, mb + kBlockM); m0 += kTile) {
        const int64_t mm = std::min<int64_t>(kTile, m - m0);
        fns[mm - 1](s.data + t * tile_bytes, a, m0, y + s.col + t * kLanes, ldy, valid);
      }
    }
  }
}

void product_any(const Segment& s, int64_t t0, int64_t t1, const Act& a, int64_t m, float* y,
                 int64_t ldy) {
  switch (s.type) {
#define RJ_CASE(T) case T: return product_tiles<T>(s, t0, t1, a, m, y, ldy);
    RJ_TYPES(RJ_CASE)
#undef RJ_CASE
  }
}

int64_t packed_any(int32_t type, int64_t n, int64_t k) {
  switch (type) {
#define RJ_CASE(T) case T: return k % Type<T>::kUnit ? -1 : packed_bytes<T>(n, k);
    RJ_TYPES(RJ_CASE)
#undef RJ_CASE
  }
  return -1;
}

int64_t file_row_bytes(int32_t type, int64_t k) {
  switch (type) {
#define RJ_CASE(T) case T: return k % Type<T>::kUnit ? -1 : k / Type<T>::kUnit * Type<T>::kFile;
    RJ_TYPES(RJ_CASE)
#undef RJ_CASE
  }
  return -1;
}

constexpr int64_t kTilesPerTask = 8;

// One call's work: runs of kTilesPerTask tiles of each segment, taken by the calling
// thread and XLA's pool threads alike (it outlives the call when a pool task starts late).
struct Work {
  std::vector<Segment> segs;
  std::vector<std::pair<int, int64_t>> tasks;  // (segment, first tile)
  std::atomic<const Act*> act{nullptr};  // set once the activations are quantized
  int64_t m, n;
  float* y;
  std::atomic<int64_t> next{0}, done{0};

  void take() {
    const int64_t count = static_cast<int64_t>(tasks.size());
    while (act.load(std::memory_order_acquire) == nullptr) {  // a helper woken early
      if (next.load(std::memory_order_relaxed) >= count) return;
      _mm_pause();
    }
    for (int64_t i; (i = next.fetch_add(1)) < count;) {
      const Segment& s = segs[tasks[i].first];
      const int64_t t0 = tasks[i].second;
      const int64_t t1 = std::min((s.rows + kLanes - 1) / kLanes, t0 + kTilesPerTask);
      product_any(s, t0, t1, *act.load(std::memory_order_relaxed), m, y, n);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error check_segments(int64_t k, const uint8_t* data, int64_t bytes,
                          ffi::Buffer<ffi::S32>& segs, ffi::Span<const int64_t> rows,
                          std::vector<Segment>* out) {
  auto sd = segs.dimensions();
  if (sd.size() != 2 || sd[1] != 2 || sd[0] != static_cast<int64_t>(rows.size())) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf: segs [S, 2] with S = len(rows)");
  }
  const int32_t* s = segs.typed_data();
  int64_t col = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t type = s[2 * i + 1];
    const int64_t size = packed_any(type, rows[i], k);
    if (size < 0) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        "gguf: no product for GGML type " + std::to_string(type) + " at K = " +
                            std::to_string(k));
    }
    const int64_t off = static_cast<int64_t>(s[2 * i]) * 64;
    if (off < 0 || off + size > bytes) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf: a segment lies past the data");
    }
    out->push_back({data + off, type, rows[i], col});
    col += rows[i];
  }
  return ffi::Error::Success();
}

ffi::Error MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> data,
                      ffi::Buffer<ffi::S32> segs, ffi::Span<const int64_t> rows,
                      ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 2 || yd.size() != 2 || yd[0] != xd[0] || xd[1] % 32) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf_matmul: x [M, K], y [M, N], K % 32 == 0");
  }
  auto work = std::make_shared<Work>();
  work->m = xd[0];
  work->n = yd[1];
  ffi::Error err = check_segments(xd[1], data.typed_data(), data.element_count(), segs, rows,
                                  &work->segs);
  if (err.failure()) return err;
  int64_t total = 0;
  for (size_t i = 0; i < work->segs.size(); ++i) {
    total += work->segs[i].rows;
    for (int64_t t = 0; t * kLanes < work->segs[i].rows; t += kTilesPerTask) {
      work->tasks.emplace_back(static_cast<int>(i), t);
    }
  }
  if (total != work->n) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf_matmul: N != sum(rows)");
  }
  if (work->m == 0 || work->n == 0) return ffi::Error::Success();
  work->y = y->typed_data();
  // Helpers are woken first: a pool thread takes ~30 us to wake, the quantization below
  // runs meanwhile (measured in a decode step of the 1.5B: 13 + 28 us of 98 before)
  const int64_t helpers = std::min<int64_t>(pool.num_threads(),
                                            static_cast<int64_t>(work->tasks.size())) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->take(); });
  Act act(x.typed_data(), work->m, xd[1]);
  work->act.store(&act, std::memory_order_release);
  work->take();
  while (work->done.load(std::memory_order_acquire) < static_cast<int64_t>(work->tasks.size())) {
    std::this_thread::yield();
  }
  return ffi::Error::Success();
}

ffi::Error RowsImpl(ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::U8> data,
                    ffi::Buffer<ffi::S32> segs, ffi::Span<const int64_t> rows,
                    ffi::ResultBuffer<ffi::F32> y) {
  auto yd = y->dimensions();
  if (yd.size() != 2 || yd[0] != static_cast<int64_t>(ids.element_count()) || rows.size() != 1) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf_rows: ids [T], y [T, K], one segment");
  }
  const int64_t k = yd[1];
  std::vector<Segment> s;
  ffi::Error err = check_segments(k, data.typed_data(), data.element_count(), segs, rows, &s);
  if (err.failure()) return err;
  const int32_t* id = ids.typed_data();
  const int64_t tile_bytes = packed_any(s[0].type, kLanes, k);
  for (int64_t t = 0; t < yd[0]; ++t) {
    if (id[t] < 0 || id[t] >= s[0].rows) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf_rows: id out of range");
    }
    const uint8_t* tile = s[0].data + id[t] / kLanes * tile_bytes;
    float* out = y->typed_data() + t * k;
    switch (s[0].type) {
#define RJ_CASE(T) case T: dequant_row<T>(tile, id[t] % kLanes, k, out); break;
      RJ_TYPES(RJ_CASE)
#undef RJ_CASE
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixjaxGgufMatmul, MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<ffi::Span<const int64_t>>("rows")
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixjaxGgufRows, RowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<ffi::Span<const int64_t>>("rows")
                                  .Ret<ffi::Buffer<ffi::F32>>());

extern "C" {

// Bytes of one file row of K values in GGML type `type`; -1 where there is no product.
__attribute__((visibility("default"))) int64_t RadixjaxGgufRowBytes(int32_t type, int64_t k) {
  return file_row_bytes(type, k);
}

// Bytes of n rows of K values packed in tiles; -1 where there is no product.
__attribute__((visibility("default"))) int64_t RadixjaxGgufPackedBytes(int32_t type, int64_t n,
                                                                       int64_t k) {
  return packed_any(type, n, k);
}

// src: n file rows (n * RadixjaxGgufRowBytes bytes) -> dst (RadixjaxGgufPackedBytes bytes).
__attribute__((visibility("default"))) void RadixjaxGgufPack(int32_t type, int64_t n, int64_t k,
                                                             const uint8_t* src, uint8_t* dst) {
  switch (type) {
#define RJ_CASE(T) case T: return pack<T>(src, n, k, dst);
    RJ_TYPES(RJ_CASE)
#undef RJ_CASE
  }
}

}  // extern "C"
