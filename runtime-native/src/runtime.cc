#include "runtime.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "data/init.h"
#include "kernels/cpu/storage.h"
#include "ops/registry.h"

namespace lfc {

namespace {

// Capacity in elements (of `perElement` values) of a data buffer.
int64_t capacity(const Buffer& b, int64_t perElement) {
  return b.bytes / (dtypeBytes(b.dtype) * perElement);
}

template <typename T>
void writeField(std::byte* dst, const Buffer& b, const std::vector<T>& values, int64_t columns = 1) {
  // values (n) written into a buffer of rows × columns: a rank-2 buffer [n, P] of positions gets
  // the value in each of its P columns
  // a float field (patches) in a bf16 buffer: each value rounded to nearest even
  const bool toBf16Buffer = std::is_same_v<T, float> && b.dtype == DType::bf16;
  const int64_t n = int64_t(values.size());
  T* out = reinterpret_cast<T*>(dst);
  bf16* outBf16 = reinterpret_cast<bf16*>(dst);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < columns; j++) {
      if (toBf16Buffer) outBf16[i * columns + j] = toBf16(float(values[size_t(i)]));
      else out[i * columns + j] = values[size_t(i)];
    }
  const int64_t used = n * columns * (toBf16Buffer ? int64_t(sizeof(bf16)) : int64_t(sizeof(T)));
  if (b.bytes > used) std::memset(dst + used, 0, size_t(b.bytes - used));
}

}  // namespace

Runtime::Runtime(const std::string& programJson, const RuntimeOptions& options)
    : sharedProgram_(std::make_shared<const Program>(
          parseProgram(programJson, ParseOptions{options.collectives, options.symbols}))),
      program_(*sharedProgram_),
      options_(options) {
  if (options_.patchSize < 1 || options_.mergeSize < 1)
    throw RuntimeError(cat("patchSize ", options_.patchSize, " and mergeSize ", options_.mergeSize,
                           " must be ≥ 1"));
  // --threads bounds every computing thread: the kernel pool's, which run the GEMMs' tiles too
  // (OpenBLAS itself at one thread: kernels/cpu/blas.h)
  if (options_.threads > 0) setKernelThreads(options_.threads);
  memory_ = std::make_shared<Memory>(program_);
  slots_.resize(size_t(program_.slots));
  sizes_.resize(size_t(program_.slots));
  for (const Instr& in : program_.instrs) hasCollectives_ = hasCollectives_ || opEntry(in.op).cls == OpClass::collective;
}

void Runtime::connect(const comm::Config& config) {
  if (backend_) throw RuntimeError("connect: this runtime is connected already");
  // the regions, for shared-memory groups to read collectives' inputs in place; the memory
  // outlives the backend (it is destroyed first: runtime.h)
  comm::Config withMemory = config;
  withMemory.threads = options_.threads;
  for (int r = 0; r < kRegionCount; r++) {
    const Block& b = memory_->block(Region(r));
    if (b.fd() >= 0) withMemory.shared.push_back({b.data(), b.size(), b.fd()});
  }
  try {
    backend_ = comm::connectGloo(withMemory);
  } catch (const comm::CommError& e) {
    throw RuntimeError(cat("connect (rank ", config.rank, " of ", config.worldSize, "): ", e.what()));
  }
  for (const auto& [kind, groupOfRank] : config.rankGroups) {
    const int group = groupOfRank.at(size_t(config.rank));
    if (group < 0) continue;  // in no group of this kind
    const auto& ranks = config.groups.at(size_t(group)).ranks;
    groupRanks_.set(kind, int(std::find(ranks.begin(), ranks.end(), config.rank) - ranks.begin()));
  }
}

