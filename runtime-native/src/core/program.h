// A rank's program (compiler/plan/format.ts: ProgramFile), parsed and validated.
//
// parseProgram checks everything a step relies on before anything runs: format and version, every
// op known and executable (collectives refused), operand counts and attributes against the kernel
// registry, buffer ids, regions, dtypes and dims, views, data inputs, scalars and outputs, and the
// events (each recorded by exactly one instruction, no instruction able to wait forever). A
// failure throws ProgramError naming the program and, where there is one, the instruction index,
// op and scope.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/shape.h"
#include "generated/schema.h"

namespace lfc {

using schema::Op;

constexpr int kOpCount = int(Op::kCount);
constexpr int kStreamCount = int(sizeof(schema::kStreams) / sizeof(schema::kStreams[0]));
static_assert(sizeof(schema::kOpNames) / sizeof(schema::kOpNames[0]) == size_t(kOpCount),
              "schema.h: kOpNames and enum Op differ in length");

// Memory regions, by the names of schema::kRegions (the parser maps names, so the generated
// header's order does not matter; a region it lists that this enum lacks is refused at load).
// host: offloaded activations (only offload/reload touch it; pinned host memory on a GPU).
// scratch: no buffers; the streams' temporaries (ops/op.h), one slice per stream (scratchBytes).
enum class Region : int { arena, param, grad, optim, data, scalar, host, scratch, kCount };
inline constexpr const char* kRegionNames[] = {"arena", "param", "grad", "optim", "data", "scalar", "host", "scratch"};
inline const char* regionName(Region r) { return kRegionNames[int(r)]; }

// Data fields a microbatch fills (ProgramInput.name) and their element types. caption_mask (1 where
// the label is a caption token) is for a caption-loss metric; given with the microbatch or derived.
enum class DataField : int {
  tokens,
  labels,
  loss_mask,
  positions,
  segments,
  patches,
  image_segments,
  patch_rows,
  patch_cols,
  caption_mask,
  patch_positions,    // (Np, 2) row, column: the 2-D rotary positions
  window_segments,    // (Np) attention window
  patch_pos_ids,      // (Np, 4) rows of the interpolated position table
  patch_pos_weights,  // (Np, 4) their bilinear weights
  kCount
};
inline constexpr const char* kDataFieldNames[] = {
    "tokens",         "labels",     "loss_mask",  "positions",    "segments",
    "patches",        "image_segments", "patch_rows", "patch_cols", "caption_mask",
    "patch_positions", "window_segments", "patch_pos_ids", "patch_pos_weights"};
inline constexpr DType kDataFieldTypes[] = {DType::i32, DType::i32, DType::u8,  DType::i32,
                                            DType::i32, DType::f32, DType::i32, DType::i32,
                                            DType::i32, DType::u8,  DType::i32, DType::i32,
                                            DType::i32, DType::f32};
static_assert(sizeof(kDataFieldNames) / sizeof(kDataFieldNames[0]) == size_t(DataField::kCount));
static_assert(sizeof(kDataFieldTypes) / sizeof(kDataFieldTypes[0]) == size_t(DataField::kCount));

constexpr int kRegionCount = int(Region::kCount);

struct Buffer {
  int id = 0;
  std::string name;
  Region region = Region::arena;
  bool host = false;
  DType dtype = DType::f32;
  std::vector<Dim> shape;
  bool symbolic = false;  // some dim depends on a microbatch's sizes
  bool runTime = false;   // some dim is over a run-time symbol (set during the step)
  int64_t offset = 0;     // within its region (data: within its microbatch slot's region)
  int64_t bytes = 0;      // planned, at the symbols' bounds
  int viewOf = -1;        // the buffer whose bytes a view shares
  int root = 0;           // the buffer that owns the bytes (itself unless a view)
  int microbatch = -1;
};

struct Instr {
  int index = 0;
  int stream = 0;  // index into schema::kStreams
  Op op = Op::embedding;
  std::vector<int> inputs, outputs;
  nlohmann::json attrs = nlohmann::json::object();
  std::vector<int> wait, record;
  int microbatch = -1;
  std::string phase, scope;
  // collectives: this one's ordinal among the program's collectives with the same `group`
  // attribute on the same stream; the members of a group issue the same sequence, so it names
  // the call alike on every member (comm::Communicator::allReduce's key)
  int commOrdinal = -1;
};

struct ProgramParam {
  std::string name;
  int buffer = -1, grad = -1, expAvg = -1, expAvgSq = -1;
  std::vector<std::pair<int64_t, int64_t>> shard;  // per dim [start, length] in the global tensor
};

struct ProgramInput {
  std::string name;
  DataField field = DataField::tokens;
  int buffer = -1;
  int microbatch = 0;
};

struct ProgramOutput {
  std::string name;
  int buffer = -1;
  int microbatch = -1;
};

struct Program {
  std::string id;
  SymbolTable symbols;  // S, Nv, then the run-time symbols its dims may name
  std::array<int64_t, kRegionCount> regionBytes{};  // indexed by Region
  // per stream (schema::kStreams): its slice of the scratch region, in stream order; each a
  // multiple of 64 bytes, summing to the region
  std::array<int64_t, kStreamCount> scratchBytes{};
  int64_t arenaLowerBoundBytes = 0;
  std::vector<Buffer> buffers;
  std::vector<ProgramParam> params;
  std::vector<ProgramInput> inputs;
  std::vector<std::pair<std::string, int>> scalars;  // name → buffer
  std::vector<ProgramOutput> outputs;
  int events = 0;
  std::vector<Instr> instrs;

  // derived
  int slots = 0;                              // microbatch slots: 1 + the largest index used
  std::vector<std::vector<int>> streamInstrs;  // per stream (schema::kStreams), in issue order
  std::vector<int> recordedBy;                 // per event: the instruction that records it

  int64_t regionSize(Region r) const { return regionBytes[int(r)]; }
  int scalarBuffer(const std::string& name) const;  // −1 when absent
};

// collectives: accept collective instructions (checked against comm/collectives.h's table) for a
// runtime that will have a collective backend; otherwise they are refused at load.
// symbols: the plan's symbols (plan.json `symbols`, name and bound): S and Nv come from the data,
// the others are run-time symbols. A program may also declare them itself (a `symbols` list of the
// same form); a name given twice must have one bound.
struct ParseOptions {
  bool collectives = false;
  std::vector<SymbolDecl> symbols;
};

Program parseProgram(const std::string& jsonText, const ParseOptions& options = {});

// "instruction 12 (linear, scope model.layers.0.mlp)"
std::string describeInstr(const Instr& in);

}  // namespace lfc
