// A host emulation of the CUDA execution model, enough to run the flash attention kernels
// (csrc/kernels/cuda/flash_attention.cuh) on the CPU: every thread of a block is a fiber
// (ucontext), blocks run one after another, and the warp-level primitives of
// csrc/kernels/cuda/mma.cuh are emulated from their PTX ISA definitions.
//
//  - Sync points: __syncthreads (all live threads of the block), and the warp collectives
//    __shfl_xor_sync, __syncwarp, ldmatrix (ldsm_x4, ldsm_x4_trans) and mma (mma_bf16), which
//    need all 32 lanes of the warp at the same primitive. A divergent collective, a barrier some
//    threads never reach, or a collective with exited lanes aborts with a message.
//  - Schedules (set_schedule), whose results must agree bit for bit:
//    Lockstep: between sync points the threads run one at a time, in thread order (or reversed),
//      and every warp whose lanes all reached a collective advances, so warps move in step.
//    WarpSerial: only the lowest warp that can advance does, so one warp runs ahead to the next
//      __syncthreads before the others start.
//    cp.async copies land when cp_async_wait retires their group ("lazy": a tile read before its
//      wait, or before the barrier after another warp's wait, reads stale data), or at issue with
//      WarpSerialEager (a prefetch into a buffer other warps still read, a missing barrier, shows).
//    Dynamic shared memory starts each block filled with 0xFF bytes (bf16 NaN); static __shared__
//    variables keep what the previous block left.
//  - mma computes D = A B + C in double and rounds to float: the emulation checks indexing and
//    data flow, not the hardware's rounding.
// Compile the kernels with -DXT_CUDA_EMULATION and this header first (-include cuda_emu.h).
#pragma once
#ifndef XT_CUDA_EMULATION
#define XT_CUDA_EMULATION 1
#endif
// A __shared__ variable (block_sum's partials) is one static object that the threads of the block
// share; blocks run one after another, so one copy per variable is enough. Defined before the CUDA
// headers, which otherwise make it an attribute that the host compiler ignores (a copy per thread).
#define __shared__ static
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define __launch_bounds__(...)

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace emu {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s (block %u,%u,%u thread %u)\n", what, blockIdx.x, blockIdx.y, blockIdx.z,
               threadIdx.x);
  std::abort();
}

enum class Wait { None, Barrier, Warp, Done };
enum class Schedule { Lockstep, LockstepReversed, WarpSerialLazy, WarpSerialEager };
enum class Op { Shfl, SyncWarp, Ldsm, LdsmTrans, Mma };

struct Copy {
  void* dst;
  const void* src;
  int bytes;
  bool valid;
};

struct Fiber {
  ucontext_t ctx;
  Wait wait = Wait::None;
  unsigned tid = 0;
  // the collective this lane waits in: its inputs, then its outputs
  Op op = Op::SyncWarp;
  const void* ptr = nullptr;
  uint32_t regs[6] = {};
  float acc[4] = {};
  uint64_t bits = 0;
  int xor_mask = 0;
  std::vector<Copy> open;                 // cp.async not yet committed
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
};

constexpr size_t kStack = 256 * 1024;
constexpr size_t kSmem = 228 * 1024;

struct State {
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;  // one per thread, kept from block to block
  ucontext_t sched;
  int cur = -1;
  std::function<void()> body;
  alignas(128) unsigned char smem[kSmem];
  size_t smem_bytes = 0;
  Schedule schedule = Schedule::Lockstep;
  uint64_t switches = 0;
};

inline State& st() {
  static State* s = new State();
  return *s;
}
inline Fiber& me() { return st().fibers[st().cur]; }

inline void yield(Wait w) {
  State& s = st();
  Fiber& f = s.fibers[s.cur];
  f.wait = w;
  ++s.switches;
  swapcontext(&f.ctx, &s.sched);
}

inline void fiber_main() {
  State& s = st();
  s.body();
  s.fibers[s.cur].wait = Wait::Done;
  swapcontext(&s.fibers[s.cur].ctx, &s.sched);
}

