// The Muon op: torch.optim.Muon's step over a list of float32 matrices, in place, no history.
//
//   buf = lerp(buf, g, 1 - mu);  u = nesterov ? lerp(g, buf, mu) : buf
//   X = bf16(u) (transposed when rows > cols);  X /= bf16(max(||X||_F, eps))
//   5 times (ns_steps):  A = X X^T;  B = b A + c A A;  X = a X + B X      (bf16, float32 accumulation)
//   p = p * (1 - lr * wd) - lr * ratio * X (transposed back)
// The elementwise parts are the muon kernels (kernels/{cpu,cuda}/muon); the iteration runs on the
// engine's gemm, the matrices whose operands have one shape as one batched GEMM per product (the
// grouping depends on the shapes only, so a run repeats bit for bit). The bf16 operands are
// temporaries of the caching allocator (in a CUDA graph, of the graph's pool). A non-finite guard
// makes the kernels that write the buffers and the parameters write nothing; the GEMMs between
// them work on temporaries only.
#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "ops/dispatch.h"

namespace xt {
namespace ops {

namespace {

// The per-step values as both the launch and a `hyper` tensor carry them, each rounded once
// from its double (torch.optim.Muon's Python scalars).
kernels::MuonParams muon_params(const char* op, double lr, double weight_decay, double momentum, bool nesterov) {
  XT_CHECK(std::isfinite(lr) && lr >= 0.0, ValueError, op, ": lr must be a finite value >= 0, got ", lr);
  XT_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, ValueError, op,
           ": weight_decay must be a finite value >= 0, got ", weight_decay);
  XT_CHECK(momentum >= 0.0 && momentum < 1.0, ValueError, op, ": momentum must be in [0, 1), got ", momentum);
  kernels::MuonParams hp;
  hp.momentum = static_cast<float>(momentum);
  hp.one_minus_momentum = static_cast<float>(1.0 - momentum);
  hp.nesterov = nesterov;
  hp.lr = static_cast<float>(lr);
  hp.decay = static_cast<float>(1.0 - lr * weight_decay);
  return hp;
}

void check_one_float(const Tensor& t, const char* op, const char* what, Device dev, int64_t numel) {
  XT_CHECK(!t.defined() || (t.dtype() == DType::Float32 && t.numel() == numel && t.device() == dev), TypeError, op,
           ": ", what, " must be a ", numel, "-element float32 tensor on ", dev.str(), ", got ",
           t.defined() ? t.describe() : std::string());
}

// One shape of Newton-Schulz operand ([r, c], r <= c) and the matrices that have it.
struct Group {
  int64_t r, c;
  std::vector<size_t> members;
  Tensor x;  // [n, r, c] bf16
};

}  // namespace

std::vector<float> muon_consts(double lr, double weight_decay) {
  const kernels::MuonParams hp = muon_params("muon_consts", lr, weight_decay, 0.0, true);
  return {hp.decay, hp.lr};
}

void muon_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               const std::vector<Tensor>& momentum_buffers, double lr, double weight_decay, double momentum,
               bool nesterov, const std::vector<double>& ns_coefficients, int64_t ns_steps, double eps,
               const std::vector<double>& lr_ratios, const Tensor& guard, const Tensor& clip_norm, double max_norm,
               const Tensor& hyper) {
  const char* op = "muon_step";
  const size_t n = params.size();
  XT_CHECK(grads.size() == n && momentum_buffers.size() == n && lr_ratios.size() == n, ValueError, op,
           ": params, grads, momentum_buffers and lr_ratios must have the same length, got ", n, ", ", grads.size(),
           ", ", momentum_buffers.size(), ", ", lr_ratios.size());
  kernels::MuonParams hp = muon_params(op, lr, weight_decay, momentum, nesterov);
  XT_CHECK(ns_coefficients.size() == 3, ValueError, op, ": ns_coefficients must be three values (a, b, c), got ",
           ns_coefficients.size());
  for (double v : ns_coefficients)
    XT_CHECK(std::isfinite(v), ValueError, op, ": ns_coefficients must be finite, got ", v);
  XT_CHECK(ns_steps >= 1 && ns_steps < 100, ValueError, op, ": ns_steps must be in [1, 100), got ", ns_steps);
  XT_CHECK(std::isfinite(eps) && eps > 0.0, ValueError, op, ": eps must be a finite value > 0, got ", eps);
  for (size_t i = 0; i < n; ++i)
    XT_CHECK(std::isfinite(lr_ratios[i]) && lr_ratios[i] > 0.0, ValueError, op, ": lr_ratios[", i,
             "] must be a finite value > 0, got ", lr_ratios[i]);
  if (n == 0) return;
  check_defined(params[0], "params[0]");
  const Device dev = params[0].device();
  check_one_float(guard, op, "guard", dev, 1);
  check_one_float(clip_norm, op, "clip_norm", dev, 1);
  check_one_float(hyper, op, "hyper", dev, 2);
  XT_CHECK(!clip_norm.defined() || (max_norm > 0.0 && std::isfinite(max_norm)), ValueError, op,
           ": max_norm must be a finite value > 0 with clip_norm, got ", max_norm);
  const Tensor* lists[3] = {&params[0], &grads[0], &momentum_buffers[0]};
  const char* names[3] = {"params", "grads", "momentum_buffers"};
  for (size_t i = 0; i < n; ++i) {
    for (int k = 0; k < 3; ++k) {
      const Tensor& t = lists[k][i];
      XT_CHECK(t.defined(), ValueError, op, ": ", names[k], "[", i, "] is not a tensor");
      XT_CHECK(t.dtype() == DType::Float32, TypeError, op, ": ", names[k], "[", i, "] must be float32, got ",
               t.describe());
      XT_CHECK(t.device() == dev, ValueError, op, ": ", names[k], "[", i, "] is ", t.describe(),
               " but params[0] is on ", dev.str(), "; all tensors must share one device");
    }
    XT_CHECK(params[i].dim() == 2, ValueError, op, ": Muon updates 2-D matrices; params[", i, "] is ",
             params[i].describe());
    XT_CHECK(grads[i].shape() == params[i].shape() && momentum_buffers[i].shape() == params[i].shape(), ValueError,
             op, ": tensors at index ", i, " differ in shape: param ", params[i].describe(), ", grad ",
             grads[i].describe(), ", momentum_buffer ", momentum_buffers[i].describe());
  }
  if (hyper.defined()) hp.hyper = hyper.data<float>();

  // Operands grouped by shape, in order of first appearance.
  std::vector<Group> groups;
  std::vector<int64_t> rows(n), cols(n), sizes(n);
  for (size_t i = 0; i < n; ++i) {
    rows[i] = params[i].size(0);
    cols[i] = params[i].size(1);
    sizes[i] = rows[i] * cols[i];
    const int64_t r = std::min(rows[i], cols[i]), c = std::max(rows[i], cols[i]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.r == r && g.c == c; });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{r, c, {}, Tensor()});
    it->members.push_back(i);
  }
  std::vector<void*> x(n);
  for (Group& g : groups) {
    g.x = Tensor::empty({static_cast<int64_t>(g.members.size()), g.r, g.c}, DType::BFloat16, dev);
    for (size_t k = 0; k < g.members.size(); ++k)
      x[g.members[k]] = static_cast<char*>(g.x.data_ptr()) + static_cast<int64_t>(k) * g.r * g.c * 2 /* bf16 bytes */;
  }

  std::vector<float*> p(n), buf(n);
  std::vector<const float*> g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = params[i].data<float>();
    g[i] = grads[i].data<float>();
    buf[i] = momentum_buffers[i].data<float>();
    params[i].bump_version();  // updated in place
    momentum_buffers[i].bump_version();
  }
  void* stream = stream_for(dev);
  const int count = static_cast<int>(n);
  XT_KERNEL(dev, muon_momentum, count, g.data(), buf.data(), x.data(), rows.data(), cols.data(), hp,
            guard.defined() ? guard.data<float>() : nullptr, clip_norm.defined() ? clip_norm.data<float>() : nullptr,
            static_cast<float>(max_norm), stream);
  XT_KERNEL(dev, muon_normalize, count, x.data(), sizes.data(), static_cast<float>(eps), stream);

  const float a = static_cast<float>(ns_coefficients[0]), b = static_cast<float>(ns_coefficients[1]),
              c = static_cast<float>(ns_coefficients[2]);
  const DType bf = DType::BFloat16;
  for (Group& grp : groups) {
    const int64_t batch = static_cast<int64_t>(grp.members.size()), r = grp.r, cc = grp.c;
    if (r == 0) continue;  // empty matrices: nothing to orthogonalise or apply
    Tensor gram = Tensor::empty({batch, r, r}, bf, dev);
    Tensor poly = Tensor::empty({batch, r, r}, bf, dev);
    Tensor next = Tensor::empty({batch, r, cc}, bf, dev);
    for (int64_t s = 0; s < ns_steps; ++s) {
      // gram = X X^T
      XT_KERNEL(dev, gemm, bf, bf, false, true, r, r, cc, 1.0f, grp.x.data_ptr(), grp.x.data_ptr(), 0.0f,
                gram.data_ptr(), batch, r * cc, r * cc, r * r, stream);
      // poly = b gram + c gram gram
      copy_(poly, gram);
      XT_KERNEL(dev, gemm, bf, bf, false, false, r, r, r, c, gram.data_ptr(), gram.data_ptr(), b, poly.data_ptr(),
                batch, r * r, r * r, r * r, stream);
      // next = a X + poly X
      copy_(next, grp.x);
      XT_KERNEL(dev, gemm, bf, bf, false, false, r, cc, r, 1.0f, poly.data_ptr(), grp.x.data_ptr(), a,
                next.data_ptr(), batch, r * r, r * cc, r * cc, stream);
      std::swap(grp.x, next);
    }
    for (size_t k = 0; k < grp.members.size(); ++k)
      x[grp.members[k]] = static_cast<char*>(grp.x.data_ptr()) + static_cast<int64_t>(k) * r * cc * 2;
  }

  std::vector<float> ratios(lr_ratios.begin(), lr_ratios.end());
  std::vector<const void*> xc(x.begin(), x.end());
  XT_KERNEL(dev, muon_apply, count, p.data(), xc.data(), rows.data(), cols.data(), ratios.data(), hp,
            guard.defined() ? guard.data<float>() : nullptr, stream);
}

}  // namespace ops
}  // namespace xt
