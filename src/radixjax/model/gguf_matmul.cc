// Products with weights in their GGUF blocks (an XLA FFI handler for CPU programs), the
// blocks read where they lie: no f32 or int8 copy of a quantized matrix. Built by
// `python -m radixjax.model.gguf_blocks --build` (scripts/setup.sh, -march=native: AVX-512
// VNNI); model/gguf_blocks.py loads it and says why it exists.
//
//   RadixjaxGgufMatmul (FFI): x [M, K] f32, data [bytes] u8, segs [S, 2] s32, attrs
//       rows [S] i64  ->  y [M, N] f32, N = sum(rows). The weight's N rows come in S
//       segments (q | k | v fused, say), segment s at byte 64 * segs[s, 0] of data, in
//       GGML type segs[s, 1], rows[s] rows of K values each (row-major blocks).
//   RadixjaxGgufRows (FFI): ids [T] s32, data, segs [1, 2]  ->  y [T, K] f32: those rows
//       dequantized (the embedding's gather), the gguf package's numbers bit for bit.
//
// Activations: each 32 values of a row as int8 with an f32 scale (amax / 127; llama.cpp
// takes one scale per 256 values for K-quants), so a product is, per 32 or 16 weights,
// an exact integer sum (VNNI: u8 weights x s8 activations) scaled in f32. Every row's
// result comes from the same instructions in the same order whatever M, the row's place
// in the batch, or the thread that ran it: a row's bits never depend on its batch.
//
// Weights decode a unit at a time (64 values of the legacy types, a 256-value block of the
// K-quants) into registers of 64 signed codes with a per-lane f32 scale (lane l holds
// values 4l..4l+3): w = scale * q, plus a min per 32 values for Q4_1, Q5_1, Q4_K, Q5_K.
// The activations enter as u8 (code + 128); each chunk's lane sums of its weights take
// the 128 back off (computed once per chunk, shared by every row of the batch).

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// GGML type ids
enum : int32_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13,
                 Q6_K = 14 };

struct Chunk {  // 64 weights: w = scale * q (+ the unit's min)
  __m512i q;      // signed codes (the type's offset taken off)
  __m512 scale;   // per lane (4 values)
};

struct Unit {  // what a row's products step by: 64 values (legacy types), 256 (K-quants)
  Chunk c[4];
  __m256 min;  // per 32 values (types with a min; legacy units use the first two)
};

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m512i nibbles2(const uint8_t* a, const uint8_t* b) {
  // two 32-blocks' 16 bytes each -> [lo(a) hi(a) lo(b) hi(b)] (16 codes each)
  const __m256i v = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)),
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(v, m);                         // [lo a | lo b]
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);   // [hi a | hi b]
  const __m512i cat = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), cat);
}

inline __m512i nibbles32(const uint8_t* p) {  // 32 bytes -> [lo(32) hi(32)]
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i m = _mm256_set1_epi8(0x0F);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m)),
                            _mm256_and_si256(_mm256_srli_epi16(v, 4), m), 1);
}

inline __m512 halves(float a, float b) {  // lanes 0-7 a, 8-15 b
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

inline float sum8(__m256 x) {  // in a fixed order
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

inline __m256 negated(__m256 x) { return _mm256_xor_ps(x, _mm256_set1_ps(-0.f)); }

inline __m256 bytes_as_floats(uint32_t lo, uint32_t hi) {  // 8 u8 -> 8 f32
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, hi, lo)));
}

// Each type: block bytes and values, unit values, whether it has a min, and
// decode(row, unit, tail, out): tail = only the first 32 of a legacy unit's 64 values
// exist (K % 64 == 32; the rest decode as zero codes with zero scales).
template <int T> struct Type;

