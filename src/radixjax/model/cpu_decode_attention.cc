// Decode attention over the paged KV pool for XLA CPU programs (an FFI handler). Built by
// `python -m radixjax.model.cpu_decode --build` (scripts/setup.sh); model/cpu_decode.py
// loads it and says why it exists.
//
//   RadixjaxDecodeAttention (FFI handler), attribute window (0: none):
//       q [B, Hq, D] f32 (scaled), k_pool, v_pool [N, Hkv, D] (bf16 bits as u16, or f32),
//       req_to_token [R, W] s32, req_row [B] s32, kv_len [B] s32 (0: no decode token,
//       its output zeros), layer_base [] s32  ->  out [B, Hq, D] f32
//       out[b, h * G + g] = softmax(q[b, h*G+g] . K[slot(p), h]) . V[slot(p), h]
//       over positions p in [lo, kv_len[b]), lo = max(0, kv_len[b] - window) with a
//       window, slot(p) = req_to_token[req_row[b], p] + layer_base
//
// A request's keys go in chunks of kChunk positions from its first key, each chunk one
// work item over every head: its scores (dot products of D in a fixed lane order), their
// exact maximum m, p = exp(s - m), the sum of p and p . V over the chunk's keys in
// position order (the query heads of a KV head in registers). Then each request's chunks
// are merged in position order. So a request's numbers depend on its own keys alone,
// never on its batch or on which thread took which chunk (SGLang's deterministic
// inference needs no other form). The items run on XLA's intra-op thread pool, the
// calling thread taking items too.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// 16 lanes; GCC lowers these to AVX-512 (or pairs of AVX2) registers.
typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef float f8v __attribute__((vector_size(32)));
typedef float f4v __attribute__((vector_size(16)));
constexpr int kLanes = 16;

f16v splat(float x) { return f16v{} + x; }

f16v load(const float* p) {
  f16v v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// 32 pool values from p as two vectors, in the pool type's lane order: f32 as they lie;
// bf16 bits (exact in f32) the even and the odd elements (two instructions, no
// widening shuffle). A query is laid out the same way (lane_order) so that dot products
// pair the right elements; a sum over keys comes back through natural_order.
void load2(const float* p, f16v& a, f16v& b) {
  a = load(p);
  b = load(p + kLanes);
}
void load2(const uint16_t* p, f16v& a, f16v& b) {
  u16v w;
  std::memcpy(&w, p, sizeof w);
  a = (f16v)(w << 16);
  b = (f16v)(w & 0xffff0000u);
}

// x [D] (natural order) -> out [D / 16] vectors in T's lane order.
template <typename T>
void lane_order(const float* x, int64_t d, f16v* out) {
  for (int64_t i = 0; i < d; i += 2 * kLanes) {
    f16v a, b;
    if constexpr (std::is_same_v<T, float>) {
      a = load(x + i);
      b = load(x + i + kLanes);
    } else {
      for (int j = 0; j < kLanes; ++j) {
        a[j] = x[i + 2 * j];
        b[j] = x[i + 2 * j + 1];
      }
    }
    out[i / kLanes] = a;
    out[i / kLanes + 1] = b;
  }
}

// v [D / 16] vectors in T's lane order -> out [D] (natural order).
template <typename T>
void natural_order(const f16v* v, int64_t d, float* out) {
  for (int64_t i = 0; i < d; i += 2 * kLanes) {
    const f16v a = v[i / kLanes], b = v[i / kLanes + 1];
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out + i, &a, sizeof a);
      std::memcpy(out + i + kLanes, &b, sizeof b);
    } else {
      for (int j = 0; j < kLanes; ++j) {
        out[i + 2 * j] = a[j];
        out[i + 2 * j + 1] = b[j];
      }
    }
  }
}

