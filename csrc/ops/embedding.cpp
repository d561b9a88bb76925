// Embedding: out = table[ids], a row gather with an id range check; the backward scatters dout
// rows into a fresh dtable (deterministic order, see the kernels). The node saves the ids only.
//
// The range check is exact: min and max of the ids against [0, vocab). Ids that came from the
// host (xtrain.tensor of a numpy array, the training loop's case) carry their range from there
// and need nothing more. Other CUDA ids take one small device reduction and a 16-byte copy to
// the host, which waits for the stream (a documented sync point).
#include "core/cuda_api.h"
#include "core/error.h"
#include "ops/dispatch.h"
#include "tape/node.h"

namespace xt {
namespace ops {

namespace {

void check_ids(const Tensor& ids, const char* op) {
  check_defined(ids, "ids");
  XT_CHECK(is_integral(ids.dtype()), TypeError, op, ": ids must be int32 or int64, got ", ids.describe());
}

// Raises IndexError unless every id is in [0, vocab).
void check_id_range(const Tensor& ids, int64_t vocab, const char* op) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  const Device dev = ids.device();
  int64_t mm[2] = {0, -1};
  if (dev.is_cpu()) {
    kernels::cpu::index_range(ids.dtype(), ids.data_ptr(), n, mm, nullptr);
  } else if (ids.storage()->range_known) {  // written from the host: no sync (core/tensor.h)
    mm[0] = ids.storage()->known_min;
    mm[1] = ids.storage()->known_max;
  } else {
    Tensor dmm = Tensor::empty({2}, DType::Int64, dev);
    XT_KERNEL(dev, index_range, ids.dtype(), ids.data_ptr(), n, dmm.data<int64_t>(), stream_for(dev));
    cuda::copy_bytes(mm, Device::cpu(), dmm.data_ptr(), dev, sizeof(mm));  // sync point: range check
  }
  XT_CHECK(mm[0] >= 0 && mm[1] < vocab, IndexError, op, ": ids must be in [0, ", vocab, "), got values in [",
           mm[0], ", ", mm[1], "] (ids ", ids.describe(), ")");
}

}  // namespace

Tensor embedding_forward(const Tensor& table, const Tensor& ids) {
  check_floating(table, "embedding", "weight");
  check_dim(table, 2, "embedding", "weight");
  check_ids(ids, "embedding");
  check_same_device(table, ids, "embedding", "weight", "ids");
  const int64_t vocab = table.size(0), dim = table.size(1);
  check_id_range(ids, vocab, "embedding");
  Shape shape = ids.shape();
  shape.push_back(dim);
  Tensor out = Tensor::empty(shape, table.dtype(), table.device());
  if (out.numel())
    XT_KERNEL(table.device(), embedding_forward, table.dtype(), table.data_ptr(), ids.dtype(), ids.data_ptr(),
              out.data_ptr(), ids.numel(), dim, stream_for(table.device()));
  return out;
}

Tensor embedding_backward(const Tensor& ids, const Tensor& dout, int64_t vocab, DType table_dtype) {
  check_ids(ids, "embedding_backward");
  check_floating(dout, "embedding_backward", "dout");
  check_same_device(ids, dout, "embedding_backward", "ids", "dout");
  XT_CHECK(dout.dtype() == table_dtype, TypeError, "embedding_backward: dout ", dout.describe(),
           " must have the table's dtype ", dtype_name(table_dtype));
  XT_CHECK(vocab >= 0, ValueError, "embedding_backward: vocab must be >= 0, got ", vocab);
  XT_CHECK(dout.dim() == ids.dim() + 1 && Shape(dout.shape().begin(), dout.shape().end() - 1) == ids.shape(),
           ValueError, "embedding_backward: dout ", dout.describe(), " must have shape ids.shape + [dim] (ids ",
           ids.describe(), ")");
  // On the CPU the check is as cheap as the scatter itself; it guards against ids edited in
  // place since the forward. On CUDA the forward's check stands (no second sync).
  if (ids.device().is_cpu()) check_id_range(ids, vocab, "embedding_backward");
  const int64_t dim = dout.shape().back();
  Tensor dtable = Tensor::empty({vocab, dim}, table_dtype, dout.device());
  if (dtable.numel())
    XT_KERNEL(dout.device(), embedding_backward, table_dtype, ids.dtype(), ids.data_ptr(), dout.data_ptr(),
              dtable.data_ptr(), ids.numel(), vocab, dim, stream_for(dout.device()));
  return dtable;
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
    return {embedding_backward(ids, grads[0], vocab_, dtype_)};
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