std::vector<double> Runtime::worldSum(std::vector<double> values) {
  if (!backend_) throw RuntimeError("worldSum: the runtime is not connected");
  if (const std::string why = backend_->broken(); !why.empty())
    throw RuntimeError(
        cat("worldSum: the communicators are broken by an earlier failure (", why, "); start a new run"));
  // the backend keeps a bound all-reduce per (address, count): every rank must hit or miss that
  // cache alike, so the values travel in a buffer of this runtime kept per count (the ranks call
  // worldSum with the same counts in the same order), never in memory whose address varies
  std::vector<double>& buffer = worldSumBuffers_[values.size()];
  buffer.assign(values.begin(), values.end());
  try {
    backend_->at(comm::kWorldGroup, comm::kControlStream).allReduce(buffer.data(), DType::f64, int64_t(buffer.size()));
  } catch (const comm::PeerFailure& e) {
    backend_->abort(e.reason);
    throw RuntimeError(cat("worldSum over every rank: ", e.what()));
  } catch (const comm::CommError& e) {
    backend_->abort(cat("rank ", backend_->config().rank, " failed in worldSum: ", e.what()));
    throw RuntimeError(cat("worldSum over every rank: ", e.what()));
  }
  return buffer;
}

void Runtime::requireIdle(const char* what) const {
  if (running_) throw RuntimeError(cat(what, ": a step is running; wait for its promise"));
}

void Runtime::requireSlot(int slot, const char* what) const {
  if (slot < 0 || slot >= program_.slots)
    throw RuntimeError(cat(what, ": microbatch slot ", slot, " is out of range (the program has ",
                           program_.slots, " slots)"));
}

void Runtime::initParams(uint64_t seed, const std::vector<ParamInit>& params) {
  requireIdle("initParams");
  for (const ProgramParam& pp : program_.params) {
    const ParamInit* spec = nullptr;
    for (const ParamInit& p : params)
      if (p.name == pp.name) spec = &p;
    if (!spec) throw RuntimeError(cat("initParams: no init given for param ", pp.name));
    const Buffer& b = program_.buffers[size_t(pp.buffer)];
    if (spec->index) {
      // a piece of a whole tensor: the local dims must be the index lists' lengths
      const std::vector<int64_t> local = resolveShape(b.shape, SymbolSizes{});
      bool fits = spec->index->size() == local.size();
      for (size_t d = 0; fits && d < local.size(); d++) fits = int64_t((*spec->index)[d].size()) == local[d];
      if (!fits)
        throw RuntimeError(cat("initParams: the piece given for param ", pp.name, " does not fit its buffer ",
                               formatShape(local)));
      initParamAt(memory_->buffer(program_, pp.buffer), b.dtype, seed, spec->key.value_or(pp.name), spec->init,
                  spec->shape, *spec->index);
      continue;
    }
    std::vector<std::pair<int64_t, int64_t>> shard = pp.shard;
    if (shard.empty())
      for (int64_t d : spec->shape) shard.emplace_back(0, d);
    if (spec->shard && *spec->shard != shard)
      throw RuntimeError(cat("initParams: the shard given for param ", pp.name, " differs from the program's"));
    const std::vector<int64_t> local = resolveShape(b.shape, SymbolSizes{});
    if (shard.size() != local.size())
      throw RuntimeError(cat("initParams: param ", pp.name, " has global shape ", formatShape(spec->shape),
                             " but its buffer is ", formatShape(local)));
    for (size_t d = 0; d < local.size(); d++)
      if (shard[d].second != local[d])
        throw RuntimeError(cat("initParams: param ", pp.name, ": shard length ", shard[d].second, " of dim ", d,
                               " differs from its buffer ", formatShape(local)));
    initParam(memory_->buffer(program_, pp.buffer), b.dtype, seed, pp.name, spec->init, spec->shape, shard);
  }
  std::memset(memory_->region(Region::optim), 0, size_t(memory_->regionSize(Region::optim)));
  // Mixed precision: an fp32 master weight (adamw's input 5) in the optimizer region starts as its
  // parameter's values upcast (exact from bf16), as Megatron's optimizer copies its bf16 params
  for (const Instr& in : program_.instrs) {
    if (in.op != Op::adamw || in.inputs.size() < 6) continue;
    const Buffer &param = program_.buffers[size_t(in.inputs[0])], &master = program_.buffers[size_t(in.inputs[5])];
    // (the distributed optimizer's shards update an arena slice: runtime/state.ts fills their masters)
    if (master.region != Region::optim || param.region != Region::param) continue;
    const int64_t n = numel(resolveShape(param.shape, SymbolSizes{}));
    if (numel(resolveShape(master.shape, SymbolSizes{})) != n)
      throw RuntimeError(cat("initParams: ", describeInstr(in), ": master ", formatShape(master.shape),
                             " and param ", formatShape(param.shape), " differ in size"));
    cpu::convert(cpu::Dst{memory_->buffer(program_, master.id), master.dtype},
                 cpu::Src{memory_->buffer(program_, param.id), param.dtype}, n);
  }
}

