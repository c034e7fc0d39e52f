#include "core/executor.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/collectives.h"
#include "ops/registry.h"

namespace lfc {

namespace {

using Clock = std::chrono::steady_clock;

// Everything the stream threads of one step use, shared with them so that a thread left behind
// in a collective still points at live memory: the program and the backend too, which the
// runtime shares with them. One lock for all (instructions are coarse).
struct StepState {
  const std::shared_ptr<const Program> program;
  const Program& p;  // *program
  std::vector<std::vector<Tensor>> operands, results;
  const GroupRanks groupRanks;  // a copy of the runtime's, which params point to
  const StepParams params;
  const std::shared_ptr<comm::Backend> backend;
  Clock::time_point t0;
  bool timed = false;
  std::vector<InstrTiming> timing;  // per instruction when timed

  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> recorded;
  std::vector<int64_t> rows;  // per buffer, −1 unless a variable-size collective wrote it
  std::vector<SymbolSizes> sizes;         // per microbatch slot, run-time symbols as set so far
  std::vector<std::vector<int>> setBy;    // per slot and symbol: the instruction that set it, or −1
  bool failed = false;
  bool failedInCollective = false;  // the first failure was a collective's (CollectiveStepError)
  std::string error;
  int running = 0;  // stream threads not yet finished
  std::atomic<int> run{0};

  std::array<ScratchSlice, kStreamCount> scratch;
  std::shared_ptr<const void> keepAlive;  // the scratch slices' owner
  std::array<int64_t, kStreamCount> scratchHigh{};  // each written by its stream's thread only

  static StepParams withGroupRanks(StepParams sp, const GroupRanks* g) {
    sp.groupRanks = g;
    return sp;
  }

  StepState(std::shared_ptr<const Program> prog, std::vector<std::vector<Tensor>> ops,
            std::vector<std::vector<Tensor>> res, const StepParams& sp, std::shared_ptr<comm::Backend> b)
      : program(std::move(prog)), p(*program), operands(std::move(ops)), results(std::move(res)),
        groupRanks(sp.groupRanks ? *sp.groupRanks : GroupRanks{}),
        params(withGroupRanks(sp, &groupRanks)),
        backend(std::move(b)) {}

  void fail(const std::string& msg, bool inCollective = false) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!failed) {
        failed = true;
        failedInCollective = inCollective;
        error = msg;
      }
    }
    cv.notify_all();
  }
};

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Operands over run-time symbols, at the values set so far for their microbatch.
void applySymbols(const Program& p, const Instr& in, std::vector<Tensor>& ts, const std::vector<SymbolSizes>& sizes) {
  for (Tensor& t : ts) {
    const Buffer& b = p.buffers[size_t(t.buffer)];
    if (!b.runTime) continue;
    const int mb = in.microbatch >= 0 ? in.microbatch : b.microbatch;
    t.shape = resolveShape(b.shape, sizes[size_t(mb)]);
    t.numel = numel(t.shape);
  }
}

// What a variable-size collective's `rows` set (under the step's lock): its output's run-time
// symbol for the instruction's microbatch, or the rows of that output buffer. "" or the problem.
std::string recordRows(StepState& st, const Instr& in, int64_t rows) {
  const Buffer& b = st.p.buffers[size_t(in.outputs[0])];
  if (b.shape.empty() || !b.shape[0].bareSymbol() || !SymbolTable::runTime(b.shape[0].sym)) {
    st.rows[size_t(b.id)] = rows;
    return "";
  }
  const int mb = in.microbatch >= 0 ? in.microbatch : b.microbatch;
  const int sym = b.shape[0].sym;
  int64_t& value = st.sizes[size_t(mb)][size_t(sym)];
  int& by = st.setBy[size_t(mb)][size_t(sym)];
  if (by >= 0 && value != rows)
    return cat("received ", rows, " rows into buffer ", b.id, " (", b.name, ") ", formatShape(b.shape), ", but ",
               b.shape[0].name, " of microbatch ", mb, " is ", value, " (the rows ",
               describeInstr(st.p.instrs[size_t(by)]), " received)");
  if (rows > st.p.symbols.at(sym).bound)
    return cat("received ", rows, " rows, past the bound ", st.p.symbols.at(sym).bound, " of ", b.shape[0].name);
  value = rows;
  by = in.index;
  return "";
}

