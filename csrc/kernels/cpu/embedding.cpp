// CPU embedding kernels: forward (row gather), backward (row scatter-add), index_range.
//
// embedding_backward writes dtable with `=`: rows no id points at are zero, the others are the
// sum of their dout rows, added in increasing position order (sequential, so deterministic).
// bf16 tables accumulate in a float32 buffer and round once. Ids are trusted to be in range:
// ops::embedding checks them with index_range first.
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/kernels.h"

namespace xt {
namespace kernels {
namespace cpu {

void embedding_forward(DType dt, const void* table, DType id_dt, const void* ids, void* out, int64_t n_ids,
                       int64_t dim, void*) {
  const bool ids64 = index_is_64(id_dt, "embedding_forward");
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(dt);
  const char* t = static_cast<const char*>(table);
  char* o = static_cast<char*>(out);
  for (int64_t i = 0; i < n_ids; ++i) {
    const int64_t id = load_index(ids64, ids, i);
    std::memcpy(o + i * row_bytes, t + id * row_bytes, row_bytes);
  }
}

void embedding_backward(DType dt, DType id_dt, const void* ids, const void* dout, void* dtable, int64_t n_ids,
                        int64_t vocab, int64_t dim, void*) {
  const bool ids64 = index_is_64(id_dt, "embedding_backward");
  XT_DISPATCH_FLOAT(dt, "embedding_backward", T, {
    using C = compute_t<T>;
    const T* pd = static_cast<const T*>(dout);
    T* pt = static_cast<T*>(dtable);
    std::vector<C> acc(static_cast<size_t>(vocab * dim), C(0));
    for (int64_t i = 0; i < n_ids; ++i) {
      C* row = acc.data() + load_index(ids64, ids, i) * dim;
      const T* src = pd + i * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += load(src, j);
    }
    for (int64_t k = 0; k < vocab * dim; ++k) store(pt, k, acc[k]);
  });
}

// n == 0 gives the empty range {0, -1}.
void index_range(DType id_dt, const void* ids, int64_t n, int64_t* minmax, void*) {
  const bool ids64 = index_is_64(id_dt, "index_range");
  int64_t lo = 0, hi = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = load_index(ids64, ids, i);
    if (i == 0 || v < lo) lo = v;
    if (i == 0 || v > hi) hi = v;
  }
  minmax[0] = lo;
  minmax[1] = hi;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace xt
