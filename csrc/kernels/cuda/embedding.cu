// CUDA embedding kernels: forward (row gather), backward (deterministic scatter-add), index_range.
//
// embedding_backward writes dtable with `=`: rows no id points at are zero, the others are the
// sum of their dout rows added in increasing position order, exactly the CPU's order. No
// atomics: the (id, position) pairs are sorted by id with a stable radix sort (CUB), then one
// block per run of equal ids sums that run's dout rows in position order, in float32 (float64
// for float64), and rounds once. Ids are trusted to be in [0, vocab): ops::embedding checks them
// with index_range first.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

// Block per output row (grid-stride over rows), threads over the row's words.
template <typename W>
__global__ void gather_rows_kernel(const W* table, const void* ids, bool ids64, W* out, int64_t n_ids,
                                   int64_t row_words) {
  for (int64_t i = blockIdx.x; i < n_ids; i += gridDim.x) {
    const W* src = table + load_index(ids64, ids, i) * row_words;
    W* dst = out + i * row_words;
    for (int64_t j = threadIdx.x; j < row_words; j += blockDim.x) dst[j] = src[j];
  }
}

template <typename W>
void launch_gather(const void* table, const void* ids, bool ids64, void* out, int64_t n_ids, int64_t row_words,
                   const OnStream& on) {
  const int threads = row_words >= kThreads ? kThreads : static_cast<int>(ceil_div(row_words, kWarp) * kWarp);
  const unsigned blocks = static_cast<unsigned>(n_ids < kMaxBlocks ? n_ids : kMaxBlocks);
  gather_rows_kernel<<<blocks, threads, 0, on.s>>>(static_cast<const W*>(table), ids, ids64, static_cast<W*>(out),
                                                   n_ids, row_words);
  XT_LAUNCH_CHECK();
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  XT_GRID_STRIDE(i, n) out[i] = static_cast<int32_t>(i);
}

// Block j handles the run of equal ids that starts at sorted position j (other blocks exit).
template <typename T, typename K>
__global__ void segment_sum_kernel(const K* sorted_ids, const int32_t* sorted_pos, const T* dout, T* dtable,
                                   int64_t n_ids, int64_t dim) {
  using C = compute_t<T>;
  const int64_t j = blockIdx.x;
  const K id = sorted_ids[j];
  if (j > 0 && sorted_ids[j - 1] == id) return;
  int64_t end = j + 1;
  while (end < n_ids && sorted_ids[end] == id) ++end;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    C acc = 0;
    for (int64_t k = j; k < end; ++k) acc += load(dout, static_cast<int64_t>(sorted_pos[k]) * dim + c);
    store(dtable, static_cast<int64_t>(id) * dim + c, acc);
  }
}

// One block: min and max of the ids (integers, so any combination order gives the same answer).
__global__ void index_range_kernel(const void* ids, bool ids64, int64_t n, int64_t* minmax) {
  __shared__ long long lo_w[32], hi_w[32];
  long long lo = LLONG_MAX, hi = LLONG_MIN;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const long long v = load_index(ids64, ids, i);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const long long l = __shfl_xor_sync(0xffffffffu, lo, o), h = __shfl_xor_sync(0xffffffffu, hi, o);
    lo = l < lo ? l : lo;
    hi = h > hi ? h : hi;
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    lo_w[warp] = lo;
    hi_w[warp] = hi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w) {
      lo = lo_w[w] < lo ? lo_w[w] : lo;
      hi = hi_w[w] > hi ? hi_w[w] : hi;
    }
    minmax[0] = n > 0 ? lo : 0;  // n == 0 gives the empty range {0, -1}, as on the CPU
    minmax[1] = n > 0 ? hi : -1;
  }
}

int bits_for(int64_t vocab) {
  int b = 1;
  while (b < 63 && (int64_t(1) << b) < vocab) ++b;
  return b;
}