inline uint16_t bf16_bits(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float bf16_value(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

inline void check_smem(const void* p, size_t bytes, size_t align, const char* what) {
  const State& s = st();
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < s.smem || c + bytes > s.smem + s.smem_bytes) fail(what);
  if (reinterpret_cast<uintptr_t>(p) % align) fail(what);
}

// All 32 lanes of a warp wait in the same collective: compute every lane's result.
inline void resolve(Fiber* L) {
  const Op op = L[0].op;
  for (int l = 0; l < 32; ++l)
    if (L[l].op != op) fail("lanes of a warp wait in different collectives");
  switch (op) {
    case Op::SyncWarp: break;
    case Op::Shfl: {
      uint64_t in[32];
      for (int l = 0; l < 32; ++l) in[l] = L[l].bits;
      for (int l = 0; l < 32; ++l) L[l].bits = in[(l ^ L[l].xor_mask) & 31];
      break;
    }
    case Op::Ldsm:
    case Op::LdsmTrans: {
      // lane l addresses row l % 8 of matrix l / 8; r[i] of lane l = row l/4, elements 2(l%4), +1 of
      // matrix i (trans: elements (2(l%4), l/4) and (2(l%4)+1, l/4)).
      const unsigned char* rows[32];
      for (int l = 0; l < 32; ++l) {
        check_smem(L[l].ptr, 16, 16, "ldmatrix row outside shared memory or not 16-byte aligned");
        rows[l] = static_cast<const unsigned char*>(L[l].ptr);
      }
      for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i) {
          if (op == Op::Ldsm) {
            const unsigned char* r = rows[8 * i + l / 4];
            L[l].regs[i] = pair(bf16_bits(r + 4 * (l % 4)), bf16_bits(r + 4 * (l % 4) + 2));
          } else {
            const unsigned char* r0 = rows[8 * i + 2 * (l % 4)];
            const unsigned char* r1 = rows[8 * i + 2 * (l % 4) + 1];
            L[l].regs[i] = pair(bf16_bits(r0 + 2 * (l / 4)), bf16_bits(r1 + 2 * (l / 4)));
          }
        }
      break;
    }
    case Op::Mma: {
      // m16n8k16: A 16x16 (regs 0-3), B 16x8 k x n (regs 4-5), C/D 16x8 (acc).
      double A[16][16], B[16][8], C[16][8];
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const uint32_t* a = L[l].regs;
        const int arow[4] = {g, g + 8, g, g + 8}, acol[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; ++i) {
          A[arow[i]][acol[i]] = bf16_value(a[i] & 0xFFFF);
          A[arow[i]][acol[i] + 1] = bf16_value(a[i] >> 16);
        }
        B[2 * t][g] = bf16_value(a[4] & 0xFFFF);
        B[2 * t + 1][g] = bf16_value(a[4] >> 16);
        B[2 * t + 8][g] = bf16_value(a[5] & 0xFFFF);
        B[2 * t + 9][g] = bf16_value(a[5] >> 16);
        C[g][2 * t] = L[l].acc[0];
        C[g][2 * t + 1] = L[l].acc[1];
        C[g + 8][2 * t] = L[l].acc[2];
        C[g + 8][2 * t + 1] = L[l].acc[3];
      }
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const int row[4] = {g, g, g + 8, g + 8}, col[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
        for (int i = 0; i < 4; ++i) {
          double d = C[row[i]][col[i]];
          for (int kk = 0; kk < 16; ++kk) d += A[row[i]][kk] * B[kk][col[i]];
          L[l].acc[i] = static_cast<float>(d);
        }
      }
      break;
    }
  }
  for (int l = 0; l < 32; ++l) L[l].wait = Wait::None;
}

inline void run_block(unsigned nthreads) {
  State& s = st();
  if (nthreads % 32) fail("block size must be a multiple of 32");
  s.fibers.clear();
  s.fibers.resize(nthreads);
  if (s.stacks.size() < nthreads) s.stacks.resize(nthreads, std::vector<char>(kStack));
  for (unsigned t = 0; t < nthreads; ++t) {
    Fiber& f = s.fibers[t];
    f.tid = t;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = s.stacks[t].data();
    f.ctx.uc_stack.ss_size = s.stacks[t].size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
  }
  std::memset(s.smem, 0xFF, s.smem_bytes);
  for (;;) {
    const bool serial = s.schedule == Schedule::WarpSerialLazy || s.schedule == Schedule::WarpSerialEager;
    unsigned first = 0, last = nthreads;  // the threads to run: all, or the lowest runnable warp's
    if (serial) {
      unsigned t = 0;
      while (t < nthreads && s.fibers[t].wait != Wait::None) ++t;
      first = t / 32 * 32;
      last = t < nthreads ? first + 32 : first;
    }
    for (unsigned k = first; k < last; ++k) {
      const unsigned t = s.schedule == Schedule::LockstepReversed ? nthreads - 1 - k : k;
      Fiber& f = s.fibers[t];
      if (f.wait != Wait::None) continue;
      s.cur = static_cast<int>(t);
      threadIdx = dim3(t, 0, 0);
      swapcontext(&s.sched, &f.ctx);
    }
    unsigned done = 0, barrier = 0, runnable = 0;
    bool resolved = false;
    for (unsigned w = 0; w < nthreads / 32; ++w) {
      Fiber* L = &s.fibers[32 * w];
      int at_warp = 0, runnable = 0;
      for (int l = 0; l < 32; ++l) {
        at_warp += L[l].wait == Wait::Warp;
        runnable += L[l].wait == Wait::None;
      }
      if (at_warp == 32) {
        if (resolved && serial) continue;  // one warp at a time
        resolve(L);
        resolved = true;
      } else if (at_warp > 0 && runnable == 0) {
        threadIdx = dim3(32 * w, 0, 0);
        fail("a warp collective that not all 32 lanes reach (divergence or exited lanes)");
      }
    }
    for (const Fiber& f : s.fibers) {
      done += f.wait == Wait::Done;
      barrier += f.wait == Wait::Barrier;
      runnable += f.wait == Wait::None;
    }
    if (done == nthreads) return;
    if (runnable > 0) continue;
    if (barrier + done == nthreads) {
      for (Fiber& f : s.fibers)
        if (f.wait == Wait::Barrier) f.wait = Wait::None;
      continue;
    }
    fail("deadlock: some threads wait at __syncthreads, others nowhere");
  }
}

