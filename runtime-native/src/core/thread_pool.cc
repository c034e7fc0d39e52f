#include "core/thread_pool.h"

#include <algorithm>

namespace lfc {

namespace {
// whether this thread is running a block now (a nested parallelFor then runs inline: the caller
// holds callerMu_, a worker is the pool)
thread_local bool tInBlock = false;

struct InBlock {
  InBlock() { tInBlock = true; }
  ~InBlock() { tInBlock = false; }
};
}  // namespace

ThreadPool::ThreadPool(int threads) { resize(threads); }

ThreadPool::~ThreadPool() {
  std::lock_guard<std::mutex> caller(callerMu_);
  stopWorkers();
}

int ThreadPool::threads() const { return threads_.load(); }

void ThreadPool::resize(int threads) {
  threads = std::max(threads, 1);
  std::lock_guard<std::mutex> caller(callerMu_);
  if (threads == this->threads() && int(workers_.size()) == threads - 1) return;
  stopWorkers();
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    generation = generation_;
  }
  for (int i = 0; i + 1 < threads; i++) workers_.emplace_back([this, generation] { workerLoop(generation); });
  threads_ = threads;
}

void ThreadPool::stopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
  threads_ = 1;
}

void ThreadPool::workerLoop(uint64_t seen) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    drain();
  }
}

void ThreadPool::drain() {
  InBlock inBlock;
  for (;;) {
    int64_t k;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (nextBlock_ >= blocks_) return;
      k = nextBlock_++;
    }
    std::exception_ptr error;
    try {
      fn_(ctx_, k * grain_, std::min(n_, (k + 1) * grain_));
    } catch (...) {
      error = std::current_exception();
    }
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error && !error_) error_ = error;
      last = --blocksLeft_ == 0;
    }
    if (last) done_.notify_all();
  }
}

void ThreadPool::run(int64_t n, int64_t grain, BlockFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t blocks = (n + grain - 1) / grain;
  const auto inline_ = [&] {
    for (int64_t k = 0; k < blocks; k++) fn(ctx, k * grain, std::min(n, (k + 1) * grain));
  };
  // one block, one thread, a nested call, or another caller's job running: the same blocks inline
  if (blocks == 1 || threads() == 1 || tInBlock) return inline_();
  std::unique_lock<std::mutex> caller(callerMu_, std::try_to_lock);
  if (!caller.owns_lock() || workers_.empty()) return inline_();
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    grain_ = grain;
    blocks_ = blocks;
    nextBlock_ = 0;
    blocksLeft_ = blocks;
    error_ = nullptr;
    generation_++;
  }
  wake_.notify_all();
  drain();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return blocksLeft_ == 0; });
    error = error_;
    error_ = nullptr;
    blocks_ = 0;
  }
  if (error) std::rethrow_exception(error);
}

namespace {
ThreadPool& pool() {
  static ThreadPool p(int(std::max(1u, std::thread::hardware_concurrency())));
  return p;
}
}  // namespace

void setKernelThreads(int threads) { pool().resize(threads); }
int kernelThreads() { return pool().threads(); }
ThreadPool& kernelPool() { return pool(); }

}  // namespace lfc