void Runtime::setMicrobatch(int slot, Microbatch mb) {
  requireIdle("setMicrobatch");
  requireSlot(slot, "setMicrobatch");
  const std::string who = cat("microbatch ", slot);
  const size_t S = mb.tokens.size();
  const auto sameLength = [&](const char* field, size_t n) {
    if (n != S) throw RuntimeError(cat(who, ": ", field, " has ", n, " elements, tokens has ", S));
  };
  sameLength("labels", mb.labels.size());
  sameLength("lossMask", mb.lossMask.size());
  sameLength("segments", mb.segments.size());
  if (!mb.captionMask.empty()) sameLength("captionMask", mb.captionMask.size());
  if (mb.positions.size() != S && mb.positions.size() != 3 * S)
    throw RuntimeError(cat(who, ": positions has ", mb.positions.size(), " elements; want ", S,
                           " (one per token) or ", 3 * S, " (M-RoPE ids t, h, w: [3, ", S, "])"));
  if (mb.imageTokenId < 0) mb.imageTokenId = options_.imageTokenId;
  if (mb.imageTokenId != options_.imageTokenId)
    throw RuntimeError(cat(who, ": image_token_id is ", mb.imageTokenId, "; the model's image token is ",
                           options_.imageTokenId));
  const VisionSpec spec = options_.vision();
  Patches patches;
  VisionInputs vision;
  const bool encodes = std::any_of(program_.inputs.begin(), program_.inputs.end(), [&](const ProgramInput& in) {
    return in.microbatch == slot && in.field == DataField::patches;
  });
  try {
    patches = patchesOf(mb, spec, encodes);
  } catch (const std::exception& e) {
    throw RuntimeError(cat(who, ": ", e.what()));
  }
  const int64_t merge2 = int64_t(options_.mergeSize) * options_.mergeSize;
  const int64_t Nv = patches.count / merge2;
  int64_t placeholders = 0;
  for (int32_t t : mb.tokens) placeholders += t == mb.imageTokenId;
  if (placeholders != Nv)
    throw RuntimeError(cat(who, ": ", placeholders, " placeholder tokens (id ", mb.imageTokenId,
                           ") but its images give ", Nv, " visual tokens"));

  // check every field against its buffer's bound before writing anything
  struct Write {
    const ProgramInput* input;
    int64_t elements;  // rows written
    int64_t columns;   // values per row in the buffer
  };
  std::vector<Write> writes;
  const auto fixedColumns = [&](const Buffer& b, const char* field, int64_t want) {
    if (b.shape.size() != 2 || b.shape[1].symbolic() || b.shape[1].value != want)
      throw RuntimeError(cat(who, ": ", field, " buffer ", formatShape(b.shape), " is not [rows, ", want, "]"));
    return want;
  };
  for (const ProgramInput& in : program_.inputs) {
    if (in.microbatch != slot) continue;
    const Buffer& b = program_.buffers[size_t(in.buffer)];
    int64_t n = 0, columns = 1;
    switch (in.field) {
      case DataField::tokens:
      case DataField::labels:
      case DataField::loss_mask:
      case DataField::segments:
      case DataField::caption_mask: n = int64_t(S); break;
      case DataField::positions: {
        n = int64_t(S);
        if (b.shape.size() == 2) {
          if (b.shape[1].symbolic())
            throw RuntimeError(cat(who, ": positions buffer ", formatShape(b.shape), " has a symbolic column count"));
          columns = b.shape[1].value;
        }
        const int64_t given = int64_t(mb.positions.size() / std::max<size_t>(S, 1));
        if (S > 0 && given != columns)
          throw RuntimeError(cat(who, ": positions has ", given, " row", given == 1 ? "" : "s",
                                 " of position ids; the model takes ", columns,
                                 columns == 3 ? " (M-RoPE t, h, w: [3, S])" : " (the index in the sample: [S])"));
        break;
      }
      case DataField::patches:
        n = patches.count;
        columns = patches.width;
        if (b.shape.empty() || b.shape.back().symbolic() || b.shape.back().value != patches.width)
          throw RuntimeError(cat(who, ": patches buffer ", formatShape(b.shape), " does not hold ", patches.width,
                                 " values per patch (", spec.channels, "·", spec.temporalPatch, "·",
                                 options_.patchSize, "·", options_.patchSize, ")"));
        break;
      case DataField::image_segments:
      case DataField::patch_rows:
      case DataField::patch_cols: n = patches.count; break;
      case DataField::window_segments:
        if (spec.windowMerged <= 0)
          throw RuntimeError(cat(who, ": the program has window_segments but the runtime was given no window size"));
        n = patches.count;
        break;
      case DataField::patch_positions:
        n = patches.count;
        columns = fixedColumns(b, "patch_positions", 2);
        break;
      case DataField::patch_pos_ids:
      case DataField::patch_pos_weights:
        if (spec.tableSide <= 0)
          throw RuntimeError(cat(who, ": the program has ", in.name, " but the runtime was given no table side"));
        n = patches.count;
        columns = fixedColumns(b, in.name.c_str(), 4);
        break;
      case DataField::kCount: break;
    }
    const int64_t cap = capacity(b, columns);
    if (n > cap)
      throw RuntimeError(cat(who, ": ", in.name, " has ", n, " ", columns > 1 && in.field == DataField::patches ? "patches" : "elements",
                             ", its buffer holds at most ", cap));
    writes.push_back({&in, n, columns});
  }
  // the per-patch inputs derived from the grids, once their count fits the buffers (a batch file's
  // grids may promise any number of patches), and only for a slot whose program reads them
  const bool derived = std::any_of(writes.begin(), writes.end(), [](const Write& w) {
    const DataField f = w.input->field;
    return f == DataField::image_segments || f == DataField::patch_rows || f == DataField::patch_cols ||
           f == DataField::patch_positions || f == DataField::window_segments || f == DataField::patch_pos_ids ||
           f == DataField::patch_pos_weights;
  });
  if (derived) {
    try {
      vision = visionInputs(patches.grids, spec);
    } catch (const std::exception& e) {
      throw RuntimeError(cat(who, ": ", e.what()));
    }
  }
  if (derived && !mb.windowSegments.empty() && spec.windowMerged > 0 && mb.windowSegments != vision.windowSegments)
    throw RuntimeError(cat(who, ": window_segments differ from the windows of its grids (",
                           spec.windowMerged, "×", spec.windowMerged, " merged tokens a window, docs/qwen-vl.md)"));
  for (const Write& w : writes) {
    const Buffer& b = program_.buffers[size_t(w.input->buffer)];
    std::byte* dst = memory_->buffer(program_, b.id);
    switch (w.input->field) {
      case DataField::tokens: writeField(dst, b, mb.tokens); break;
      case DataField::labels: writeField(dst, b, mb.labels); break;
      case DataField::loss_mask: writeField(dst, b, mb.lossMask); break;
      case DataField::positions:
        if (w.columns == 1) writeField(dst, b, mb.positions);
        else {
          // [3, S] (the contract's rows t, h, w) into the buffer's [S, 3]
          std::vector<int32_t> rows(mb.positions.size());
          for (size_t t = 0; t < S; t++)
            for (int64_t r = 0; r < w.columns; r++) rows[t * size_t(w.columns) + size_t(r)] = mb.positions[size_t(r) * S + t];
          writeField(dst, b, rows);
        }
        break;
      case DataField::segments: writeField(dst, b, mb.segments); break;
      case DataField::patches: writeField(dst, b, patches.values); break;
      case DataField::image_segments: writeField(dst, b, vision.imageSegments); break;
      case DataField::patch_rows: writeField(dst, b, vision.rows); break;
      case DataField::patch_cols: writeField(dst, b, vision.cols); break;
      case DataField::caption_mask: writeField(dst, b, lfc::captionMask(mb)); break;
      case DataField::patch_positions: writeField(dst, b, vision.positions); break;
      case DataField::window_segments: writeField(dst, b, vision.windowSegments); break;
      case DataField::patch_pos_ids: writeField(dst, b, vision.tableIds); break;
      case DataField::patch_pos_weights: writeField(dst, b, vision.tableWeights); break;
      case DataField::kCount: break;
    }
  }
  // the placeholder id merge_visual reads: the microbatch's, checked above to be the model's
  if (const int id = program_.scalarBuffer("image_token_id"); id >= 0) {
    const Buffer& b = program_.buffers[size_t(id)];
    if (b.dtype != DType::i32)
      throw RuntimeError(cat("the program's image_token_id scalar is ", dtypeName(b.dtype), ", not i32"));
    *reinterpret_cast<int32_t*>(memory_->buffer(program_, id)) = mb.imageTokenId;
  }
  SymbolSizes sizes = program_.symbols.atBounds();
  sizes[kSymS] = int64_t(S);
  sizes[kSymNv] = Nv;
  sizes_[size_t(slot)] = sizes;
  slots_[size_t(slot)] = std::move(mb);
}