// Runs call() (one kernel invocation with its arguments) as every thread of every block.
inline void launch(dim3 grid, dim3 block, size_t smem_bytes, std::function<void()> call) {
  State& s = st();
  if (smem_bytes > kSmem) fail("dynamic shared memory above the emulator's 228 KB");
  if (block.y != 1 || block.z != 1) fail("only 1-D blocks are emulated");
  s.body = std::move(call);
  s.smem_bytes = smem_bytes;
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = dim3(x, y, z);
        run_block(block.x);
      }
}

inline void set_schedule(Schedule schedule) { st().schedule = schedule; }

}  // namespace emu

inline void __syncthreads() { emu::yield(emu::Wait::Barrier); }
inline void __threadfence_system() {}  // threads of the emulation share one memory, in order

inline void __syncwarp(unsigned = 0xffffffffu) {
  emu::me().op = emu::Op::SyncWarp;
  emu::yield(emu::Wait::Warp);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  if (mask != 0xffffffffu) emu::fail("only full-warp shuffles are emulated");
  emu::Fiber& f = emu::me();
  f.op = emu::Op::Shfl;
  f.xor_mask = lane_mask;
  f.bits = 0;
  std::memcpy(&f.bits, &v, sizeof(T));
  emu::yield(emu::Wait::Warp);
  T r;
  std::memcpy(&r, &emu::me().bits, sizeof(T));
  return r;
}

namespace xt {
namespace kernels {
namespace cuda {

inline unsigned char* dynamic_smem() { return emu::st().smem; }

inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::Fiber& f = emu::me();
  f.op = emu::Op::Mma;
  for (int i = 0; i < 4; ++i) f.regs[i] = a[i];
  f.regs[4] = b0;
  f.regs[5] = b1;
  for (int i = 0; i < 4; ++i) f.acc[i] = c[i];
  emu::yield(emu::Wait::Warp);
  for (int i = 0; i < 4; ++i) c[i] = emu::me().acc[i];
}

inline void ldsm(uint32_t (&r)[4], const void* smem, emu::Op op) {
  emu::Fiber& f = emu::me();
  f.op = op;
  f.ptr = smem;
  emu::yield(emu::Wait::Warp);
  for (int i = 0; i < 4; ++i) r[i] = emu::me().regs[i];
}
inline void ldsm_x4(uint32_t (&r)[4], const void* smem) { ldsm(r, smem, emu::Op::Ldsm); }
inline void ldsm_x4_trans(uint32_t (&r)[4], const void* smem) { ldsm(r, smem, emu::Op::LdsmTrans); }

inline void cp_async(void* smem, const void* gmem, int bytes, bool valid) {
  emu::check_smem(smem, bytes, bytes, "cp.async destination outside shared memory or misaligned");
  if (valid && reinterpret_cast<uintptr_t>(gmem) % bytes) emu::fail("cp.async source misaligned");
  if (emu::st().schedule == emu::Schedule::WarpSerialEager) {  // lands at once
    if (valid) std::memcpy(smem, gmem, bytes);
    else std::memset(smem, 0, bytes);
    return;
  }
  emu::me().open.push_back({smem, gmem, bytes, valid});
}
inline void cp_async16(void* smem, const void* gmem, bool valid) { cp_async(smem, gmem, 16, valid); }
inline void cp_async4(void* smem, const void* gmem, bool valid) { cp_async(smem, gmem, 4, valid); }

inline void cp_async_commit() {
  emu::Fiber& f = emu::me();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

template <int N>
inline void cp_async_wait() {
  emu::Fiber& f = emu::me();
  while (f.groups.size() > static_cast<size_t>(N)) {
    for (const emu::Copy& c : f.groups.front()) {
      if (c.valid) std::memcpy(c.dst, c.src, c.bytes);
      else std::memset(c.dst, 0, c.bytes);
    }
    f.groups.erase(f.groups.begin());
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace xt
