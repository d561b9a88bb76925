// Helpers for the CUDA kernels only (kernels/cuda/*.cu): launch geometry and checks, aligned
// packs, fixed-order warp/block reductions, scratch memory, and cuBLAS handles. What the CPU
// kernels share (types, loads/stores, dtype dispatch, the elementwise formulas) is in
// kernels/common.h, included here.
//
// Invariants every kernel file keeps:
//  - Reductions are deterministic: a warp reduces with a xor butterfly (every lane ends with the
//    same bits), a block reduces its warps' results in warp order, and partial results across
//    blocks are combined by one more fixed-order pass. No floating-point atomics.
//  - A launcher makes the stream's device current (OnStream), launches on that stream, and
//    checks the launch (XT_LAUNCH_CHECK, or launch_early for the decode step's kernels: Note
//    [Early launch of the decode step's kernels]). Launch shapes depend only on problem sizes,
//    never on the GPU model, so the reduction order (and the bits) depends only on the inputs.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda_api.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/common.h"
#include "kernels/kernels.h"

// After every <<<...>>>: raises RuntimeError naming the CUDA error when the launch failed.
#define XT_LAUNCH_CHECK() XT_CUDA_CHECK(cudaGetLastError())

#define XT_CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                         \
    const cublasStatus_t xt_st_ = (expr);                                                      \
    if (xt_st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      throw ::xt::RuntimeError(::xt::str("cuBLAS error ", cublasGetStatusName(xt_st_), ": ",   \
                                         cublasGetStatusString(xt_st_), " (in ", #expr, " at ", \
                                         __FILE__, ":", __LINE__, ")"));                       \
  } while (0)

