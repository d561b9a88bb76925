// CPU embedding kernels: forward (row gather) and backward (row scatter-add).
//
// embedding_backward writes dtable with `=`: rows no id points at are zero, the others are the
// sum of their dout rows, added in increasing position order (sequential, so deterministic).
// bf16 tables accumulate in a float32 buffer and round once. With accumulate (float32/float64
// tables, whose compute type is their own) each element becomes dtable + that sum: the bits of
// adding the written gradient to dtable afterwards. ops::embedding raises for ids
// outside [0, vocab) before calling these; one that gets here anyway reads nothing (a zero row;
// its dout row skipped), as on CUDA.
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

void embedding_forward(DType dt, const void* table, DType id_dt, const void* ids, void* out, int64_t n_ids,
                       int64_t vocab, int64_t dim, void*) {
  const bool ids64 = index_is_64(id_dt, "embedding_forward");
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(dt);
  const char* t = static_cast<const char*>(table);
  char* o = static_cast<char*>(out);
  for (int64_t i = 0; i < n_ids; ++i) {
    const int64_t id = load_index(ids64, ids, i);
    if (id >= 0 && id < vocab) std::memcpy(o + i * row_bytes, t + id * row_bytes, row_bytes);
    else std::memset(o + i * row_bytes, 0, row_bytes);
  }
}

void embedding_backward(DType dt, DType id_dt, const void* ids, const void* dout, void* dtable, int64_t n_ids,
                        int64_t vocab, int64_t dim, bool accumulate, void*) {
  const bool ids64 = index_is_64(id_dt, "embedding_backward");
  XT_DISPATCH_FLOAT(dt, "embedding_backward", T, {
    using C = compute_t<T>;
    const T* pd = static_cast<const T*>(dout);
    T* pt = static_cast<T*>(dtable);
    std::vector<C> acc(static_cast<size_t>(vocab * dim), C(0));
    for (int64_t i = 0; i < n_ids; ++i) {
      const int64_t id = load_index(ids64, ids, i);
      if (id < 0 || id >= vocab) continue;
      C* row = acc.data() + id * dim;
      const T* src = pd + i * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += load(src, j);
    }
    if (accumulate)
      for (int64_t k = 0; k < vocab * dim; ++k) store(pt, k, load(pt, k) + acc[k]);
    else
      for (int64_t k = 0; k < vocab * dim; ++k) store(pt, k, acc[k]);
  });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
