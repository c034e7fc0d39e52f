#include "ops/registry.h"

#include <array>
#include <cmath>
#include <string>

#include "ops/ops.h"

namespace lfc {

namespace {

using namespace ops;

constexpr OpEntry entry(OpClass cls, int minIn, int maxIn, int minOut, int maxOut, const char* attrs,
                        RunFn run, bool inPlace = false) {
  OpEntry e;
  e.cls = cls;
  e.minIn = minIn;
  e.maxIn = maxIn;
  e.minOut = minOut;
  e.maxOut = maxOut;
  e.attrs = attrs;
  e.run = run;
  e.inPlace = inPlace;
  return e;
}

constexpr OpEntry compute(int minIn, int maxIn, int minOut, int maxOut, const char* attrs, RunFn run,
                          bool inPlace = false) {
  return entry(OpClass::compute, minIn, maxIn, minOut, maxOut, attrs, run, inPlace);
}

constexpr OpEntry collective() {
  return entry(OpClass::collective, 0, kVariadic, 0, kVariadic, "", nullptr);
}

constexpr int V = kVariadic;

// The optional attributes of every compute op: the output's and the weight gradient's element type.
constexpr const char* kComputeDTypeAttrs = "dtype?:dtype,grad_dtype?:dtype";

// One line per op kind: operand counts (inputs min..max, outputs min..max), attributes, function.
constexpr std::array<OpEntry, kOpCount> buildRegistry() {
  std::array<OpEntry, kOpCount> r{};
  auto set = [&r](Op op, OpEntry e) { r[size_t(op)] = e; };
  // forward compute
  set(Op::embedding, compute(2, 3, 1, 1, "shard_group?:string,group_size?:int", run_embedding));
  set(Op::patch_embed, compute(2, 3, 1, 1, "", run_patch_embed));
  set(Op::linear, compute(2, 3, 1, 1, "", run_linear));
  set(Op::layernorm, compute(3, 3, 1, 1, "eps:number", run_layernorm));
  set(Op::rmsnorm, compute(2, 2, 1, 1, "eps:number", run_rmsnorm));
  set(Op::rope, compute(2, 2, 1, 1, "theta:number,sections:ints,layout?:string", run_rope, true));
  set(Op::attention, compute(4, 4, 2, 2, "causal:bool,scale:number,max_segment?:int,expected_segment?:int,windows?:bool", run_attention));
  set(Op::gelu, compute(1, 1, 1, 1, "exact?:bool", run_gelu, true));
  set(Op::swiglu, compute(2, 2, 1, 1, "", run_swiglu, true));
  set(Op::add, compute(2, 2, 1, 1, "", run_add, true));
  set(Op::merge_visual, compute(4, 4, 1, 1, "mode:string", run_merge_visual, true));
  set(Op::router_topk, compute(1, 1, 3, 3, "k:int,normalize?:bool", run_router_topk));
  set(Op::moe_permute, compute(2, 3, 3, 3, "num_experts:int,capacity?:int,out_rows?:dims,drop_policy?:string", run_moe_permute));
  set(Op::grouped_linear, compute(3, V, 1, 1, "", run_grouped_linear));
  set(Op::moe_unpermute, compute(3, 3, 1, 1, "", run_moe_unpermute));
  set(Op::moe_aux_loss, compute(3, 3, 1, 1, "coeff:number", run_moe_aux_loss));
  set(Op::cross_entropy, compute(4, 4, 1, 1, "", run_cross_entropy));
  set(Op::vocab_logsumexp, compute(1, 1, 1, 1, "", run_vocab_logsumexp));
  set(Op::lse_combine, compute(1, 1, 1, 1, "", run_lse_combine));
  set(Op::vocab_target_logit,
      compute(2, 3, 1, 1, "shard_group:string,group_size:int", run_vocab_target_logit));
  set(Op::ce_from_stats, compute(4, 4, 1, 1, "", run_ce_from_stats));
  set(Op::moe_rank_counts, compute(1, 1, 1, 1, "group_size:int", run_moe_rank_counts));
  set(Op::moe_sort_chunks, compute(2, 2, 1, 1, "inverse:bool", run_moe_sort_chunks));
  set(Op::moe_local_counts, compute(1, 1, 1, 1, "", run_moe_local_counts));
  set(Op::image_sizes, compute(1, 1, 1, 1, "images:int", run_image_sizes));
  set(Op::vit_balance_route, compute(2, 2, 5, 5, "group:string,group_size:int,images:int,merge:int,capacity:int",
                                     run_vit_balance_route));
  set(Op::segment_offset, compute(1, 1, 1, 1, "group:string,group_size:int,stride:int", run_segment_offset));
  set(Op::gather_rows, compute(2, 2, 1, 1, "", run_gather_rows));
  // backward
  set(Op::embedding_grad,
      compute(2, 3, 1, 1, "rows:int,shard_group?:string,group_size?:int", run_embedding_grad));
  set(Op::linear_dgrad, compute(2, 2, 1, 1, "", run_linear_dgrad));
  set(Op::linear_wgrad, compute(2, 2, 1, 2, "bias:bool", run_linear_wgrad));
  set(Op::layernorm_grad, compute(3, 3, 3, 3, "eps:number", run_layernorm_grad));
  set(Op::rmsnorm_grad, compute(3, 3, 2, 2, "eps:number", run_rmsnorm_grad));
  set(Op::rope_grad, compute(2, 2, 1, 1, "theta:number,sections:ints,layout?:string", run_rope_grad, true));
  set(Op::attention_grad,
      compute(7, 7, 3, 3, "causal:bool,scale:number,max_segment?:int,expected_segment?:int,windows?:bool", run_attention_grad));
  set(Op::gelu_grad, compute(2, 2, 1, 1, "exact?:bool", run_gelu_grad, true));
  set(Op::swiglu_grad, compute(3, 3, 2, 2, "", run_swiglu_grad));
  set(Op::merge_visual_grad, compute(3, 3, 2, 2, "mode:string,visual_rows:dims",
                                     run_merge_visual_grad, true));
  set(Op::router_topk_grad, compute(4, 4, 1, 1, "normalize?:bool", run_router_topk_grad));
  set(Op::moe_permute_grad, compute(2, 2, 1, 1, "k:int", run_moe_permute_grad));
  set(Op::grouped_linear_dgrad, compute(3, V, 1, 1, "", run_grouped_linear_dgrad));
  set(Op::grouped_linear_wgrad, compute(3, 3, 1, V, "", run_grouped_linear_wgrad));
  // the weight gradients summed into the gradient buffers (inputs after dy, x (, counts))
  set(Op::linear_wgrad_accumulate, compute(3, 4, 0, 0, "bias:bool", run_linear_wgrad_accumulate));
  set(Op::grouped_linear_wgrad_accumulate, compute(4, V, 0, 0, "", run_grouped_linear_wgrad_accumulate));
  set(Op::moe_unpermute_grad, compute(4, 4, 2, 2, "", run_moe_unpermute_grad));
  set(Op::moe_aux_loss_grad, compute(4, 4, 1, 1, "coeff:number", run_moe_aux_loss_grad));
  set(Op::cross_entropy_grad, compute(5, 5, 1, 1, "", run_cross_entropy_grad));
  set(Op::vocab_logsumexp_grad, compute(3, 3, 1, 1, "", run_vocab_logsumexp_grad));
  set(Op::lse_combine_grad, compute(3, 3, 1, 1, "", run_lse_combine_grad));
  set(Op::vocab_target_logit_grad, compute(2, 3, 1, 1, "shard_group:string,group_size:int,columns:int",
                                           run_vocab_target_logit_grad));
  set(Op::ce_from_stats_grad, compute(4, 4, 2, 2, "", run_ce_from_stats_grad));
  set(Op::scatter_rows, compute(2, 2, 1, 1, "rows:dims", run_scatter_rows));
  // layout and constants
  set(Op::reshape, entry(OpClass::layout, 1, 1, 1, 1, "shape:dims", run_reshape, true));
  set(Op::split, entry(OpClass::layout, 1, 1, 1, V, "sizes:ints", run_split));
  set(Op::concat, entry(OpClass::layout, 1, V, 1, 1, "", run_concat));
  set(Op::constant, entry(OpClass::layout, 0, 0, 1, 1, "value:number,dtype:dtype,shape:dims", run_constant));
  set(Op::copy_to_group, entry(OpClass::layout, 1, 1, 1, 1, "group:string,group_size:int", run_copy_to_group, true));
  set(Op::group_slice, entry(OpClass::layout, 1, 1, 1, 1, "group:string,group_size:int", run_group_slice));
  // optimizer: in place on persistent buffers
  set(Op::grad_accumulate, entry(OpClass::optimizer, 2, 2, 0, 0, "", run_grad_accumulate));
  set(Op::sum_squares, entry(OpClass::optimizer, 1, V, 1, 1, "scales?:numbers", run_sum_squares));
  set(Op::clip_coef, entry(OpClass::optimizer, 1, 1, 1, 1, "max_norm:number", run_clip_coef));
  set(Op::adamw, entry(OpClass::optimizer, 5, 6, 0, 0, "beta1:number,beta2:number,eps:number,weight_decay:number",
                       run_adamw));
  // collectives: need a backend this runtime does not have yet
  set(Op::all_reduce, collective());
  set(Op::all_gather, collective());
  set(Op::reduce_scatter, collective());
  set(Op::broadcast, collective());
  set(Op::all_to_all_v, collective());
  set(Op::gather_v, collective());
  set(Op::scatter_v, collective());
  set(Op::all_gather_v, collective());
  set(Op::reduce_scatter_v, collective());
  set(Op::send, collective());
  set(Op::recv, collective());
  // memory moves
  set(Op::offload, entry(OpClass::memory, 1, 1, 1, 1, "", run_offload));
  set(Op::reload, entry(OpClass::memory, 1, 1, 1, 1, "", run_reload));
  return r;
}

constexpr std::array<OpEntry, kOpCount> kRegistry = buildRegistry();

constexpr int firstMissing(const std::array<OpEntry, kOpCount>& r) {
  for (int i = 0; i < kOpCount; i++)
    if (!r[size_t(i)].present()) return i;
  return kOpCount;
}

// A missing entry fails the build here; the error shows the index of the op (its position in
// schema::Op) as the template argument.
template <int MissingOpIndex>
struct RegistryEntryMissing {
  static_assert(MissingOpIndex == kOpCount,
                "registry.cc: an op kind of generated/schema.h has no registry entry");
};
template struct RegistryEntryMissing<firstMissing(kRegistry)>;

bool isIntegral(const nlohmann::json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d);
}

// "" when v fits the type (dims over `symbols`), else what was wrong
std::string attrTypeProblem(const std::string& type, const nlohmann::json& v, const SymbolTable& symbols) {
  if (type == "number") {
    if (v.is_number() && std::isfinite(v.get<double>())) return "";
  } else if (type == "int") {
    if (isIntegral(v)) return "";
  } else if (type == "bool") {
    if (v.is_boolean()) return "";
  } else if (type == "string") {
    if (v.is_string()) return "";
  } else if (type == "dtype") {
    if (v.is_string() && parseDType(v.get<std::string>())) return "";
  } else if (type == "ints") {
    bool ok = v.is_array();
    if (ok)
      for (const auto& x : v) ok = ok && isIntegral(x);
    if (ok) return "";
  } else if (type == "numbers") {
    bool ok = v.is_array();
    if (ok)
      for (const auto& x : v) ok = ok && x.is_number() && std::isfinite(x.get<double>());
    if (ok) return "";
  } else if (type == "dims") {
    if (v.is_array()) {
      for (const auto& x : v) {
        if (!x.is_string()) return "must be a list of dims as strings, got " + v.dump();
        try {
          parseDim(x.get<std::string>(), symbols);
        } catch (const std::exception& e) {
          return e.what();
        }
      }
      return "";
    }
  } else {
    return "has unknown attribute type '" + type + "' in the registry";
  }
  return "must be " + type + ", got " + v.dump();
}

std::string countText(int lo, int hi) {
  if (hi == kVariadic) return std::to_string(lo) + " or more";
  if (lo == hi) return std::to_string(lo);
  return std::to_string(lo) + "–" + std::to_string(hi);
}

}  // namespace

