#include "core/executor.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "ops/registry.h"

namespace lfc {

namespace {

using Clock = std::chrono::steady_clock;

// Events of one step and the first error; one lock for all (instructions are coarse).
struct StepState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> recorded;
  bool failed = false;
  std::string error;
  std::atomic<int> run{0};

  void fail(const std::string& msg) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!failed) {
        failed = true;
        error = msg;
      }
    }
    cv.notify_all();
  }
};

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void runStream(const Program& p, int stream, std::vector<std::vector<Tensor>>& operands,
               std::vector<std::vector<Tensor>>& results, const StepParams& params, Scratch& scratch,
               StepState& st, std::vector<InstrTiming>* timing, Clock::time_point t0) {
  for (int idx : p.streamInstrs[size_t(stream)]) {
    const Instr& in = p.instrs[size_t(idx)];
    {
      std::unique_lock<std::mutex> lock(st.mu);
      for (int e : in.wait) st.cv.wait(lock, [&] { return st.failed || st.recorded[size_t(e)]; });
      if (st.failed) return;
    }
    const double start = timing ? msSince(t0) : 0;
    try {
      StepCtx ctx(in, operands[size_t(idx)], results[size_t(idx)], params, scratch);
      opEntry(in.op).run(in, ctx);
    } catch (const std::exception& e) {
      st.fail(cat("step failed at ", describeInstr(in), ": ", e.what()));
      return;
    } catch (...) {
      st.fail(cat("step failed at ", describeInstr(in), ": unknown exception"));
      return;
    }
    if (timing) (*timing)[size_t(idx)] = {start, msSince(t0)};
    st.run++;
    if (!in.record.empty()) {
      {
        std::lock_guard<std::mutex> lock(st.mu);
        for (int e : in.record) st.recorded[size_t(e)] = 1;
      }
      st.cv.notify_all();
    }
  }
}

}  // namespace

ExecResult execute(const Program& p, std::vector<std::vector<Tensor>>& operands,
                   std::vector<std::vector<Tensor>>& results, const StepParams& params,
                   std::vector<Scratch>& scratch, bool timing) {
  StepState st;
  st.recorded.assign(size_t(p.events), 0);
  ExecResult result;
  if (timing) result.timing.assign(p.instrs.size(), {});
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreamCount; s++) {
    if (p.streamInstrs[size_t(s)].empty()) continue;
    try {
      threads.emplace_back(runStream, std::cref(p), s, std::ref(operands), std::ref(results),
                           std::cref(params), std::ref(scratch[size_t(s)]), std::ref(st),
                           timing ? &result.timing : nullptr, t0);
    } catch (const std::exception& e) {
      st.fail(cat("cannot start the executor thread of stream ", schema::kStreams[s], ": ", e.what()));
      break;
    }
  }
  for (auto& t : threads) t.join();
  if (st.failed) throw RuntimeError(st.error);
  result.instructionsRun = st.run;
  return result;
}

}  // namespace lfc
