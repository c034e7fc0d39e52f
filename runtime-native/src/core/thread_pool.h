// The thread pool of the CPU kernels (GEMM tiles, norms, losses, activations, attention heads, the
// optimizer).
//
// parallelFor(n, grain, fn) calls fn(begin, end) on the blocks [k·grain, min(n, (k+1)·grain)) of
// [0, n), k = 0 … ⌈n/grain⌉−1, each block exactly once, spread over the pool's threads (the caller
// among them), and returns when all have run.
//
// The determinism rule, which every pooled kernel keeps: the blocks depend on n and grain only,
// never on the thread count or on which thread runs which block. A kernel writes each block's
// outputs, or each block's partial of a reduction (one partial per block, indexed begin / grain),
// and sums the partials in block order on one thread afterwards. So a pooled kernel gives the same
// bits at 1, 2 or N threads, and a resumed run stays bit-identical whatever --threads it uses.
//
// The thread bound (--threads counts every thread that computes, OpenBLAS's included):
//   - the pool has threads − 1 workers; the caller is the last one;
//   - one caller at a time: a parallelFor that finds the pool busy (another stream's kernel, or a
//     parallelFor inside a block) runs its blocks inline on its own thread, in block order;
//   - OpenBLAS runs at one thread; a GEMM's tiles are the pool's blocks (kernels/cpu/blas.h), and a
//     GEMM inside a block runs its tiles inline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace lfc {

class ThreadPool {
 public:
  // threads ≥ 1 in all (threads − 1 workers)
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const;
  // threads ≥ 1 from now on; waits for a running job first
  void resize(int threads);

  template <typename Fn>
  void parallelFor(int64_t n, int64_t grain, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(n, grain, [](void* f, int64_t b, int64_t e) { (*static_cast<F*>(f))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using BlockFn = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, int64_t grain, BlockFn fn, void* ctx);
  void workerLoop(uint64_t generation);
  void stopWorkers();
  // claims and runs blocks of the current job until none is left
  void drain();

  std::vector<std::thread> workers_;  // changed only under callerMu_
  std::atomic<int> threads_{1};
  std::mutex callerMu_;  // held by the one caller whose job the workers run, and by resize
  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  uint64_t generation_ = 0;  // bumped per job; a worker joins each generation once
  // the current job
  BlockFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, grain_ = 1, blocks_ = 0;
  int64_t nextBlock_ = 0;  // under mu_
  int64_t blocksLeft_ = 0;  // blocks not yet finished, under mu_
  std::exception_ptr error_;  // the first block's exception, rethrown to the caller
};

// The process's kernel pool (the kernels call parallelFor below). Starts at the machine's cores;
// setKernelThreads(n ≥ 1) resizes it, waiting for a running job (the runtime calls it with its
// threads option, as it sets OpenBLAS's).
void setKernelThreads(int threads);
int kernelThreads();
ThreadPool& kernelPool();

template <typename Fn>
void parallelFor(int64_t n, int64_t grain, Fn&& fn) {
  kernelPool().parallelFor(n, grain, fn);
}

// Σ over blocks of fn(begin, end) → double, each block's partial summed in block order (the
// determinism rule above): the same bits at any thread count.
template <typename Fn>
double parallelSum(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return 0;
  std::vector<double> partial(size_t((n + grain - 1) / grain));  // (blocks)
  parallelFor(n, grain, [&](int64_t b, int64_t e) { partial[size_t(b / grain)] = fn(b, e); });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace lfc
