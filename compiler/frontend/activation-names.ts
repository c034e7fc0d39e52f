// The names users may give to --recompute-modules and --offload-tensors: Megatron-LM's and
// LoongForge's words, each with the part of lfc's decoder layer it means. One table per flag; the
// layout rules (compiler/parallel/validate.ts) refuse any other name and suggest the nearest.
//
// Scopes of decoder layer i (compiler/frontend/build.ts; expert parallelism from
// passes/parallel/expert.ts), in order:
//   model.layers.<i>.input_layernorm           rmsnorm of the layer's residual input
//   model.layers.<i>.self_attn                 q_proj, k_proj, v_proj, q_norm/k_norm (qk-norm
//                                              models), rope, attention, o_proj
//   (residual add)
//   model.layers.<i>.post_attention_layernorm  Megatron's pre_mlp_layernorm
//   model.layers.<i>.mlp                       dense: gate_proj, up_proj, swiglu, down_proj;
//                                              MoE: gate (router linear), router_topk,
//                                              moe_aux_loss, moe_permute, [ep > 1: all_to_all_v
//                                              dispatch, moe_sort_chunks], experts
//                                              (grouped_linear gate_proj, up_proj, swiglu,
//                                              down_proj), [ep > 1: moe_sort_chunks⁻¹,
//                                              all_to_all_v combine], moe_unpermute
//   (residual add)

/** --recompute-granularity / --recompute-modules of a compile (CompileOptions.recompute). */
export interface RecomputeOptions {
  readonly granularity: 'full' | 'selective';
  /** with selective: names of RECOMPUTE_MODULES */
  readonly modules?: readonly string[];
}

/** --recompute-modules (with --recompute-granularity selective): what is recomputed in backward. */
export const RECOMPUTE_MODULES = {
  core_attn:
    'attention core of model.layers.<i>.self_attn: the attention op over q, k (after rope) and v',
  mlp: 'dense MLP model.layers.<i>.mlp: gate_proj, up_proj, swiglu, down_proj',
  moe: 'whole MoE block model.layers.<i>.mlp: router, moe_permute, dispatch, experts, combine, moe_unpermute',
  moe_act:
    'experts activation: the swiglu between gate_proj/up_proj and down_proj in model.layers.<i>.mlp.experts',
  layernorm: 'decoder norms model.layers.<i>.input_layernorm and .post_attention_layernorm',
  a2a_overlap_attn:
    'A2A-overlap node attn: model.layers.<i>.input_layernorm, .self_attn (q/k/v_proj … o_proj) and the residual add',
  a2a_overlap_post_attn:
    'A2A-overlap node post_attn: .post_attention_layernorm, router (mlp.gate, router_topk, moe_aux_loss) and moe_permute, up to the dispatch all_to_all_v',
  a2a_overlap_mlp:
    'A2A-overlap node mlp: the local experts model.layers.<i>.mlp.experts (grouped_linear gate_proj, up_proj, swiglu, down_proj) between dispatch and combine',
} as const satisfies Record<string, string>;

/** --offload-tensors (with --fine-grained-activation-offloading): activations kept on the host
 * between forward and backward. The Megatron names are the inputs of the module they name. */
export const OFFLOAD_TENSORS = {
  dispatched_input:
    'rows the dispatch all_to_all_v delivers to this rank, sorted by local expert (ep 1: the moe_permute rows): the input of model.layers.<i>.mlp.experts',
  pre_mlp_layernorm_output:
    'output of model.layers.<i>.post_attention_layernorm: the input of the router (mlp.gate) and moe_permute (dense: of the MLP)',
  attn_norm: 'input of model.layers.<i>.input_layernorm: the residual stream entering the layer',
  qkv_linear:
    'input of .self_attn q_proj/k_proj/v_proj: the output of model.layers.<i>.input_layernorm',
  core_attn: 'inputs of the .self_attn attention op: q and k after rope, v',
  attn_proj: 'input of .self_attn.o_proj: the attention output with heads flattened',
  mlp_norm:
    'input of model.layers.<i>.post_attention_layernorm: the residual after the attention add',
  expert_fc1:
    'input of the experts first grouped_linear (gate_proj, up_proj) in model.layers.<i>.mlp.experts',
  moe_act:
    'inputs of the experts swiglu in model.layers.<i>.mlp.experts: the gate_proj and up_proj outputs',
} as const satisfies Record<string, string>;

export type RecomputeModule = keyof typeof RECOMPUTE_MODULES;
export type OffloadTensor = keyof typeof OFFLOAD_TENSORS;

/** The known name nearest to `name` (for "did you mean", whatever the distance). */
export { closest as nearestName } from '../errors.js';