namespace xt {
namespace kernels {
namespace cuda {

// ------------------------------------------------------------------ launch geometry

constexpr int kThreads = 256;    // default block size for elementwise work
constexpr int kWarp = 32;
// Cap for grid-stride launches: enough blocks to fill any current GPU many times over.
constexpr int64_t kMaxBlocks = 1 << 16;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t b = ceil_div(n, threads);
  return static_cast<unsigned>(b < kMaxBlocks ? (b > 0 ? b : 1) : kMaxBlocks);
}

// The launcher's view of its stream: the stream itself, its device, made current for the scope.
struct OnStream {
  cudaStream_t s;
  int device;
  xt::cuda::DeviceGuard guard;
  explicit OnStream(void* stream)
      : s(static_cast<cudaStream_t>(stream)), device(xt::cuda::stream_device(stream)), guard(device) {}
};

// Note [Early launch of the decode step's kernels]
// A decode step at batch 1 is ~95 kernels of a few microseconds each, and each spends its first
// microsecond or so getting its blocks resident and waiting for its first weight loads, after the
// kernel ahead of it has drained. Programmatic dependent launch (sm_90+) lets a kernel start while
// the one ahead still runs: launch_early() sets the launch attribute when
// xt::cuda::early_launch(device) says so (a thread-local request: xtrain.cuda.early_launch(),
// entered by the generator's decode step), and such a kernel
//  - first issues the loads of what the kernel ahead cannot be writing (its weights, norm
//    weights, residual input; the attention's positions, lengths and earlier cache slots, and
//    the rope table it computes from them): the request's promise is that the launch just before
//    writes none of these;
//  - then calls wait_prior_grids(): griddepcontrol.wait returns once every kernel it depends on
//    has completed and its writes are visible (at once when launched without the attribute), and
//    launch_dependents then lets the next early kernel start. Signalling only after the wait
//    makes the chain safe by induction: when a kernel starts, the one ahead has passed its own
//    wait, so every launch before that one has completed, which is what "not written by the
//    launch just before" needs;
//  - reads its activation input (the output of the kernel ahead) and writes only after the wait.
// The values and their order are those of the plain launch: the bits do not change. Without the
// request or on older GPUs the launch is the plain <<<...>>> one (the instructions then return at
// once). An earlier attempt made every kernel wait first thing
// (85920a9, reverted): nothing moved ahead of the wait, and the decode step got slower.
__device__ __forceinline__ void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(XT_CUDA_EMULATION)
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, on.s>>>(args...), with programmatic stream serialization when
// xt::cuda::early_launch(on.device) (Note above); checks the launch.
template <typename... Params, typename... Args>
void launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, const OnStream& on, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = on.s;
  cfg.attrs = attr;
  cfg.numAttrs = xt::cuda::early_launch(on.device) ? 1 : 0;
  XT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

#define XT_GRID_STRIDE(i, n)                                                              \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ------------------------------------------------------------------ packs

// N consecutive elements moved as one aligned load/store (16 bytes for the widest type of a
// kernel): what lets a thread saturate HBM with 2-byte bf16 elements.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

constexpr int kDefaultSmem = 48 * 1024;  // dynamic shared memory a launch gets without an opt-in

#ifndef XT_CUDA_EMULATION
// Kernel's dynamic shared memory above the default 48 KB needs an opt-in, once per device: the
// first call's bytes are the kernel's limit from then on (callers pass the most they launch with).
template <auto Kernel>
void allow_smem(int bytes, int device) {
  static std::atomic<uint64_t> done{0};
  if (bytes <= kDefaultSmem || device >= 64 || (done.load() >> device & 1)) return;
  XT_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(uint64_t(1) << device);
}
#endif

// A hint: bring the 128-byte line holding p into L2, for a later kernel's loads (no value, no
// wait; a no-op under the host emulation).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#ifndef XT_CUDA_EMULATION
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// ------------------------------------------------------------------ out-of-range indices

using xt::cuda::IndexErrorRecord;
using xt::cuda::IndexSite;

// Record an index outside [0, bound) for the host's next sync point to raise (Note [Device-side
// index checks], core/cuda/cuda_check.h). The record is host memory, written with plain stores:
// when several threads race, the host sees one of their values (site, bound and ignore_index are
// the same for all threads of a launch); a record not yet reported is kept.
__device__ __forceinline__ void report_bad_index(IndexErrorRecord* record, IndexSite site, int64_t value,
                                                 int64_t bound, int64_t ignore_index) {
  volatile IndexErrorRecord* r = record;
  if (r->flag != 0) return;
  r->site = static_cast<int32_t>(site);
  r->value = value;
  r->bound = bound;
  r->ignore_index = ignore_index;
  __threadfence_system();  // the fields before the flag, as the host sees them
  r->flag = 1;
}

// ------------------------------------------------------------------ reductions (fixed order)

template <typename C>
__device__ __forceinline__ C warp_sum(C v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename C>
__device__ __forceinline__ C warp_max(C v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = xmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (kMax: maximum) over the block (blockDim.x a multiple of 32, at most 1024): each warp's
// butterfly, then a butterfly over the warps' results; every thread gets the result. Safe to call
// repeatedly: the leading barrier protects the shared slots of the previous call (block_sum's and
// block_max's slots are separate instantiations).
template <bool kMax, typename C>
__device__ C block_reduce(C v) {
  __shared__ C partial[32];
  const auto warp_reduce = [](C x) {
    if constexpr (kMax) return warp_max(x);
    else return warp_sum(x);
  };
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  v = warp_reduce(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  C r = lane < nwarps ? partial[lane] : kMax ? NegInf<C>::get() : C(0);  // the warps past the last: the identity
  return warp_reduce(r);
}
template <typename C>
__device__ __forceinline__ C block_sum(C v) { return block_reduce<false>(v); }
template <typename C>
__device__ __forceinline__ C block_max(C v) { return block_reduce<true>(v); }

// ------------------------------------------------------------------ row groups

// G lanes per row (G in 2..32, a power of two): a warp handles 32/G rows at once, so short rows
// (the per-head q/k norm has dim 32) keep more bytes in flight per warp. G depends only on the row
// length, so a row's sum order (lane-strided partial sums, then group_sum) does too: rmsnorm.cu and
// the fused head preparation (qk_norm_rope.cuh) share these helpers and hence their bits.
template <int G, typename C>
__device__ __forceinline__ C group_sum(C v) {
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The row of this thread's group in a kThreads-wide block of rows_per_block<G>() rows.
template <int G>
__device__ __forceinline__ int64_t group_row() {
  return (static_cast<int64_t>(blockIdx.x) * (kThreads / kWarp) + threadIdx.x / kWarp) * (kWarp / G) +
         (threadIdx.x % kWarp) / G;
}

template <int G>
constexpr int64_t rows_per_block() { return (kThreads / kWarp) * (kWarp / G); }

// Lanes per row for a row length: about four elements per lane, at most a warp. constexpr: the
// fused delta of flash attention's dq kernel takes it as a template argument.
constexpr int lanes_for(int64_t dim) {
  if (dim >= 128) return 32;
  if (dim >= 64) return 16;
  if (dim >= 32) return 8;
  if (dim >= 16) return 4;
  return 2;
}

// Calls fn(std::integral_constant<int, G>{}) for the G that lanes_for(dim) picks.
template <typename Fn>
void with_lanes(int64_t dim, Fn&& fn) {
  switch (lanes_for(dim)) {
    case 32: fn(std::integral_constant<int, 32>{}); break;
    case 16: fn(std::integral_constant<int, 16>{}); break;
    case 8: fn(std::integral_constant<int, 8>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    default: fn(std::integral_constant<int, 2>{}); break;
  }
}

// The sum of squares of a row x of `dim` elements by the G lanes of a group (lane-strided partial
// sums, then group_sum): RMSNorm's, for kernels/common.h's rms_rstd. Every lane of the group calls
// it, `valid` or not (the shuffles); a lane of a row that is not valid adds nothing. The loop is
// unrolled so a lane's loads are in flight together (Note [Latency of a lone row]); the additions
// stay in j order.
template <int G, typename T>
__device__ __forceinline__ compute_t<T> group_sum_sq(const T* x, int64_t dim, int lane, bool valid) {
  using C = compute_t<T>;
  C ss = 0;
  if (valid)
#pragma unroll 8
    for (int64_t j = lane; j < dim; j += G) {
      const C v = load(x, j);
      ss += v * v;
    }
  return group_sum<G>(ss);
}

// Note [Latency of a lone row]
// When a kernel has only a few rows (a decode step: one token per sequence), one group of G lanes
// does a whole row of dim elements, dim / G per lane, and nothing else on the GPU hides the memory
// latency. A loop that loads, adds and stores one element per iteration then waits one full
// memory round trip per element (the next load may not pass the store before it when the
// pointers could alias): 24 round trips for dim 768, 12-15 us on the H200 for a 1.5 KB row. So
// the row loops are unrolled and the row kernels' pointers are __restrict__ (inputs and outputs
// never overlap), which lets a lane's loads issue together; the arithmetic and its order are
// unchanged, so the results are the same bits. With a few rows, RMSNorm's forward goes further and
// gives each row a whole block (Note [Few rows: a block per row], rmsnorm.cuh).

// Deterministic column sums over the rows of a [rows, dim] matrix (weight gradients): one thread
// per column (a block no wider than the row: dim 32 -> 32 threads, not 256), row chunks each
// summed in increasing row order (one chunk writes the result directly, several write partial
// rows), then the partial rows added in chunk order. The plan depends only on (rows, dim): enough
// column blocks x chunks to fill the GPU, >= 16 rows per chunk. rmsnorm's dw and the fused head
// preparation's (qk_norm_rope.cu) use it, so their sums are the same bits.
struct ColumnSumPlan {
  int threads;
  int64_t col_blocks, nchunks, rows_per_chunk;
};
constexpr int64_t kColumnSumTargetBlocks = 1024;
constexpr int64_t kColumnSumMinRows = 16;
inline ColumnSumPlan column_sum_plan(int64_t rows, int64_t dim) {
  ColumnSumPlan p;
  p.threads = static_cast<int>(dim >= kThreads ? kThreads : ceil_div(dim, kWarp) * kWarp);
  p.col_blocks = ceil_div(dim, p.threads);
  int64_t nchunks = ceil_div(kColumnSumTargetBlocks, p.col_blocks);
  const int64_t by_rows = ceil_div(rows, kColumnSumMinRows);
  if (nchunks > by_rows) nchunks = by_rows;
  if (nchunks > 65535) nchunks = 65535;
  if (nchunks < 1) nchunks = 1;
  p.rows_per_chunk = ceil_div(rows, nchunks);
  p.nchunks = ceil_div(rows, p.rows_per_chunk);
  return p;
}

// ------------------------------------------------------------------ scratch memory

// Temporary device memory from the caching allocator, bound to the launch stream. Freed at
// scope exit: the block goes back to that stream's free list, so a later user is ordered after
// the kernels that use it here (no host sync needed).
class Scratch {
 public:
  Scratch(size_t nbytes, const OnStream& on)
      : block_(Allocator::get().allocate(Device::cuda(on.device), nbytes, on.s)) {}
  ~Scratch() { Allocator::get().free(block_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T> T* as() const { return static_cast<T*>(block_.ptr); }

 private:
  Block block_;
};

// ------------------------------------------------------------------ cuBLAS (gemm.cu)

// This thread's cuBLAS handle for `on`'s device, bound to on.s, with a workspace from the
// caching allocator. Handles live in a thread_local table: threads never share one.
cublasHandle_t cublas_handle(const OnStream& on);
// The same thread's cuBLASLt handle for `on`'s device and the cuBLAS handle's workspace (on.s's,
// so stream-ordered with this thread's other GEMMs): what gemm_lt.cu's cublasLtMatmul calls use.
struct LtWorkspace {
  cublasLtHandle_t handle;
  void* ptr;
  size_t bytes;
};
LtWorkspace cublaslt_workspace(const OnStream& on);

// TF32 tensor cores for float32 GEMMs (off by default: true fp32). The ops layer's
// ops::set_allow_tf32 forwards here in CUDA builds.
void set_allow_tf32(bool allow);
bool allow_tf32();

// The last of the n ascending starts start[0..n) that is at most x (binary search): the range
// holding chunk x of a list of element ranges (the optimizer kernels' AdamWList::chunk0,
// TensorList::start; Muon's lists).
template <size_t N>
__device__ __forceinline__ int find_start(const int64_t (&start)[N], int n, int64_t x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start[mid] <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