const OpEntry& opEntry(Op op) { return kRegistry[size_t(op)]; }

const char* opName(Op op) { return schema::kOpNames[int(op)]; }

std::string checkInstrAgainstRegistry(const Instr& in, const SymbolTable& symbols) {
  const OpEntry& e = opEntry(in.op);
  const int ni = int(in.inputs.size()), no = int(in.outputs.size());
  if (ni < e.minIn || (e.maxIn != kVariadic && ni > e.maxIn))
    return cat(opName(in.op), " takes ", countText(e.minIn, e.maxIn), " inputs, got ", ni);
  if (no < e.minOut || (e.maxOut != kVariadic && no > e.maxOut))
    return cat(opName(in.op), " gives ", countText(e.minOut, e.maxOut), " outputs, got ", no);
  // attributes: "name:type" or "name?:type", comma separated; every compute op also takes the
  // element types the compiler records (informational: the buffers' dtypes are authoritative)
  std::vector<std::string> known;
  const std::string spec = e.cls == OpClass::compute ? cat(e.attrs, *e.attrs ? "," : "", kComputeDTypeAttrs) : e.attrs;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    const size_t colon = item.find(':');
    std::string name = item.substr(0, colon);
    const std::string type = item.substr(colon + 1);
    const bool optional = !name.empty() && name.back() == '?';
    if (optional) name.pop_back();
    known.push_back(name);
    if (!in.attrs.contains(name)) {
      if (optional) continue;
      return cat("missing attribute '", name, "' (", type, ")");
    }
    const std::string problem = attrTypeProblem(type, in.attrs.at(name), symbols);
    if (!problem.empty()) return cat("attribute '", name, "' ", problem);
  }
  for (const auto& [name, _] : in.attrs.items()) {
    bool ok = false;
    for (const auto& k : known) ok = ok || k == name;
    if (!ok) return cat("unknown attribute '", name, "' for ", opName(in.op));
  }
  return "";
}

}  // namespace lfc