// The sum of the lanes, always in the same order (halving).
float hsum(f16v a) {
  f8v s8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  f4v s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

float hmax(f16v a) {
  float m = a[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, a[i]);
  return m;
}

// exp(x) for x <= 0 (a score minus its row's maximum): Cody-Waite reduction by ln 2 and
// a degree-6 polynomial (relative error ~1e-7); 0 below -87.
f16v exp_nonpositive(f16v x) {
  const i16v tiny = x < -87.0f;
  x = x < -87.0f ? splat(-87.0f) : x;
  const f16v magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  f16v n = (x * 1.44269504088896341f + magic) - magic;
  f16v r = x - n * 0.693359375f + n * 2.12194440e-4f;
  f16v y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  i16v scale = (__builtin_convertvector(n, i16v) + 127) << 23;  // 2^n
  f16v out = y * (f16v)scale;
  return (f16v)((i16v)out & ~tiny);
}

template <typename A, typename B>
bool same_dims(const A& a, const B& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

struct Shape {
  int64_t batch, q_heads, kv_heads, dim, group, table_width, window, slots;
};

constexpr int64_t kChunk = 256;  // keys per work item (a multiple of kLanes)
constexpr int64_t kPrefetch = 4;  // keys ahead whose rows are prefetched

// Scores of GB query heads (q [GB][C] vectors) against one KV head's keys (at pool
// offsets rows[0 .. n), + head): sc[g * padded + p], each a dot product of D = 16 C in a
// fixed order. prefetch: also fetch the whole rows (every head) kPrefetch keys ahead.
template <int C, int GB, typename T>
void scores(const f16v* q, const T* pool, const T* other, const int64_t* rows, int64_t n,
            int64_t head, int64_t row_bytes, bool prefetch, float* sc, int64_t padded) {
  f16v qr[GB][C];
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < C; ++c) qr[g][c] = q[g * C + c];
  for (int64_t p = 0; p < n; ++p) {
    if (prefetch && p + kPrefetch < n) {
      const char* kp = reinterpret_cast<const char*>(pool + rows[p + kPrefetch]);
      const char* vp = reinterpret_cast<const char*>(other + rows[p + kPrefetch]);
      for (int64_t b = 0; b < row_bytes; b += 64) {
        __builtin_prefetch(kp + b);
        __builtin_prefetch(vp + b);
      }
    }
    const T* k = pool + rows[p] + head;
    f16v kc[C];
    for (int c = 0; c < C; c += 2) load2(k + c * kLanes, kc[c], kc[c + 1]);
    for (int g = 0; g < GB; ++g) {
      f16v d = qr[g][0] * kc[0];
      for (int c = 1; c < C; ++c) d += qr[g][c] * kc[c];
      sc[g * padded + p] = hsum(d);
    }
  }
}

// acc[g, D] = sum over keys p of w[g * padded + p] v[p] for GB query heads of one KV head,
// in position order (the accumulators in registers).
template <int C, int GB, typename T>
void values(const float* w, int64_t padded, const T* pool, const int64_t* rows, int64_t n,
            int64_t head, float* acc) {
  f16v a[GB][C] = {};
  for (int64_t p = 0; p < n; ++p) {
    const T* v = pool + rows[p] + head;
    f16v vc[C];
    for (int c = 0; c < C; c += 2) load2(v + c * kLanes, vc[c], vc[c + 1]);
    for (int g = 0; g < GB; ++g) {
      const f16v wg = splat(w[g * padded + p]);
      for (int c = 0; c < C; ++c) a[g][c] += wg * vc[c];
    }
  }
  for (int g = 0; g < GB; ++g) natural_order<T>(a[g], C * kLanes, acc + g * C * kLanes);
}

// One request's keys [lo, hi) (positions, within its table row), every head, D = 16 C:
// the partial softmax of each query head j: m[j] (its scores' maximum),
// l[j] = sum exp(s - m[j]) and acc[j, D] = sum exp(s - m[j]) v, in position order.
// Query heads go in blocks of up to 16 / C (registers: GB x C accumulators).
template <int C, typename T>
void chunk(const Shape& s, const float* q, const T* k_pool, const T* v_pool,
           const int32_t* table_row, int32_t base, int64_t lo, int64_t hi, float* m,
           float* l, float* acc) {
  constexpr int kBlock = std::max(1, 16 / C);
  const int64_t hq = s.q_heads, row = s.kv_heads * s.dim;
  const int64_t n = hi - lo, padded = (n + kLanes - 1) / kLanes * kLanes;
  thread_local std::vector<f16v> q_buf;
  thread_local std::vector<float> score_buf;
  q_buf.resize(hq * C);
  score_buf.resize(hq * padded);
  f16v* qv = q_buf.data();
  float* sc = score_buf.data();
  for (int64_t j = 0; j < hq; ++j) lane_order<T>(q + j * s.dim, s.dim, qv + j * C);
  int64_t rows[kChunk];  // the keys' pool offsets (a table entry past the pool clamped,
  for (int64_t p = 0; p < n; ++p) {  // as XLA's gather does)
    rows[p] = std::clamp<int64_t>(int64_t(table_row[lo + p]) + base, 0, s.slots - 1) * row;
  }
  // each (KV head, block of its query heads): fn(first query head j, heads in block)
  auto blocks = [&](auto fn) {
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      for (int64_t g = 0; g < s.group; g += kBlock) {
        fn(h, h * s.group + g, std::min<int64_t>(kBlock, s.group - g));
      }
    }
  };
  blocks([&](int64_t h, int64_t j, int64_t gb) {
    const bool prefetch = h == 0 && j == 0;
    const int64_t bytes = row * int64_t(sizeof(T));
#define RADIXJAX_SCORES(GB)                                                              \
  scores<C, GB>(qv + j * C, k_pool, v_pool, rows, n, h * s.dim, bytes, prefetch,        \
                sc + j * padded, padded)
    switch (gb) {
      case 1: RADIXJAX_SCORES(1); break;
      case 2: RADIXJAX_SCORES((kBlock >= 2 ? 2 : 1)); break;
      case 3: RADIXJAX_SCORES((kBlock >= 3 ? 3 : 1)); break;
      default: RADIXJAX_SCORES(kBlock); break;
    }
#undef RADIXJAX_SCORES
  });
  for (int64_t j = 0; j < hq; ++j) {  // p = exp(s - max) in place, its sum
    float* sj = sc + j * padded;
    std::fill(sj + n, sj + padded, -1e30f);
    f16v mv = load(sj);
    for (int64_t i = kLanes; i < padded; i += kLanes) {
      f16v v = load(sj + i);
      mv = mv > v ? mv : v;
    }
    m[j] = hmax(mv);
    const f16v mx = splat(m[j]);
    f16v sum{};
    for (int64_t i = 0; i < padded; i += kLanes) {
      f16v e = exp_nonpositive(load(sj + i) - mx);
      std::memcpy(sj + i, &e, sizeof e);
      sum += e;
    }
    l[j] = hsum(sum);
  }
  blocks([&](int64_t h, int64_t j, int64_t gb) {
#define RADIXJAX_VALUES(GB) \
  values<C, GB>(sc + j * padded, padded, v_pool, rows, n, h * s.dim, acc + j * s.dim)
    switch (gb) {
      case 1: RADIXJAX_VALUES(1); break;
      case 2: RADIXJAX_VALUES((kBlock >= 2 ? 2 : 1)); break;
      case 3: RADIXJAX_VALUES((kBlock >= 3 ? 3 : 1)); break;
      default: RADIXJAX_VALUES(kBlock); break;
    }
#undef RADIXJAX_VALUES
  });
}

