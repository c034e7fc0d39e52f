// The runtime of one rank, without bindings: a validated program, its memory, the microbatch
// slots, and the step. addon.cc exposes it to JavaScript; nothing here knows about N-API.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "core/executor.h"
#include "core/memory.h"
#include "core/program.h"
#include "data/microbatch.h"
#include "ops/op.h"

namespace lfc {

struct RuntimeOptions {
  int threads = 0;  // computing threads, process-wide: OpenBLAS and the kernel pool; 0 leaves their defaults (the cores)
  int patchSize = 4;
  int mergeSize = 2;
  int temporalPatch = 1;  // frames per patch: a still image is repeated in time this many times
  int windowMerged = 0;   // attention window side in merged tokens (0: none)
  int tableSide = 0;      // side of the interpolated position table (0: none)
  int imageTokenId = 1;   // the model's image placeholder; a microbatch must carry the same
  int positionRows = 1;   // 3: the model's rotary positions are M-RoPE ids (t, h, w)
  VisionSpec vision() const {
    return VisionSpec{patchSize, temporalPatch, 3, mergeSize, windowMerged, tableSide};
  }
  bool timing = false;  // per-instruction start/end in step results
  // accept collective instructions: the caller connects a backend (connect) before stepping
  bool collectives = false;
  // the plan's symbols (plan.json `symbols`): bounds of the run-time symbols the program names
  std::vector<SymbolDecl> symbols;
};

struct ParamInit {
  std::string name;
  std::string init;
  std::vector<int64_t> shape;  // global
  std::optional<std::vector<std::pair<int64_t, int64_t>>> shard;  // must equal the program's if given
  // a piece of a whole tensor split over groups (tensor / expert parallelism): the whole
  // tensor's checkpoint name (the initializer's key) and, per dim, the global index of each
  // local index
  std::optional<std::string> key;
  std::optional<std::vector<std::vector<int64_t>>> index;
};

struct StepOutput {
  std::string name;
  int microbatch;
  double value;
};

struct StepResult {
  std::vector<StepOutput> outputs;
  std::vector<std::pair<std::string, double>> scalars;
  int instructionsRun = 0;
  double stepMs = 0;
  std::vector<InstrTiming> timing;  // when options.timing
  double startWallMs = 0;           // the instant timing starts from, ms since the epoch
  // what the step's memory held: every region but scratch and host (allocated whole, at the
  // program's sizes), the host region, and per stream the most scratch bytes one of its
  // instructions held at once
  int64_t regionBytes = 0;
  int64_t hostBytes = 0;
  std::array<int64_t, kStreamCount> scratchHighBytes{};
};

class Runtime {
 public:
  Runtime(const std::string& programJson, const RuntimeOptions& options);

  const Program& program() const { return program_; }
  const RuntimeOptions& options() const { return options_; }
  const std::shared_ptr<Memory>& memory() const { return memory_; }

  // Fills every parameter of the program from its init string; zeroes the optimizer state.
  void initParams(uint64_t seed, const std::vector<ParamInit>& params);
  // Fills the data buffers of a microbatch slot and records its sizes (S, Nv).
  void setMicrobatch(int slot, Microbatch mb);
  // The synthetic task's microbatch, set into the slot and returned.
  const Microbatch& synthesize(int slot, SynthArgs args);
  const Microbatch& microbatch(int slot) const;
  std::vector<uint8_t> captionMask(int slot) const;
  void setScalar(const std::string& name, double value);
  double scalar(const std::string& name) const;
  // A copy of a buffer's bytes at its microbatch's sizes (planned bytes when none are set; the
  // rows a variable-size collective received in the last step, for its output and, through its
  // run-time symbol, every buffer over that symbol).
  std::vector<std::byte> readBuffer(int id) const;

  // Multi-rank: opens this rank's communicators (blocks until every member of each group has
  // arrived, or throws after the config's timeout). Once, before the first step. Both calls
  // block on other ranks: the caller runs them off its main thread, between steps.
  void connect(const comm::Config& config);
  bool connected() const { return backend_ != nullptr; }
  const comm::Backend* backend() const { return backend_.get(); }
  // Σ over every rank of `values`, on the control communicator (between steps). A failure aborts
  // the backend, as a failed step does.
  std::vector<double> worldSum(std::vector<double> values);

  // A step: beginStep marks it running (throws if one is) on the caller's thread, runStep
  // zeroes the grad region and runs the program (on a worker thread), endStep clears the mark
  // once the caller has taken the result. While marked, the data-changing calls throw.
  void beginStep();
  StepResult runStep(const StepParams& params);
  void endStep();
  bool stepRunning() const { return running_; }

 private:
  void requireIdle(const char* what) const;
  void requireSlot(int slot, const char* what) const;
  const SymbolSizes* sizesOf(int microbatch) const;

  // shared with the executor's stream threads, which a failed step may leave behind
  // (core/executor.h), as are memory_ and backend_
  std::shared_ptr<const Program> sharedProgram_;
  const Program& program_;  // *sharedProgram_
  RuntimeOptions options_;
  std::shared_ptr<Memory> memory_;
  std::vector<std::optional<Microbatch>> slots_;
  std::vector<std::optional<SymbolSizes>> sizes_;
  std::atomic<bool> running_{false};
  std::shared_ptr<comm::Backend> backend_;
  GroupRanks groupRanks_;  // this rank's index in its group of each kind (all 0 unconnected)
  bool hasCollectives_ = false;
  std::vector<int64_t> lastRows_;  // per buffer: rows received by a collective in the last step
  std::vector<SymbolSizes> lastSizes_;  // per slot: the symbols' values at the last step's end
  std::string broken_;             // why this runtime cannot step again, if it cannot (and backend_->broken())
  std::map<size_t, std::vector<double>> worldSumBuffers_;  // per count: the values worldSum sums
};

}  // namespace lfc