// Operands of buffers a variable-size collective wrote this step, at the rows it wrote.
void applyRows(std::vector<Tensor>& ts, const std::vector<int64_t>& rows) {
  for (Tensor& t : ts) {
    const int64_t r = rows[size_t(t.buffer)];
    if (r < 0 || t.shape.empty() || t.shape[0] == r) continue;
    const int64_t perRow = t.shape[0] == 0 ? 0 : t.numel / t.shape[0];
    t.shape[0] = r;
    t.numel = r * perRow;
  }
}

int rankOf(const StepState& st) { return st.backend ? st.backend->config().rank : 0; }

// A failed step aborts the backend before the step throws: the members of every group this rank
// is in fail too, instead of waiting in a collective for the timeout, and this rank's other
// stream threads blocked in one wake up (comm.h). The first reason stays.
void abortBackend(StepState& st, const std::string& reason) {
  if (st.backend) st.backend->abort(reason);
}

void runStream(std::shared_ptr<StepState> stp, int stream) {
  StepState& st = *stp;
  const Program& p = st.p;
  // this thread's scratch: the stream's planned slice, emptied after every instruction
  cpu::ScratchArena& scratch = cpu::ScratchArena::of_this_thread();
  scratch.bind(st.scratch[size_t(stream)].base, st.scratch[size_t(stream)].bytes,
               cat("stream ", schema::kStreams[stream]));
  const auto finish = [&] {
    st.scratchHigh[size_t(stream)] = scratch.high();
    scratch.unbind();
    {
      std::lock_guard<std::mutex> lock(st.mu);
      st.running--;
    }
    st.cv.notify_all();
  };
  const std::vector<int>& order = p.streamInstrs[size_t(stream)];
  // an evaluation runs the forward phase alone
  const auto skipped = [&](const Instr& x) { return st.params.forwardOnly && x.phase != "forward"; };
  // the batch of a batched send/recv (-1: none)
  const auto batchOf = [&](int idx) -> int64_t {
    const Instr& x = p.instrs[size_t(idx)];
    return x.attrs.contains("batch") ? x.attrs.at("batch").get<int64_t>() : -1;
  };
  for (size_t k = 0; k < order.size(); k++) {
    const int idx = order[k];
    const Instr& in = p.instrs[size_t(idx)];
    std::vector<Tensor>& ins = st.operands[size_t(idx)];
    std::vector<Tensor>& outs = st.results[size_t(idx)];
    bool stop = false;
    const bool skip = skipped(in);
    {
      std::unique_lock<std::mutex> lock(st.mu);
      for (int e : in.wait) st.cv.wait(lock, [&] { return st.failed || st.recorded[size_t(e)]; });
      stop = st.failed;
      if (skip && !stop) {
        for (int e : in.record) st.recorded[size_t(e)] = 1;
        lock.unlock();
        if (!in.record.empty()) st.cv.notify_all();
        continue;
      }
      applySymbols(p, in, ins, st.sizes);
      applySymbols(p, in, outs, st.sizes);
      applyRows(ins, st.rows);
      applyRows(outs, st.rows);
    }
    if (stop) return finish();
    const double start = st.timed ? msSince(st.t0) : 0;
    int64_t rows = -1;
    try {
      StepCtx ctx(in, ins, outs, st.params);
      if (opEntry(in.op).cls == OpClass::collective) {
        if (!st.backend) throw OpError("no collective backend (the runtime was not connected)");
        const int64_t batch = batchOf(idx);
        // the batch's last member that runs (forward only skips the backward's sends and receives)
        bool batchEnd = batch >= 0;
        for (size_t j = k + 1; batchEnd && j < order.size() && batchOf(order[j]) == batch; j++)
          batchEnd = skipped(p.instrs[size_t(order[j])]);
        rows = comm::runCollective(in, ctx, *st.backend, batchEnd);
      } else {
        opEntry(in.op).run(in, ctx);
      }
    } catch (const comm::PeerFailedError& e) {
      // another rank's failure: pass its reason on, so that every rank names the one that failed
      scratch.release(0);
      abortBackend(st, e.reason);
      st.fail(cat("step failed at ", describeInstr(in), ": ", e.what()), true);
      return finish();
    } catch (const std::exception& e) {
      scratch.release(0);
      abortBackend(st, cat("rank ", rankOf(st), " failed in ", schema::kOpNames[int(in.op)], ": ", e.what()));
      st.fail(cat("step failed at ", describeInstr(in), ": ", e.what()), opEntry(in.op).cls == OpClass::collective);
      return finish();
    } catch (...) {
      scratch.release(0);
      abortBackend(st, cat("rank ", rankOf(st), " failed in ", schema::kOpNames[int(in.op)], ": unknown exception"));
      st.fail(cat("step failed at ", describeInstr(in), ": unknown exception"),
              opEntry(in.op).cls == OpClass::collective);
      return finish();
    }
    scratch.release(0);
    if (st.timed) st.timing[size_t(idx)] = {start, msSince(st.t0)};
    st.run++;
    if (!in.record.empty() || rows >= 0) {
      std::string problem;
      {
        std::lock_guard<std::mutex> lock(st.mu);
        if (rows >= 0) problem = recordRows(st, in, rows);
        if (problem.empty())
          for (int e : in.record) st.recorded[size_t(e)] = 1;
      }
      if (!problem.empty()) {
        abortBackend(st, cat("rank ", rankOf(st), " failed in ", schema::kOpNames[int(in.op)], ": ", problem));
        st.fail(cat("step failed at ", describeInstr(in), ": ", problem), true);
        return finish();
      }
      st.cv.notify_all();
    }
  }
  finish();
}

}  // namespace