// One call: items (request, chunk of kChunk keys) shared by the threads that take them;
// then each request's chunks merged in order.
struct Work {
  Shape shape;
  const float* q;
  const void *k_pool, *v_pool;
  bool bf16;
  const int32_t *table, *req_row, *kv_len;
  int32_t base;
  float* out;
  int64_t max_chunks;
  std::unique_ptr<float[]> part;  // [B, max_chunks, Hq, D + 2]: acc, m, l (unset: not read)
  std::atomic<int64_t> next{0}, done{0};

  // Request b's keys: positions [lo, end) of its table row.
  std::pair<int64_t, int64_t> keys(int64_t b) const {
    const int64_t end = std::clamp<int64_t>(kv_len[b], 0, shape.table_width);
    return {shape.window > 0 ? std::max<int64_t>(0, end - shape.window) : 0, end};
  }

  float* part_at(int64_t b, int64_t c) {
    return part.get() + (b * max_chunks + c) * shape.q_heads * (shape.dim + 2);
  }

  template <typename T>
  void run_chunk(const T* k, const T* v, const float* qb, const int32_t* table_row,
                 int64_t lo, int64_t hi, float* m, float* l, float* acc) const {
    switch (shape.dim) {
      case 64: chunk<4>(shape, qb, k, v, table_row, base, lo, hi, m, l, acc); break;
      case 128: chunk<8>(shape, qb, k, v, table_row, base, lo, hi, m, l, acc); break;
      default: chunk<16>(shape, qb, k, v, table_row, base, lo, hi, m, l, acc); break;
    }
  }

