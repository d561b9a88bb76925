// CUDA Muon kernels' launchers: the elementwise parts of a Muon step (the Newton-Schulz GEMMs are
// the engine's gemm, called by ops/muon.cpp); the kernels are in muon.cuh.
//
//  - The matrix list travels in the kernel's parameters (up to kMaxMatrices per launch; longer
//    lists take a few launches), so nothing is copied to the device and nothing waits on the host.
//  - A non-finite guard (the step's loss or gradient norm, on the device) makes momentum and
//    apply return before writing anything; the clip norm scales each gradient as it is read.
//  - muon_apply reads [decay, lr] from device memory when hp.hyper is set (CUDA graphs).
#include <vector>

#include "kernels/cuda/muon.cuh"

namespace xt {
namespace kernels {
namespace cuda {

namespace {

using muon::kChunk;
using muon::kMaxMatrices;
using muon::kMuonThreads;
using muon::kNormThreads;
using muon::MatrixList;

// Splits the matrices (empty ones skipped) into lists of at most kMaxMatrices and calls
// fn(list) for each, in order; fill(list, slot, i) sets the pointers of matrix i.
template <typename Fill, typename Fn>
void for_each_matrix_list(int n, const int64_t* rows, const int64_t* cols, Fill&& fill, Fn&& fn) {
  MatrixList L;
  auto flush = [&] {
    if (L.n == 0) return;
    fn(L);
    L.n = 0;
  };
  L.start[0] = 0;
  for (int i = 0; i < n; ++i) {
    if (rows[i] * cols[i] == 0) continue;
    L.rows[L.n] = rows[i];
    L.cols[L.n] = cols[i];
    fill(L, L.n, i);
    L.start[L.n + 1] = L.start[L.n] + rows[i] * cols[i];
    if (++L.n == kMaxMatrices) flush();
  }
  flush();
}

unsigned chunks_of(const MatrixList& L) { return static_cast<unsigned>(ceil_div(L.start[L.n], kChunk)); }

}  // namespace

void muon_momentum(int n_tensors, const float* const* grads, float* const* bufs, void* const* x, const int64_t* rows,
                   const int64_t* cols, MuonParams hp, const float* guard, const float* clip_norm, float max_norm,
                   void* stream) {
  OnStream on(stream);
  for_each_matrix_list(
      n_tensors, rows, cols,
      [&](MatrixList& L, int s, int i) {
        L.g[s] = grads[i];
        L.f[s] = bufs[i];
        L.x[s] = static_cast<bf16_t*>(x[i]);
      },
      [&](const MatrixList& L) {
        muon::muon_momentum_kernel<<<chunks_of(L), kMuonThreads, 0, on.s>>>(L, hp, guard, clip_norm, max_norm);
        XT_LAUNCH_CHECK();
      });
}

void muon_normalize(int n_tensors, void* const* x, const int64_t* sizes, float eps, void* stream) {
  OnStream on(stream);
  std::vector<int64_t> ones(static_cast<size_t>(n_tensors), 1);
  for_each_matrix_list(
      n_tensors, sizes, ones.data(), [&](MatrixList& L, int s, int i) { L.x[s] = static_cast<bf16_t*>(x[i]); },
      [&](const MatrixList& L) {
        muon::muon_normalize_kernel<<<static_cast<unsigned>(L.n), kNormThreads, 0, on.s>>>(L, eps);
        XT_LAUNCH_CHECK();
      });
}

void muon_apply(int n_tensors, float* const* params, const void* const* x, const int64_t* rows, const int64_t* cols,
                const float* scales, MuonParams hp, const float* guard, void* stream) {
  OnStream on(stream);
  for_each_matrix_list(
      n_tensors, rows, cols,
      [&](MatrixList& L, int s, int i) {
        L.f[s] = params[i];
        L.x[s] = static_cast<bf16_t*>(const_cast<void*>(x[i]));
        L.scale[s] = scales[i];
      },
      [&](const MatrixList& L) {
        muon::muon_apply_kernel<<<chunks_of(L), kMuonThreads, 0, on.s>>>(L, hp, guard);
        XT_LAUNCH_CHECK();
      });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