template <int T, int Bytes, int Qs, int Off> struct Legacy {  // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
  static constexpr int kBytes = Bytes, kValues = 32, kUnit = 64, kChunks = 1;
  static constexpr bool kMin = T == Q4_1 || T == Q5_1;
  static void decode(const uint8_t* row, int64_t u, bool tail, Unit* out) {
    static const uint8_t zeros[Bytes] = {};
    const uint8_t* a = row + 2 * u * kBytes;
    const uint8_t* b = tail ? zeros : a + kBytes;
    __m512i q;
    if (T == Q8_0) {
      q = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 1);
    } else {
      q = nibbles2(a + Qs, b + Qs);
    }
    if (T == Q5_0 || T == Q5_1) {
      uint32_t ha, hb;
      const int h = T == Q5_0 ? 2 : 4;
      std::memcpy(&ha, a + h, 4);
      std::memcpy(&hb, b + h, 4);
      const __mmask64 bits = static_cast<uint64_t>(ha) | (static_cast<uint64_t>(hb) << 32);
      q = _mm512_or_si512(q, _mm512_maskz_set1_epi8(bits, 0x10));
    }
    if (Off) q = _mm512_sub_epi8(q, _mm512_set1_epi8(Off));
    if (tail) q = _mm512_maskz_mov_epi8(0xFFFFFFFFull, q);
    out->c[0] = {q, halves(h2f(a), tail ? 0.f : h2f(b))};
    out->min = kMin ? _mm256_setr_ps(h2f(a + 2), tail ? 0.f : h2f(b + 2), 0, 0, 0, 0, 0, 0)
                    : _mm256_setzero_ps();
  }
};
template <> struct Type<Q4_0> : Legacy<Q4_0, 18, 2, 8> {};
template <> struct Type<Q4_1> : Legacy<Q4_1, 20, 4, 0> {};
template <> struct Type<Q5_0> : Legacy<Q5_0, 22, 6, 16> {};
template <> struct Type<Q5_1> : Legacy<Q5_1, 24, 8, 0> {};
template <> struct Type<Q8_0> : Legacy<Q8_0, 34, 2, 0> {};

template <int T, int Bytes, int Qs> struct KQuant {  // Q4_K / Q5_K
  static constexpr int kBytes = Bytes, kValues = 256, kUnit = 256, kChunks = 4;
  static constexpr bool kMin = true;
  static void decode(const uint8_t* row, int64_t u, bool, Unit* out) {
    const uint8_t* b = row + u * kBytes;
    uint32_t w[3];  // 6-bit scales and mins of the 8 sub-blocks
    std::memcpy(w, b + 4, 12);
    const uint32_t sc_lo = w[0] & 0x3f3f3f3f, m_lo = w[1] & 0x3f3f3f3f;
    const uint32_t sc_hi = (w[2] & 0x0f0f0f0f) | ((w[0] >> 2) & 0x30303030);
    const uint32_t m_hi = ((w[2] >> 4) & 0x0f0f0f0f) | ((w[1] >> 2) & 0x30303030);
    const __m256 sc = _mm256_mul_ps(_mm256_set1_ps(h2f(b)), bytes_as_floats(sc_lo, sc_hi));
    out->min = negated(_mm256_mul_ps(_mm256_set1_ps(h2f(b + 2)), bytes_as_floats(m_lo, m_hi)));
    const __m512 sc16 = _mm512_castps256_ps512(sc);
    __m256i qh;
    if (T == Q5_K) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    for (int j = 0; j < 4; ++j) {
      __m512i q = nibbles32(b + Qs + 32 * j);
      if (T == Q5_K) {
        const uint64_t lo = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(1 << (2 * j)));
        const uint64_t hi = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(1 << (2 * j + 1)));
        q = _mm512_or_si512(q, _mm512_maskz_set1_epi8(lo | (hi << 32), 0x10));
      }
      const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(2 * j),
                                             _mm256_set1_epi32(2 * j + 1), 1);
      out->c[j] = {q, _mm512_permutexvar_ps(idx, sc16)};
    }
  }
};
template <> struct Type<Q4_K> : KQuant<Q4_K, 144, 16> {};
template <> struct Type<Q5_K> : KQuant<Q5_K, 176, 48> {};