  void take_items() {
    const int64_t items = shape.batch * max_chunks, stride = shape.dim + 2;
    for (int64_t i; (i = next.fetch_add(1)) < items;) {
      const int64_t b = i / max_chunks, c = i % max_chunks;
      const auto [lo, end] = keys(b);
      const int64_t c_lo = lo + c * kChunk, c_hi = std::min(end, c_lo + kChunk);
      if (c_lo < c_hi) {
        float* pt = part_at(b, c);
        const float* qb = q + b * shape.q_heads * shape.dim;
        const int32_t* table_row = table + int64_t(req_row[b]) * shape.table_width;
        std::vector<float> m(shape.q_heads), l(shape.q_heads);
        std::vector<float> acc(shape.q_heads * shape.dim);
        if (bf16) {
          run_chunk(static_cast<const uint16_t*>(k_pool), static_cast<const uint16_t*>(v_pool),
                    qb, table_row, c_lo, c_hi, m.data(), l.data(), acc.data());
        } else {
          run_chunk(static_cast<const float*>(k_pool), static_cast<const float*>(v_pool), qb,
                    table_row, c_lo, c_hi, m.data(), l.data(), acc.data());
        }
        for (int64_t j = 0; j < shape.q_heads; ++j) {
          std::copy(acc.begin() + j * shape.dim, acc.begin() + (j + 1) * shape.dim,
                    pt + j * stride);
          pt[j * stride + shape.dim] = m[j];
          pt[j * stride + shape.dim + 1] = l[j];
        }
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }

  // out[b] from its chunks' partials, merged in position order.
  void merge(int64_t b) {
    const int64_t stride = shape.dim + 2, d = shape.dim;
    float* o = out + b * shape.q_heads * d;
    const auto [lo, end] = keys(b);
    const int64_t n = (end - lo + kChunk - 1) / kChunk;
    std::fill(o, o + shape.q_heads * d, 0.0f);
    if (n <= 0) return;
    for (int64_t j = 0; j < shape.q_heads; ++j) {
      float mx = part_at(b, 0)[j * stride + d];
      for (int64_t c = 1; c < n; ++c) mx = std::max(mx, part_at(b, c)[j * stride + d]);
      float denom = 0.0f;
      for (int64_t c = 0; c < n; ++c) {
        const float* pt = part_at(b, c) + j * stride;
        const float w = std::exp(pt[d] - mx);
        denom += w * pt[d + 1];
        for (int64_t i = 0; i < d; ++i) o[j * d + i] += w * pt[i];
      }
      for (int64_t i = 0; i < d; ++i) o[j * d + i] /= denom;
    }
  }
};

ffi::Error DecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                               ffi::AnyBuffer k_pool, ffi::AnyBuffer v_pool,
                               ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> req_row,
                               ffi::Buffer<ffi::S32> kv_len, ffi::Buffer<ffi::S32> layer_base,
                               int64_t window, ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = k_pool.dimensions(), td = table.dimensions();
  const auto type = k_pool.element_type();
  if (qd.size() != 3 || kd.size() != 3 || td.size() != 2 || !same_dims(v_pool.dimensions(), kd) ||
      v_pool.element_type() != type || (type != ffi::U16 && type != ffi::F32) ||
      kd[2] != qd[2] || (qd[2] != 64 && qd[2] != 128 && qd[2] != 256) || qd[1] % kd[1] || req_row.element_count() != qd[0] ||
      kv_len.element_count() != qd[0] || layer_base.element_count() != 1 ||
      !same_dims(out->dimensions(), qd)) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "decode_attention: q [B, Hq, D] f32 (D 64, 128 or 256), pools "
                      "[N, Hkv, D] u16 or f32, req_to_token [R, W], req_row, kv_len [B]");
  }
  auto work = std::make_shared<Work>();
  work->shape = Shape{qd[0], qd[1], kd[1], qd[2], qd[1] / kd[1], td[1], window, kd[0]};
  work->q = q.typed_data();
  work->k_pool = k_pool.untyped_data();
  work->v_pool = v_pool.untyped_data();
  work->bf16 = type == ffi::U16;
  work->table = table.typed_data();
  work->req_row = req_row.typed_data();
  work->kv_len = kv_len.typed_data();
  work->base = *layer_base.typed_data();
  work->out = out->typed_data();
  int64_t longest = 0;
  for (int64_t b = 0; b < qd[0]; ++b) {
    const auto [lo, end] = work->keys(b);
    longest = std::max(longest, end - lo);
  }
  work->max_chunks = std::max<int64_t>(1, (longest + kChunk - 1) / kChunk);
  work->part.reset(new float[qd[0] * work->max_chunks * qd[1] * (qd[2] + 2)]);
  const int64_t items = qd[0] * work->max_chunks;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), items) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->take_items(); });
  work->take_items();
  while (work->done.load(std::memory_order_acquire) < items) {
    std::this_thread::yield();  // items other threads took are running
  }
  for (int64_t b = 0; b < qd[0]; ++b) work->merge(b);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixjaxDecodeAttention, DecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("window")
                                  .Ret<ffi::Buffer<ffi::F32>>());
