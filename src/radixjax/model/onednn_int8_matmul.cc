// oneDNN's int8 matmul for XLA CPU programs (an FFI handler), on weights packed once in
// the layout oneDNN's kernel reads, read in place from a stack of layers. Built by
// `python -m radixjax.model.onednn --build` (scripts/setup.sh); model/onednn.py loads it
// and says why it exists.
//
//   RadixjaxInt8Pack (C, called once per weight and part at load):
//       w [N', K] s8 row-major  ->  packed [P] s8, P = RadixjaxInt8PackedBytes(N', K)
//   RadixjaxInt8Matmul (FFI handler):
//       x [M, K] s8, packed [L, parts, P] s8, layer [] s32  ->  y [parts, M, N'] s32
//       y[p] = x @ w[layer][p * N' : (p + 1) * N'].T, exact int32 sums: w's N rows
//       split into `parts` equal parts of N' rows, each packed on its own (each part's
//       output is dense: oneDNN has only its reference kernel for a strided one)
//
// The parts run on XLA's intra-op thread pool (the calling thread takes parts too, so a
// busy pool never blocks it), each single-threaded in oneDNN: oneDNN's own OpenMP team,
// woken from XLA's threads, cost ~50 us a call and spun against them.
//
// The packed layout is the one oneDNN's matmul picks for a [K, N] s8 weight beside s8
// activations (with it, the sums' compensation for the s8 activations: VNNI multiplies u8
// by s8); for a given CPU it does not depend on M, so one packed copy serves every step.
// A primitive is created once per shape and kept. Unpacked weights cost ~2x at 8 rows
// (the kernel repacks them on every call).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <omp.h>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

constexpr int64_t kLayoutRows = 8;  // the M the packed layout is queried with

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Throws where oneDNN would run its reference kernel (orders of magnitude slower).
dnnl::matmul::primitive_desc describe(int64_t m, int64_t n, int64_t k,
                                      const dnnl::memory::desc& weights) {
  dnnl::primitive_attr attr;  // scratch memory from each caller (threads share primitives)
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(cpu_engine(), dnnl::memory::desc({m, k}, dt::s8, tag::ab),
                                  weights, dnnl::memory::desc({m, n}, dt::s32, tag::ab), attr);
  if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) {
    throw std::runtime_error("oneDNN has only its reference int8 matmul on this CPU");
  }
  return pd;
}

// The packed weight's layout for an [N, K] weight (the matmul's choice for [K, N]).
dnnl::memory::desc packed_desc(int64_t n, int64_t k) {
  return describe(kLayoutRows, n, k, dnnl::memory::desc({k, n}, dt::s8, tag::any))
      .weights_desc();
}

struct Matmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

// The primitive for one shape over packed weights; created under a lock on first use.
const Matmul& matmul_for(int64_t m, int64_t n, int64_t k) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, Matmul> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(m, n, k);
  auto it = cache.find(key);
  if (it == cache.end()) {
    dnnl::memory::desc packed = packed_desc(n, k);
    auto pd = describe(m, n, k, packed);
    if (pd.weights_desc() != packed) throw std::runtime_error("packed layout differs at this M");
    it = cache.emplace(key, Matmul{pd, dnnl::matmul(pd)}).first;
  }
  return it->second;
}

void single_threaded() {
  thread_local bool done = false;
  if (!done) omp_set_num_threads(1);  // this thread's oneDNN calls: no OpenMP team
  done = true;
}

// One call's parts, shared by the threads that take them (it outlives the call when a
// pool task starts after every part was taken).
struct Work {
  const Matmul* mm;
  const int8_t* x;
  const int8_t* packed;  // the layer's [parts, P]
  int32_t* y;
  int64_t parts, part_bytes, part_size;  // per part: packed bytes, output int32s
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mu;
  std::string error;