template <> struct Type<Q6_K> {
  static constexpr int kBytes = 210, kValues = 256, kUnit = 256, kChunks = 4;
  static constexpr bool kMin = false;
  static void decode(const uint8_t* row, int64_t u, bool, Unit* out) {
    const uint8_t* b = row + u * kBytes;
    const __m512 sc16 = _mm512_mul_ps(
        _mm512_set1_ps(h2f(b + 208)),
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)))));  // d * scale[g]
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      for (int s = 0; s < 2; ++s) {
        const __m512i low = s ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4)
                              : _mm512_and_si512(ql, m4);
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 4 * s), m3);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 4 * s + 2), m3);
        const __m512i high = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
        const __m512i q = _mm512_sub_epi8(_mm512_or_si512(low, _mm512_slli_epi16(high, 4)),
                                          _mm512_set1_epi8(32));
        const int j = 2 * h + s;  // groups 4j..4j+3 of 16 values
        out->c[j] = {q, _mm512_permutexvar_ps(
                            _mm512_add_epi32(quarter, _mm512_set1_epi32(4 * j)), sc16)};
      }
    }
    out->min = _mm256_setzero_ps();
  }
};

int64_t row_bytes(int32_t type, int64_t k) {
  switch (type) {
#define RJ_CASE(T) case T: return k / Type<T>::kValues * Type<T>::kBytes;
    RJ_CASE(Q4_0) RJ_CASE(Q4_1) RJ_CASE(Q5_0) RJ_CASE(Q5_1) RJ_CASE(Q8_0)
    RJ_CASE(Q4_K) RJ_CASE(Q5_K) RJ_CASE(Q6_K)
#undef RJ_CASE
  }
  return -1;
}

int32_t block_values(int32_t type) {
  return type == Q4_K || type == Q5_K || type == Q6_K ? 256 : 32;
}

// x's rows as the products read them (K padded to a multiple of 256): the codes plus 128
// (u8: VNNI multiplies u8 by s8; each chunk's weight sums take the 128 back off), per
// lane (4 values) the 32 values' scale, and per 32 values scale * sum of codes (for a
// type's min; 8 spare at each row's end).
struct Act {
  int64_t kp, sxs;
  std::vector<uint8_t> q;
  std::vector<float> scale, sx;

  Act(const float* x, int64_t m, int64_t k)
      : kp((k + 255) / 256 * 256), sxs(kp / 32 + 8), q(m * kp, 128), scale(m * kp / 4, 0.f),
        sx(m * sxs, 0.f) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < k / 32; ++b) {
        const float* xb = x + r * k + b * 32;
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float amax = std::max(_mm512_reduce_max_ps(_mm512_abs_ps(v0)),
                                    _mm512_reduce_max_ps(_mm512_abs_ps(v1)));
        const float s = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
        const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
        const __m512i c = _mm512_set1_epi32(128);
        uint8_t* qb = q.data() + r * kp + b * 32;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb),
                         _mm512_cvtusepi32_epi8(_mm512_add_epi32(i0, c)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16),
                         _mm512_cvtusepi32_epi8(_mm512_add_epi32(i1, c)));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        for (int l = 0; l < 8; ++l) scale[(r * kp + b * 32) / 4 + l] = s;
        sx[r * sxs + b] = s * static_cast<float>(sum);
      }
    }
  }
};