const Microbatch& Runtime::synthesize(int slot, SynthArgs args) {
  requireIdle("synthesize");
  requireSlot(slot, "synthesize");
  args.patchSize = options_.patchSize;
  args.mergeSize = options_.mergeSize;
  args.positionRows = options_.positionRows;
  if (args.maxVisualTokens < 0) {
    // the bound of this slot's patches buffer, if the program has one
    for (const ProgramInput& in : program_.inputs)
      if (in.microbatch == slot && in.field == DataField::patches) {
        const Buffer& b = program_.buffers[size_t(in.buffer)];
        const int64_t width = options_.vision().patchWidth();
        args.maxVisualTokens = capacity(b, width) / (int64_t(options_.mergeSize) * options_.mergeSize);
      }
  }
  setMicrobatch(slot, lfc::synthesize(args));
  return *slots_[size_t(slot)];
}

const Microbatch& Runtime::microbatch(int slot) const {
  requireSlot(slot, "getMicrobatch");
  if (!slots_[size_t(slot)]) throw RuntimeError(cat("microbatch slot ", slot, " has no data yet"));
  return *slots_[size_t(slot)];
}

std::vector<uint8_t> Runtime::captionMask(int slot) const { return lfc::captionMask(microbatch(slot)); }

void Runtime::setScalar(const std::string& name, double value) {
  requireIdle("setScalar");
  const int id = program_.scalarBuffer(name);
  if (id < 0) {
    std::string known;
    for (const auto& [n, _] : program_.scalars) known += (known.empty() ? "" : ", ") + n;
    throw RuntimeError(cat("setScalar: the program has no scalar '", name, "' (it has: ", known, ")"));
  }
  const Buffer& b = program_.buffers[size_t(id)];
  std::byte* p = memory_->buffer(program_, id);
  switch (b.dtype) {
    case DType::f32: *reinterpret_cast<float*>(p) = float(value); break;
    case DType::f64: *reinterpret_cast<double*>(p) = value; break;
    case DType::bf16: *reinterpret_cast<bf16*>(p) = toBf16(float(value)); break;
    case DType::i32: *reinterpret_cast<int32_t*>(p) = int32_t(value); break;
    case DType::i64: *reinterpret_cast<int64_t*>(p) = int64_t(value); break;
    default: throw RuntimeError(cat("setScalar: scalar ", name, " has dtype ", dtypeName(b.dtype)));
  }
}

