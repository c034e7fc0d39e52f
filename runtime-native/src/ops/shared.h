// Argument checks and size derivations shared by a forward op and its backward (compute.cc,
// backward.cc). Each throws OpError naming the operand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/merge.h"
#include "kernels/cpu/rope.h"
#include "ops/op.h"

namespace lfc::ops {

// an output of dtype want holding n elements
inline void requireOut(const Tensor& t, DType want, int64_t n, const char* what) {
  requireDType(t, want, what);
  requireNumel(t, n, what);
}

inline void requireDim(int64_t got, int64_t want, const char* what) {
  if (got != want) throw OpError(cat(what, ": ", got, " ≠ ", want));
}

// same dtype and element count as ref (layout moves; float kernel operands only share the count)
inline void requireSame(const Tensor& t, const Tensor& ref, const char* what) {
  requireDType(t, ref.dtype, what);
  requireNumel(t, ref.numel, what);
}

// This rank's index in the group named by the string attribute groupAttr ("group",
// "shard_group"), checked against the attribute group_size: 0 ≤ rank < group_size.
struct GroupPos {
  int64_t rank = 0, size = 1;
};
inline GroupPos groupPos(const StepCtx& c, const char* groupAttr) {
  const std::string kind = c.str(groupAttr);
  const GroupPos g{c.groupRank(kind), c.integer("group_size")};
  if (g.size < 1) throw OpError(cat("group_size must be ≥ 1, got ", g.size));
  if (g.rank < 0 || g.rank >= g.size)
    throw OpError(cat("this rank's index in group ", kind, " is ", g.rank, ", outside group_size ", g.size));
  return g;
}

// The vocab-parallel attributes of embedding and embedding_grad: this rank's block when
// shard_group is present, nothing otherwise.
inline std::optional<GroupPos> vocabShard(const StepCtx& c) {
  if (!c.has("shard_group")) return std::nullopt;
  return groupPos(c, "shard_group");
}

struct TargetArgs {
  int64_t T, V;
  const uint8_t* mask;  // null without the optional mask input
  GroupPos shard;
};
// vocab_target_logit(_grad): rows T and columns V of the logits, labels i32 [T] and the optional
// mask u8 [T] (input 2), the rank's vocabulary block
inline TargetArgs targetArgs(const StepCtx& c, int64_t T, int64_t V, const Tensor& labels) {
  requireDType(labels, DType::i32, "input 1 (labels)");
  requireNumel(labels, T, "input 1 (labels)");
  const uint8_t* mask = nullptr;
  if (c.numIn() > 2) {
    requireDType(c.in(2), DType::u8, "input 2 (mask)");
    requireNumel(c.in(2), T, "input 2 (mask)");
    mask = c.in(2).as<uint8_t>();
  }
  return TargetArgs{T, V, mask, groupPos(c, "shard_group")};
}
inline TargetArgs targetArgs(const StepCtx& c, const Tensor& logits, const Tensor& labels) {
  requireRank(logits, 2, "input 0 (logits)");
  return targetArgs(c, logits.dim(0), logits.dim(1), labels);
}

struct RopeArgs {
  std::vector<int32_t> sections;
  int64_t P = 1;
  cpu::RopeLayout layout = cpu::RopeLayout::sectioned;
};
// x [T, nh, d], positions i32 [T] or [T, P], attribute sections (P)
inline RopeArgs ropeArgs(const StepCtx& c, const Tensor& x, const Tensor& pos) {
  RopeArgs r;
  if (c.has("layout")) {
    const std::string layout = c.str("layout");
    if (layout == "interleaved") r.layout = cpu::RopeLayout::interleaved;
    else if (layout == "per_axis") r.layout = cpu::RopeLayout::per_axis;
    else if (layout != "sectioned")
      throw OpError(cat("attribute layout must be sectioned, interleaved or per_axis, got '", layout, "'"));
  }
  for (int64_t s : c.ints("sections")) r.sections.push_back(int32_t(s));
  r.P = int64_t(r.sections.size());
  requireDType(pos, DType::i32, "input 1 (positions)");
  requireNumel(pos, x.dim(0) * r.P, "input 1 (positions)");
  return r;
}

struct AttnArgs {
  int64_t T, nh, nkv, d;
};
inline AttnArgs attnArgs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seg) {
  requireRank(q, 3, "q");
  requireRank(k, 3, "k");
  requireFloat(q, "q");
  requireFloat(k, "k");
  requireFloat(v, k.numel, "v");
  requireDType(seg, DType::i32, "segments");
  const AttnArgs a{q.dim(0), q.dim(1), k.dim(1), q.dim(2)};
  requireDim(k.dim(0), a.T, "tokens of k vs q");
  requireDim(k.dim(2), a.d, "head dim of k vs q");
  requireNumel(seg, a.T, "segments");
  return a;
}