template <int T, int MM>
void dot_tile(const uint8_t* row, int64_t k, const Act& a, int64_t m0, float* y,
              int64_t ldy) {
  using D = Type<T>;
  __m512 acc[MM];
  __m256 macc[MM];
  for (int i = 0; i < MM; ++i) {
    acc[i] = _mm512_setzero_ps();
    macc[i] = _mm256_setzero_ps();
  }
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t units = (k + D::kUnit - 1) / D::kUnit;
  Unit w;
  __m512i init[4];
  for (int64_t u = 0; u < units; ++u) {
    D::decode(row, u, D::kUnit * u + 32 == k, &w);
    for (int j = 0; j < D::kChunks; ++j) {  // -128 * (each lane's weight sum)
      init[j] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w.c[j].q));
    }
    for (int i = 0; i < MM; ++i) {
      const int64_t r = m0 + i, at = r * a.kp + u * D::kUnit;
      for (int j = 0; j < D::kChunks; ++j) {
        const __m512i x = _mm512_loadu_si512(a.q.data() + at + 64 * j);
        const __m512i isum = _mm512_dpbusd_epi32(init[j], x, w.c[j].q);
        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), w.c[j].scale);
        acc[i] = _mm512_fmadd_ps(t, _mm512_loadu_ps(a.scale.data() + at / 4 + 16 * j), acc[i]);
      }
      if (D::kMin) {
        const __m256 sx = _mm256_loadu_ps(a.sx.data() + r * a.sxs + u * D::kUnit / 32);
        macc[i] = _mm256_fmadd_ps(w.min, sx, macc[i]);
      }
    }
  }
  for (int i = 0; i < MM; ++i) {
    float v = _mm512_reduce_add_ps(acc[i]);
    if (D::kMin) v += sum8(macc[i]);
    y[(m0 + i) * ldy] = v;
  }
}

constexpr int kTile = 8;

template <int T>
void dot_rows(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, int64_t k,
              const Act& a, int64_t m, float* y, int64_t ldy) {
  using Fn = void (*)(const uint8_t*, int64_t, const Act&, int64_t, float*, int64_t);
  static constexpr Fn tiles[kTile] = {dot_tile<T, 1>, dot_tile<T, 2>, dot_tile<T, 3>,
                                      dot_tile<T, 4>, dot_tile<T, 5>, dot_tile<T, 6>,
                                      dot_tile<T, 7>, dot_tile<T, 8>};
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m0 = 0; m0 < m; m0 += kTile) {
      const int64_t mm = std::min<int64_t>(kTile, m - m0);
      tiles[mm - 1](w + n * rb, k, a, m0, y + n, ldy);
    }
  }
}

void dot_any(int32_t type, const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, int64_t k,
             const Act& a, int64_t m, float* y, int64_t ldy) {
  switch (type) {
#define RJ_CASE(T) case T: return dot_rows<T>(w, rb, n0, n1, k, a, m, y, ldy);
    RJ_CASE(Q4_0) RJ_CASE(Q4_1) RJ_CASE(Q5_0) RJ_CASE(Q5_1) RJ_CASE(Q8_0)
    RJ_CASE(Q4_K) RJ_CASE(Q5_K) RJ_CASE(Q6_K)
#undef RJ_CASE
  }
}

template <int T>
void dequant_row(const uint8_t* row, int64_t k, float* out) {
  using D = Type<T>;
  alignas(64) float mins[8];
  Unit w;
  for (int64_t u = 0; u < (k + D::kUnit - 1) / D::kUnit; ++u) {
    const bool tail = D::kUnit * u + 32 == k;
    D::decode(row, u, tail, &w);
    _mm256_store_ps(mins, w.min);
    for (int j = 0; j < D::kChunks; ++j) {
      alignas(64) int8_t q[64];
      alignas(64) float scale[16];
      _mm512_store_si512(q, w.c[j].q);
      _mm512_store_ps(scale, w.c[j].scale);
      for (int e = 0; e < (tail ? 32 : 64); ++e) {
        float v = scale[e / 4] * static_cast<float>(q[e]);
        if (D::kMin) v = v + mins[(64 * j + e) / 32];
        out[D::kUnit * u + 64 * j + e] = v;
      }
    }
  }
}

void dequant_any(int32_t type, const uint8_t* row, int64_t k, float* out) {
  switch (type) {
#define RJ_CASE(T) case T: return dequant_row<T>(row, k, out);
    RJ_CASE(Q4_0) RJ_CASE(Q4_1) RJ_CASE(Q5_0) RJ_CASE(Q5_1) RJ_CASE(Q8_0)
    RJ_CASE(Q4_K) RJ_CASE(Q5_K) RJ_CASE(Q6_K)
#undef RJ_CASE
  }
}