double Runtime::scalar(const std::string& name) const {
  const int id = program_.scalarBuffer(name);
  if (id < 0) throw RuntimeError(cat("the program has no scalar '", name, "'"));
  Tensor t;
  t.data = memory_->buffer(program_, id);
  t.dtype = program_.buffers[size_t(id)].dtype;
  t.numel = 1;
  return scalarValue(t, name.c_str());
}

const SymbolSizes* Runtime::sizesOf(int microbatch) const {
  if (microbatch < 0 || microbatch >= program_.slots || !sizes_[size_t(microbatch)]) return nullptr;
  return &*sizes_[size_t(microbatch)];
}

std::vector<std::byte> Runtime::readBuffer(int id) const {
  if (id < 0 || id >= int(program_.buffers.size()))
    throw RuntimeError(cat("readBuffer: buffer id ", id, " is out of range (", program_.buffers.size(), " buffers)"));
  const Buffer& b = program_.buffers[size_t(id)];
  // its microbatch's sizes: run-time symbols as the last step left them (their bounds before one)
  const SymbolSizes* s = sizesOf(b.microbatch);
  SymbolSizes sizes;
  if (s && b.runTime && size_t(b.microbatch) < lastSizes_.size()) {
    sizes = *s;
    for (int k = kDataSymbolCount; k < program_.symbols.size(); k++)
      sizes[size_t(k)] = lastSizes_[size_t(b.microbatch)][size_t(k)];
    s = &sizes;
  }
  int64_t bytes = b.bytes;
  if (s || !b.symbolic) {
    std::vector<int64_t> shape = resolveShape(b.shape, s ? *s : SymbolSizes{});
    if (size_t(id) < lastRows_.size() && lastRows_[size_t(id)] >= 0 && !shape.empty()) {
      // a collective's output: the rows it received
      const int64_t perRow = shape[0] == 0 ? 0 : numel(shape) / shape[0];
      bytes = std::min(b.bytes, lastRows_[size_t(id)] * perRow * dtypeBytes(b.dtype));
    } else {
      bytes = std::min(bytes, numel(shape) * dtypeBytes(b.dtype));
    }
  }
  const std::byte* p = memory_->buffer(program_, id);
  return std::vector<std::byte>(p, p + bytes);
}