  void take_parts() {
    single_threaded();
    for (int64_t i; (i = next.fetch_add(1)) < parts;) {
      try {
        dnnl::engine& engine = cpu_engine();
        dnnl::memory src(mm->pd.src_desc(), engine, const_cast<int8_t*>(x));
        dnnl::memory wei(mm->pd.weights_desc(), engine,
                         const_cast<int8_t*>(packed + i * part_bytes));
        dnnl::memory dst(mm->pd.dst_desc(), engine, y + i * part_size);
        thread_local std::vector<uint8_t> scratch;
        scratch.resize(std::max(scratch.size(), mm->pd.scratchpad_desc().get_size()));
        dnnl::memory pad(mm->pd.scratchpad_desc(), engine, scratch.data());
        dnnl::stream stream(engine);
        mm->prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei},
                                  {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, pad}});
        stream.wait();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        error = e.what();
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error Int8MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x,
                          ffi::Buffer<ffi::S8> packed, ffi::Buffer<ffi::S32> layer,
                          ffi::ResultBuffer<ffi::S32> y) {
  auto xd = x.dimensions();
  auto pdims = packed.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 2 || pdims.size() != 3 || yd.size() != 3 || yd[0] != pdims[1] ||
      yd[1] != xd[0] || layer.element_count() != 1) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "int8_matmul: x [M, K], packed [L, parts, P], layer [], y [parts, M, N']");
  }
  const int64_t m = xd[0], k = xd[1], n = yd[2];  // n: one part's rows of w
  const int64_t layers = pdims[0], parts = pdims[1], part_bytes = pdims[2];
  const int64_t l = *layer.typed_data();
  if (m == 0 || n == 0) return ffi::Error::Success();
  if (l < 0 || l >= layers) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "int8_matmul: layer out of range");
  }
  auto work = std::make_shared<Work>();
  try {
    single_threaded();
    work->mm = &matmul_for(m, n, k);
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("oneDNN: ") + e.what());
  }
  if (static_cast<int64_t>(work->mm->pd.weights_desc().get_size()) != part_bytes) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "int8_matmul: packed part size does not match (N / parts, K)");
  }
  work->x = x.typed_data();
  work->packed = packed.typed_data() + l * parts * part_bytes;
  work->y = y->typed_data();
  work->parts = parts;
  work->part_bytes = part_bytes;
  work->part_size = m * n;
  for (int64_t i = 1; i < parts; ++i) pool.Schedule([work] { work->take_parts(); });
  work->take_parts();
  while (work->done.load(std::memory_order_acquire) < parts) {
    std::this_thread::yield();  // parts other threads took are running (a spin starved
  }                             // them of the 2 cores: ~8 ms a call)
  if (!work->error.empty()) {
    return ffi::Error(ffi::ErrorCode::kInternal, "oneDNN: " + work->error);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixjaxInt8Matmul, Int8MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

extern "C" {

// Bytes of one packed [N, K] weight; -1 where oneDNN has no fast kernel for it, or
// would want another layout at one of the `num_rows` row counts `rows` (the runner's
// step sizes: oneDNN may switch kernels by M, e.g. on AMX CPUs). A step of a row count
// not checked that still wanted another layout fails with an error, never a wrong sum.
__attribute__((visibility("default"))) int64_t RadixjaxInt8PackedBytes(
    int64_t n, int64_t k, const int64_t* rows, int64_t num_rows) {
  try {
    dnnl::memory::desc packed = packed_desc(n, k);
    for (int64_t i = 0; i < num_rows; ++i) {
      if (describe(rows[i], n, k, packed).weights_desc() != packed) return -1;
    }
    return static_cast<int64_t>(packed.get_size());
  } catch (const std::exception&) {
    return -1;
  }
}

// w [N, K] s8 row-major -> out [RadixjaxInt8PackedBytes(N, K)]; 0 on success.
__attribute__((visibility("default"))) int RadixjaxInt8Pack(const int8_t* w, int64_t n,
                                                            int64_t k, int8_t* out) {
  try {
    dnnl::engine& engine = cpu_engine();
    dnnl::memory plain(dnnl::memory::desc({k, n}, dt::s8, tag::ba), engine,
                       const_cast<int8_t*>(w));
    dnnl::memory packed(packed_desc(n, k), engine, out);
    dnnl::stream stream(engine);
    dnnl::reorder(plain, packed).execute(stream, plain, packed);
    stream.wait();
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

}  // extern "C"