// The image placeholder id of a microbatch: an i32 scalar data input (the batch's image_token_id).
inline int32_t imageTokenId(const Tensor& t, const char* what) {
  requireDType(t, DType::i32, what);
  requireNumel(t, 1, what);
  return *t.as<int32_t>();
}

// router_topk's renormalization of the top-k probabilities (absent: on)
inline bool normalizeTopk(const StepCtx& c) { return !c.has("normalize") || c.flag("normalize"); }

inline cpu::MergeMode mergeMode(const StepCtx& c) {
  const std::string mode = c.str("mode");
  if (mode == "replace") return cpu::MergeMode::Replace;
  if (mode == "add") return cpu::MergeMode::Add;
  throw OpError(cat("attribute mode must be 'replace' or 'add', got '", mode, "'"));
}

struct GroupedArgs {
  int64_t E, N, in, out;
};
// x [N, in] (or dy [N, out] for the data gradient), counts i32 [E], weights W_e [out, in] from
// input firstW on; xIsOut: x holds `out` features (the data gradient's dy)
inline GroupedArgs groupedArgs(const StepCtx& c, const Tensor& x, const Tensor& counts, int firstW,
                               bool xIsOut = false) {
  requireRank(x, 2, "input 0");
  requireDType(counts, DType::i32, "input 1 (counts)");
  GroupedArgs g{c.numIn() - firstW, x.dim(0), 0, 0};
  requireNumel(counts, g.E, "input 1 (counts): one count per expert weight");
  const Tensor& w0 = c.in(firstW);
  requireRank(w0, 2, "expert weight 0");
  g.out = w0.dim(0);
  g.in = w0.dim(1);
  requireFloat(x, "input 0");
  for (int i = firstW; i < c.numIn(); i++) requireFloat(c.in(i), g.out * g.in, "expert weight");
  requireDim(x.dim(1), xIsOut ? g.out : g.in, "features of the rows vs the expert weights");
  return g;
}

// the expert weights, inputs firstW … as kernel operands
inline std::vector<cpu::Src> weightSrcs(const StepCtx& c, int firstW) {
  std::vector<cpu::Src> w;
  for (int i = firstW; i < c.numIn(); i++) w.push_back(src(c.in(i)));
  return w;
}

struct AuxArgs {
  int64_t T, E, k;
};
// probs [T, E], experts i32 [T, k], segments i32 [T]
inline AuxArgs auxArgs(const Tensor& probs, const Tensor& experts, const Tensor& seg) {
  requireRank(probs, 2, "probs");
  requireFloat(probs, "probs");
  requireRank(experts, 2, "experts");
  requireDType(experts, DType::i32, "experts");
  requireDType(seg, DType::i32, "segments");
  const AuxArgs a{probs.dim(0), probs.dim(1), experts.dim(1)};
  requireDim(experts.dim(0), a.T, "experts vs tokens");
  requireNumel(seg, a.T, "segments");
  return a;
}

struct CeArgs {
  int64_t T, V;
};
// logits [T, V], labels i32 [T], mask u8 [T]
inline CeArgs ceArgs(const Tensor& logits, const Tensor& labels, const Tensor& mask) {
  requireRank(logits, 2, "logits");
  requireFloat(logits, "logits");
  requireDType(labels, DType::i32, "labels");
  requireDType(mask, DType::u8, "mask");
  const CeArgs a{logits.dim(0), logits.dim(1)};
  requireNumel(labels, a.T, "labels");
  requireNumel(mask, a.T, "mask");
  return a;
}

}  // namespace lfc::ops