ExecResult execute(std::shared_ptr<const Program> program, std::vector<std::vector<Tensor>> operands,
                   std::vector<std::vector<Tensor>> results, std::vector<SymbolSizes> sizes,
                   const StepParams& params, const std::array<ScratchSlice, kStreamCount>& scratch,
                   std::shared_ptr<const void> keepAlive, bool timing, std::shared_ptr<comm::Backend> backend) {
  const Program& p = *program;
  auto st = std::make_shared<StepState>(std::move(program), std::move(operands), std::move(results), params,
                                        std::move(backend));
  st->scratch = scratch;
  st->keepAlive = std::move(keepAlive);
  st->recorded.assign(size_t(p.events), 0);
  st->rows.assign(p.buffers.size(), -1);
  if (sizes.size() != size_t(p.slots))
    throw RuntimeError(cat("execute: sizes of ", sizes.size(), " microbatch slots, the program has ", p.slots));
  for (const SymbolSizes& s : sizes)
    if (s.size() != size_t(p.symbols.size()))
      throw RuntimeError(cat("execute: sizes of ", s.size(), " symbols, the program has ", p.symbols.size()));
  st->sizes = std::move(sizes);
  st->setBy.assign(size_t(p.slots), std::vector<int>(size_t(p.symbols.size()), -1));
  ExecResult result;
  st->timed = timing;
  if (timing) st->timing.assign(p.instrs.size(), {});
  st->t0 = Clock::now();
  // the same instant on the system clock, so that ranks' timings can be put on one time line
  result.startWallMs =
      std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreamCount; s++) {
    if (p.streamInstrs[size_t(s)].empty()) continue;
    try {
      {
        std::lock_guard<std::mutex> lock(st->mu);
        st->running++;
      }
      threads.emplace_back(runStream, st, s);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(st->mu);
        st->running--;
      }
      st->fail(cat("cannot start the executor thread of stream ", schema::kStreams[s], ": ", e.what()));
      break;
    }
  }
  // every thread finishes, or the step failed and some are still blocked past the grace period
  bool abandoned = false;
  {
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->running == 0 || st->failed; });
    if (st->running > 0)
      abandoned = !st->cv.wait_for(lock, kAbandonAfter, [&] { return st->running == 0; });
  }
  for (auto& t : threads) {
    if (abandoned) t.detach();  // `st` keeps what they use alive, the scratch slices included
    else t.join();
  }
  if (abandoned)
    throw AbandonedStepError(cat(st->error, " (stream threads still blocked in collectives were left behind)"));
  if (st->failed && st->failedInCollective) throw CollectiveStepError(st->error);
  if (st->failed) throw RuntimeError(st->error);
  result.instructionsRun = st->run;
  result.timing = std::move(st->timing);
  result.rows = st->rows;
  result.sizes = st->sizes;
  result.scratchHighBytes = st->scratchHigh;
  return result;
}

}  // namespace lfc
