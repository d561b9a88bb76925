// CUDA embedding kernels: forward (row gather) and backward (deterministic scatter-add).
//
// embedding_backward writes dtable with `=`: rows no id points at are zero, the others are the
// sum of their dout rows added in increasing position order, exactly the CPU's order. No
// atomics: the (id, position) pairs are sorted by id with a stable radix sort (CUB), then one
// block per run of equal ids sums that run's dout rows in position order, in float32 (float64
// for float64), and rounds once.
// Ids are checked here, on the device (Note [Device-side index checks], core/cuda/cuda_check.h):
// an id outside [0, vocab) reads nothing, gives a zero output row (forward) or has its dout row
// skipped (backward: it sorts after every valid id as the key `vocab`), and is reported to the
// host's next sync point as IndexError.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

// Block per output row (grid-stride over rows), threads over the row's words.
template <typename W>
__global__ void gather_rows_kernel(const W* table, const void* ids, bool ids64, W* out, int64_t n_ids, int64_t vocab,
                                   int64_t row_words, IndexErrorRecord* err) {
  for (int64_t i = blockIdx.x; i < n_ids; i += gridDim.x) {
    const int64_t id = load_index(ids64, ids, i);
    W* dst = out + i * row_words;
    if (id < 0 || id >= vocab) {
      if (threadIdx.x == 0) report_bad_index(err, IndexSite::Embedding, id, vocab, 0);
      for (int64_t j = threadIdx.x; j < row_words; j += blockDim.x) dst[j] = W{};
      continue;
    }
    const W* src = table + id * row_words;
    for (int64_t j = threadIdx.x; j < row_words; j += blockDim.x) dst[j] = src[j];
  }
}

template <typename W>
void launch_gather(const void* table, const void* ids, bool ids64, void* out, int64_t n_ids, int64_t vocab,
                   int64_t row_words, const OnStream& on) {
  const int threads = row_words >= kThreads ? kThreads : static_cast<int>(ceil_div(row_words, kWarp) * kWarp);
  const unsigned blocks = static_cast<unsigned>(n_ids < kMaxBlocks ? n_ids : kMaxBlocks);
  gather_rows_kernel<<<blocks, threads, 0, on.s>>>(static_cast<const W*>(table), ids, ids64, static_cast<W*>(out),
                                                   n_ids, vocab, row_words, xt::cuda::index_error_record(on.device));
  XT_LAUNCH_CHECK();
}

// The sort's input: keys[i] = ids[i], or `vocab` for an id outside [0, vocab) (reported), and
// pos[i] = i.
template <typename K>
__global__ void sort_input_kernel(const K* ids, int64_t n, int64_t vocab, K* keys, int32_t* pos,
                                  IndexErrorRecord* err) {
  XT_GRID_STRIDE(i, n) {
    const K id = ids[i];  // unsigned: a negative id is larger than any vocab
    const bool ok = static_cast<uint64_t>(id) < static_cast<uint64_t>(vocab);
    if (!ok) report_bad_index(err, IndexSite::EmbeddingBackward, load_index(sizeof(K) == 8, ids, i), vocab, 0);
    keys[i] = ok ? id : static_cast<K>(vocab);
    pos[i] = static_cast<int32_t>(i);
  }
}

// Block j handles the run of equal ids that starts at sorted position j (other blocks exit; so
// does the run of the out-of-range key `vocab`).
// accumulate: the row's sum is added to what dtable holds (float32/float64: a + b in their own
// type); rows no id points at keep it.
template <typename T, typename K>
__global__ void segment_sum_kernel(const K* sorted_ids, const int32_t* sorted_pos, const T* dout, T* dtable,
                                   int64_t n_ids, int64_t vocab, int64_t dim, bool accumulate) {
  using C = compute_t<T>;
  const int64_t j = blockIdx.x;
  const K id = sorted_ids[j];
  if ((j > 0 && sorted_ids[j - 1] == id) || static_cast<uint64_t>(id) >= static_cast<uint64_t>(vocab)) return;
  int64_t end = j + 1;
  while (end < n_ids && sorted_ids[end] == id) ++end;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    C acc = 0;
    for (int64_t k = j; k < end; ++k) acc += load(dout, static_cast<int64_t>(sorted_pos[k]) * dim + c);
    const int64_t at = static_cast<int64_t>(id) * dim + c;
    store(dtable, at, accumulate ? load(dtable, at) + acc : acc);
  }
}