void Runtime::beginStep() {
  bool expected = false;
  if (!running_.compare_exchange_strong(expected, true))
    throw RuntimeError("step: a step is already running; wait for its promise");
}

void Runtime::endStep() { running_ = false; }

StepResult Runtime::runStep(const StepParams& params) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!(params.step >= 1)) throw RuntimeError(cat("step: t = ", params.step, " must be ≥ 1"));
  if (!broken_.empty()) throw RuntimeError(cat("step: this runtime cannot step again: ", broken_));
  // an aborted backend's groups stopped midway (a barrier's count raised, connections closed):
  // refused rather than recovered
  if (backend_)
    if (const std::string why = backend_->broken(); !why.empty())
      throw CollectiveStepError(
          cat("step: the communicators are broken by an earlier failure (", why, "); start a new run"));
  if (hasCollectives_ && !backend_)
    throw RuntimeError("step: the program has collectives; connect the runtime to its ranks first");

  // 1. every buffer at its microbatch's sizes fits its plan (the runtime memory check)
  const auto sizesFor = [&](int mb, const Buffer& b, const std::string& user) -> SymbolSizes {
    if (!b.symbolic) return SymbolSizes{};
    const SymbolSizes* s = sizesOf(mb);
    if (!s)
      throw RuntimeError(cat("step: ", user, "buffer ", b.id, " (", b.name, ") ", formatShape(b.shape),
                             " depends on microbatch ", mb, ", which has no data (setMicrobatch or synthesize)"));
    return *s;
  };
  for (const Buffer& b : program_.buffers) {
    const SymbolSizes s = sizesFor(b.microbatch, b, "");
    const int64_t bytes = numel(resolveShape(b.shape, s)) * dtypeBytes(b.dtype);
    if (bytes > b.bytes)
      throw RuntimeError(cat("step: buffer ", b.id, " (", b.name, ") ", dtypeName(b.dtype), formatShape(b.shape),
                             " needs ", bytes, " bytes at microbatch ", b.microbatch, "'s sizes, planned ",
                             b.bytes));
  }

  // 2. the operands of every instruction, resolved at its microbatch's sizes
  std::vector<std::vector<Tensor>> operands(program_.instrs.size()), results(program_.instrs.size());
  for (const Instr& in : program_.instrs) {
    const auto resolve = [&](int id) {
      const Buffer& b = program_.buffers[size_t(id)];
      const int mb = in.microbatch >= 0 ? in.microbatch : b.microbatch;
      Tensor t;
      t.buffer = id;
      t.dtype = b.dtype;
      t.shape = resolveShape(b.shape, sizesFor(mb, b, describeInstr(in) + ": "));
      t.numel = numel(t.shape);
      t.data = memory_->buffer(program_, id);
      if (t.bytes() > b.bytes)
        throw RuntimeError(cat("step: ", describeInstr(in), ": buffer ", id, " (", b.name, ") needs ", t.bytes(),
                               " bytes at microbatch ", mb, "'s sizes, planned ", b.bytes));
      return t;
    };
    for (int id : in.inputs) operands[size_t(in.index)].push_back(resolve(id));
    for (int id : in.outputs) results[size_t(in.index)].push_back(resolve(id));
  }

  // 3. zero the gradients, run
  std::memset(memory_->region(Region::grad), 0, size_t(memory_->regionSize(Region::grad)));
  ExecResult exec;
  try {
    StepParams withGroups = params;
    withGroups.groupRanks = &groupRanks_;
    std::vector<SymbolSizes> sizes(size_t(program_.slots), program_.symbols.atBounds());
    for (int mb = 0; mb < program_.slots; mb++)
      if (const SymbolSizes* s = sizesOf(mb)) sizes[size_t(mb)] = *s;
    std::array<ScratchSlice, kStreamCount> scratch;
    for (int st = 0; st < kStreamCount; st++)
      scratch[size_t(st)] = {memory_->scratch(program_, st), program_.scratchBytes[size_t(st)]};
    exec = execute(sharedProgram_, std::move(operands), std::move(results), std::move(sizes), withGroups, scratch,
                   memory_, options_.timing, backend_);
  } catch (const AbandonedStepError& e) {
    broken_ = e.what();
    throw;
  }
  lastRows_ = exec.rows;
  lastSizes_ = std::move(exec.sizes);

  StepResult r;
  for (const ProgramOutput& o : program_.outputs) {
    Tensor t;
    t.data = memory_->buffer(program_, o.buffer);
    t.dtype = program_.buffers[size_t(o.buffer)].dtype;
    t.numel = 1;
    r.outputs.push_back({o.name, o.microbatch, scalarValue(t, o.name.c_str())});
  }
  for (const auto& [name, id] : program_.scalars) r.scalars.emplace_back(name, scalar(name));
  r.instructionsRun = exec.instructionsRun;
  r.hostBytes = memory_->regionSize(Region::host);
  r.regionBytes = memory_->totalBytes() - r.hostBytes - memory_->regionSize(Region::scratch);
  r.scratchHighBytes = exec.scratchHighBytes;
  r.timing = std::move(exec.timing);
  r.startWallMs = exec.startWallMs;
  r.stepMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace lfc