struct Segment {
  const uint8_t* data;
  int32_t type;
  int64_t rows, row_bytes, col;  // col: its first output column
};

constexpr int64_t kRowsPerTask = 32;

// One call's work: chunks of kRowsPerTask rows of each segment, taken by the calling
// thread and XLA's pool threads alike (it outlives the call when a pool task starts late).
struct Work {
  std::vector<Segment> segs;
  std::vector<std::pair<int, int64_t>> tasks;  // (segment, first row)
  const Act* act;
  int64_t m, k, n;
  float* y;
  std::atomic<int64_t> next{0}, done{0};

  void take() {
    for (int64_t i; (i = next.fetch_add(1)) < static_cast<int64_t>(tasks.size());) {
      const Segment& s = segs[tasks[i].first];
      const int64_t r0 = tasks[i].second, r1 = std::min(s.rows, r0 + kRowsPerTask);
      dot_any(s.type, s.data, s.row_bytes, r0, r1, k, *act, m, y + s.col, n);
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
    const int64_t rb = row_bytes(type, k);
    if (rb < 0 || k % block_values(type) != 0 || k % 32 != 0) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        "gguf: no product for GGML type " + std::to_string(type) + " at K = " +
                            std::to_string(k));
    }
    const int64_t off = static_cast<int64_t>(s[2 * i]) * 64;
    if (off < 0 || off + rows[i] * rb > bytes) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf: a segment lies past the data");
    }
    out->push_back({data + off, type, rows[i], rb, col});
    col += rows[i];
  }
  return ffi::Error::Success();
}

ffi::Error MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> data,
                      ffi::Buffer<ffi::S32> segs, ffi::Span<const int64_t> rows,
                      ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 2 || yd.size() != 2 || yd[0] != xd[0]) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf_matmul: x [M, K], y [M, N]");
  }
  auto work = std::make_shared<Work>();
  work->m = xd[0];
  work->k = xd[1];
  work->n = yd[1];
  ffi::Error err = check_segments(work->k, data.typed_data(), data.element_count(), segs,
                                  rows, &work->segs);
  if (err.failure()) return err;
  int64_t total = 0;
  for (size_t i = 0; i < work->segs.size(); ++i) {
    total += work->segs[i].rows;
    for (int64_t r = 0; r < work->segs[i].rows; r += kRowsPerTask) {
      work->tasks.emplace_back(static_cast<int>(i), r);
    }
  }
  if (total != work->n) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf_matmul: N != sum(rows)");
  }
  if (work->m == 0 || work->n == 0) return ffi::Error::Success();
  Act act(x.typed_data(), work->m, work->k);
  work->act = &act;
  work->y = y->typed_data();
  const int64_t helpers = std::min<int64_t>(
      static_cast<int64_t>(std::thread::hardware_concurrency()) - 1,
      static_cast<int64_t>(work->tasks.size()) - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->take(); });
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
  std::vector<Segment> s;
  ffi::Error err = check_segments(yd[1], data.typed_data(), data.element_count(), segs, rows, &s);
  if (err.failure()) return err;
  const int32_t* id = ids.typed_data();
  for (int64_t t = 0; t < yd[0]; ++t) {
    if (id[t] < 0 || id[t] >= s[0].rows) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "gguf_rows: id out of range");
    }
    dequant_any(s[0].type, s[0].data + id[t] * s[0].row_bytes, yd[1], y->typed_data() + t * yd[1]);
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

// Bytes of one row of K values in GGML type `type`; -1 where there is no product for it.
__attribute__((visibility("default"))) int64_t RadixjaxGgufRowBytes(int32_t type, int64_t k) {
  return k % 32 || k % block_values(type) ? -1 : row_bytes(type, k);
}

}  // extern "C"