int bits_for(int64_t vocab) {
  int b = 1;
  while (b < 63 && (int64_t(1) << b) < vocab) ++b;
  return b;
}

// Sort (id, position) pairs by id, stably, then sum each run. K is the unsigned id type (valid ids
// are non-negative, so their bits sort the same as unsigned); the keys cover [0, vocab], vocab
// standing for every out-of-range id.
template <typename T, typename K>
void backward_sorted(const K* ids, const T* dout, T* dtable, int64_t n_ids, int64_t vocab, int64_t dim,
                     bool accumulate, const OnStream& on) {
  const int n = static_cast<int>(n_ids);
  Scratch keys_in(sizeof(K) * n, on), pos_in(sizeof(int32_t) * n, on), pos_out(sizeof(int32_t) * n, on),
      keys_out(sizeof(K) * n, on);
  sort_input_kernel<K><<<grid_for(n), kThreads, 0, on.s>>>(ids, n, vocab, keys_in.as<K>(), pos_in.as<int32_t>(),
                                                           xt::cuda::index_error_record(on.device));
  XT_LAUNCH_CHECK();
  size_t temp_bytes = 0;
  const int end_bit = bits_for(vocab + 1);
  XT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<K>(), keys_out.as<K>(),
                                                pos_in.as<int32_t>(), pos_out.as<int32_t>(), n, 0, end_bit, on.s));
  Scratch temp(temp_bytes, on);
  XT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<K>(), keys_out.as<K>(),
                                                pos_in.as<int32_t>(), pos_out.as<int32_t>(), n, 0, end_bit, on.s));
  const int threads = dim >= kThreads ? kThreads : static_cast<int>(ceil_div(dim, kWarp) * kWarp);
  segment_sum_kernel<T, K><<<static_cast<unsigned>(n), threads, 0, on.s>>>(keys_out.as<K>(), pos_out.as<int32_t>(),
                                                                          dout, dtable, n_ids, vocab, dim,
                                                                          accumulate);
  XT_LAUNCH_CHECK();
}

}  // namespace

void embedding_forward(DType dt, const void* table, DType id_dt, const void* ids, void* out, int64_t n_ids,
                       int64_t vocab, int64_t dim, void* stream) {
  const bool ids64 = index_is_64(id_dt, "embedding_forward");
  if (n_ids == 0 || dim == 0) return;
  OnStream on(stream);
  const int64_t row_bytes = dim * static_cast<int64_t>(dtype_size(dt));
  // Move rows as the widest word that divides them (and the allocator's 512-byte alignment).
  if (row_bytes % 16 == 0 && aligned_to(table, 16) && aligned_to(out, 16))
    launch_gather<uint4>(table, ids, ids64, out, n_ids, vocab, row_bytes / 16, on);
  else if (row_bytes % 4 == 0 && aligned_to(table, 4) && aligned_to(out, 4))
    launch_gather<uint32_t>(table, ids, ids64, out, n_ids, vocab, row_bytes / 4, on);
  else
    launch_gather<uint16_t>(table, ids, ids64, out, n_ids, vocab, row_bytes / 2, on);
}

void embedding_backward(DType dt, DType id_dt, const void* ids, const void* dout, void* dtable, int64_t n_ids,
                        int64_t vocab, int64_t dim, bool accumulate, void* stream) {
  const bool ids64 = index_is_64(id_dt, "embedding_backward");
  if (vocab == 0 || dim == 0) return;
  XT_CHECK(n_ids <= INT32_MAX, ValueError, "embedding_backward: at most 2^31-1 ids on CUDA, got ", n_ids);
  XT_CHECK(ids64 || vocab <= INT32_MAX, ValueError, "embedding_backward: a table of ", vocab,
           " rows needs int64 ids on CUDA");
  OnStream on(stream);
  if (!accumulate)
    XT_CUDA_CHECK(cudaMemsetAsync(dtable, 0, static_cast<size_t>(vocab * dim) * dtype_size(dt), on.s));
  if (n_ids == 0) return;
  XT_DISPATCH_FLOAT(dt, "embedding_backward", T, {
    const T* pd = static_cast<const T*>(dout);
    T* pt = static_cast<T*>(dtable);
    if (ids64) backward_sorted<T>(static_cast<const uint64_t*>(ids), pd, pt, n_ids, vocab, dim, accumulate, on);
    else backward_sorted<T>(static_cast<const uint32_t*>(ids), pd, pt, n_ids, vocab, dim, accumulate, on);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
