// The kernel registry: one entry per op kind of the generated schema, indexed by schema::Op.
//
// An entry says how the op is treated (category), how many operands it takes, which attributes
// the loader checks (`name:type`, `?` after the name when optional; types as in ir/ops.ts: number
// int bool string ints dims dtype), whether an output may share memory with input 0, and the
// function that runs it. registry.cc builds the table with one line per op and a static_assert
// that no op is left without an entry, so adding an op kind to ir/ops.ts (and regenerating the
// schema) fails the build until the op has a line here.
#pragma once

#include "core/program.h"
#include "ops/op.h"

namespace lfc {

enum class OpClass : int { compute, layout, optimizer, collective, memory };

using RunFn = void (*)(const Instr&, StepCtx&);

constexpr int kVariadic = -1;

struct OpEntry {
  OpClass cls = OpClass::compute;
  int minIn = -2;  // −2: no entry (the static_assert in registry.cc catches it)
  int maxIn = 0;   // kVariadic: no upper bound
  int minOut = 0;
  int maxOut = 0;
  const char* attrs = "";
  bool inPlace = false;  // output 0 may be input 0 (same bytes)
  RunFn run = nullptr;
  // (a comparison of `run` with null is not a constant expression under every compiler and
  // sanitizer, so the static check looks at the counts; the loader checks `run`)
  constexpr bool present() const { return minIn != -2; }
};

const OpEntry& opEntry(Op op);
const char* opName(Op op);

// Load-time checks of one instruction against its entry: operand counts and attributes (dims
// over the program's symbols). Returns a problem description, or "" when fine.
std::string checkInstrAgainstRegistry(const Instr& in, const SymbolTable& symbols);

}  // namespace lfc
