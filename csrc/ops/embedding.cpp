// Embedding: out = table[ids], a row gather with an id range check; the backward scatters dout
// rows into a fresh dtable (deterministic order, see the kernels), or straight into the table's
// gradient slot when the leaf has one free (claim_grad_buffer: the parameter store's flat
// gradients; for a V x dim float32 table that saves a copy of the whole table's gradient). The
// node saves the ids only.
//
// Ids outside [0, vocab) raise IndexError. On the CPU the ids are scanned before the kernel runs
// (min and max against the range). On CUDA the kernels check them as they read them (Note
// [Device-side index checks], core/cuda/cuda_check.h): a bad id reads nothing and the IndexError
// is raised at the next sync point (item(), numpy(), synchronize()), so no host sync is added.
#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/engine.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

void check_ids(const Tensor& ids, const char* op) {
  check_defined(ids, "ids");
  XT_CHECK(is_integral(ids.dtype()), TypeError, op, ": ids must be int32 or int64, got ", ids.describe());
}

// CPU ids: IndexError unless every id is in [0, vocab). (CUDA ids: the kernels check them.)
void check_cpu_id_range(const Tensor& ids, int64_t vocab, const char* op) {
  const int64_t n = ids.numel();
  if (!ids.device().is_cpu() || n == 0) return;
  const bool i32 = ids.dtype() == DType::Int32;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = i32 ? static_cast<int64_t>(ids.data<int32_t>()[i]) : ids.data<int64_t>()[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  XT_CHECK(lo >= 0 && hi < vocab, IndexError, op, ": ids must be in [0, ", vocab, "), got values in [", lo, ", ", hi,
           "] (ids ", ids.describe(), ")");
}

}  // namespace

Tensor embedding_forward(const Tensor& table, const Tensor& ids) {
  check_floating(table, "embedding", "weight");
  check_dim(table, 2, "embedding", "weight");
  check_ids(ids, "embedding");
  check_same_device(table, ids, "embedding", "weight", "ids");
  const int64_t vocab = table.size(0), dim = table.size(1);
  check_cpu_id_range(ids, vocab, "embedding");
  Shape shape = ids.shape();
  shape.push_back(dim);
  Tensor out = Tensor::empty(shape, table.dtype(), table.device());
  if (out.numel())
    XT_KERNEL(table.device(), embedding_forward, table.dtype(), table.data_ptr(), ids.dtype(), ids.data_ptr(),
              out.data_ptr(), ids.numel(), vocab, dim, stream_for(table.device()));
  return out;
}

namespace {

// embedding_backward writing into `dtable` when it is defined (a claimed gradient slot), or with
// accumulate adding into it (another use's gradient, take_pending_grad).
Tensor embedding_backward_into(const Tensor& ids, const Tensor& dout, int64_t vocab, DType table_dtype, Tensor dtable,
                               bool accumulate = false) {
  check_ids(ids, "embedding_backward");
  check_floating(dout, "embedding_backward", "dout");
  check_same_device(ids, dout, "embedding_backward", "ids", "dout");
  XT_CHECK(dout.dtype() == table_dtype, TypeError, "embedding_backward: dout ", dout.describe(),
           " must have the table's dtype ", dtype_name(table_dtype));
  XT_CHECK(vocab >= 0, ValueError, "embedding_backward: vocab must be >= 0, got ", vocab);
  XT_CHECK(dout.dim() == ids.dim() + 1 && Shape(dout.shape().begin(), dout.shape().end() - 1) == ids.shape(),
           ValueError, "embedding_backward: dout ", dout.describe(), " must have shape ids.shape + [dim] (ids ",
           ids.describe(), ")");
  check_cpu_id_range(ids, vocab, "embedding_backward");  // as cheap as the scatter itself
  const int64_t dim = dout.shape().back();
  if (!dtable.defined()) dtable = Tensor::empty({vocab, dim}, table_dtype, dout.device());
  // Adding into a table rounded to bf16 would round twice (the sum, then the add): float32/float64.
  XT_CHECK(!accumulate || table_dtype == DType::Float32 || table_dtype == DType::Float64, ValueError,
           "embedding_backward: accumulating needs a float32 or float64 table, got ", dtype_name(table_dtype));
  if (accumulate) dtable.bump_version();
  if (dtable.numel())
    XT_KERNEL(dout.device(), embedding_backward, table_dtype, ids.dtype(), ids.data_ptr(), dout.data_ptr(),
              dtable.data_ptr(), ids.numel(), vocab, dim, accumulate, stream_for(dout.device()));
  return dtable;
}

}  // namespace

Tensor embedding_backward(const Tensor& ids, const Tensor& dout, int64_t vocab, DType table_dtype) {
  return embedding_backward_into(ids, dout, vocab, table_dtype, Tensor());
}

namespace {

class EmbeddingBackward : public NodeWithSaved<1> {
 public:
  EmbeddingBackward(const Tensor& ids, int64_t vocab, DType dtype)
      : NodeWithSaved({SavedTensor("ids", ids)}), vocab_(vocab), dtype_(dtype) {}
  const char* name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    const auto [ids] = unpack();
    const Shape shape{vocab_, grads[0].dim() ? grads[0].shape().back() : 0};
    const Device dev = grads[0].device();
    // A tied table: the head's gradient, already held, takes the rows' sums (Note [Summing
    // gradients in place], tape/engine.cpp); float32/float64, whose sum rounds as the walk's add.
    if (dtype_ == DType::Float32 || dtype_ == DType::Float64) {
      Tensor pending = take_pending_grad(next_edges[0], shape, dtype_, dev);
      if (pending.defined()) return {embedding_backward_into(ids, grads[0], vocab_, dtype_, pending, true)};
    }
    return {embedding_backward_into(ids, grads[0], vocab_, dtype_,
                                    claim_grad_buffer(next_edges[0], shape, dtype_, dev))};
  }

 private:
  int64_t vocab_;
  DType dtype_;
};

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids) {
  Tensor out = embedding_forward(table, ids);
  if (needs_grad({&table})) set_history(out, make_node<EmbeddingBackward>({table}, ids, table.size(0), table.dtype()));
  return out;
}

}  // namespace ops
}  // namespace xt