// Sort (id, position) pairs by id, stably, then sum each run. K is the unsigned id type (ids are
// non-negative, so their bits sort the same as unsigned).
template <typename T, typename K>
void backward_sorted(const K* ids, const T* dout, T* dtable, int64_t n_ids, int64_t vocab, int64_t dim,
                     const OnStream& on) {
  const int n = static_cast<int>(n_ids);
  Scratch pos_in(sizeof(int32_t) * n, on), pos_out(sizeof(int32_t) * n, on), keys_out(sizeof(K) * n, on);
  iota_kernel<<<grid_for(n), kThreads, 0, on.s>>>(pos_in.as<int32_t>(), n);
  XT_LAUNCH_CHECK();
  size_t temp_bytes = 0;
  const int end_bit = bits_for(vocab);
  XT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids, keys_out.as<K>(), pos_in.as<int32_t>(),
                                                pos_out.as<int32_t>(), n, 0, end_bit, on.s));
  Scratch temp(temp_bytes, on);
  XT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, ids, keys_out.as<K>(),
                                                pos_in.as<int32_t>(), pos_out.as<int32_t>(), n, 0, end_bit, on.s));
  const int threads = dim >= kThreads ? kThreads : static_cast<int>(ceil_div(dim, kWarp) * kWarp);
  segment_sum_kernel<T, K><<<static_cast<unsigned>(n), threads, 0, on.s>>>(keys_out.as<K>(), pos_out.as<int32_t>(),
                                                                          dout, dtable, n_ids, dim);
  XT_LAUNCH_CHECK();
}

}  // namespace

void embedding_forward(DType dt, const void* table, DType id_dt, const void* ids, void* out, int64_t n_ids,
                       int64_t dim, void* stream) {
  const bool ids64 = index_is_64(id_dt, "embedding_forward");
  if (n_ids == 0 || dim == 0) return;
  OnStream on(stream);
  const int64_t row_bytes = dim * static_cast<int64_t>(dtype_size(dt));
  // Move rows as the widest word that divides them (and the allocator's 512-byte alignment).
  if (row_bytes % 16 == 0 && aligned_to(table, 16) && aligned_to(out, 16))
    launch_gather<uint4>(table, ids, ids64, out, n_ids, row_bytes / 16, on);
  else if (row_bytes % 4 == 0 && aligned_to(table, 4) && aligned_to(out, 4))
    launch_gather<uint32_t>(table, ids, ids64, out, n_ids, row_bytes / 4, on);
  else
    launch_gather<uint16_t>(table, ids, ids64, out, n_ids, row_bytes / 2, on);
}

void embedding_backward(DType dt, DType id_dt, const void* ids, const void* dout, void* dtable, int64_t n_ids,
                        int64_t vocab, int64_t dim, void* stream) {
  const bool ids64 = index_is_64(id_dt, "embedding_backward");
  if (vocab == 0 || dim == 0) return;
  XT_CHECK(n_ids <= INT32_MAX, ValueError, "embedding_backward: at most 2^31-1 ids on CUDA, got ", n_ids);
  OnStream on(stream);
  XT_CUDA_CHECK(cudaMemsetAsync(dtable, 0, static_cast<size_t>(vocab * dim) * dtype_size(dt), on.s));
  if (n_ids == 0) return;
  XT_DISPATCH_FLOAT(dt, "embedding_backward", T, {
    const T* pd = static_cast<const T*>(dout);
    T* pt = static_cast<T*>(dtable);
    if (ids64) backward_sorted<T>(static_cast<const uint64_t*>(ids), pd, pt, n_ids, vocab, dim, on);
    else backward_sorted<T>(static_cast<const uint32_t*>(ids), pd, pt, n_ids, vocab, dim, on);
  });
}

void index_range(DType id_dt, const void* ids, int64_t n, int64_t* minmax, void* stream) {
  const bool ids64 = index_is_64(id_dt, "index_range");
  OnStream on(stream);
  index_range_kernel<<<1, 1024, 0, on.s>>>(ids, ids64, n, minmax);
  XT_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
