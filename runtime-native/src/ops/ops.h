// The op implementations the registry lists, one function per op kind (collectives have none:
// this runtime refuses them at load). See op.h for the contract.
#pragma once

#include "ops/op.h"

namespace lfc::ops {

// forward compute (compute.cc)
void run_embedding(const Instr& in, StepCtx& c);
void run_patch_embed(const Instr& in, StepCtx& c);
void run_linear(const Instr& in, StepCtx& c);
void run_layernorm(const Instr& in, StepCtx& c);
void run_rmsnorm(const Instr& in, StepCtx& c);
void run_rope(const Instr& in, StepCtx& c);
void run_attention(const Instr& in, StepCtx& c);
void run_gelu(const Instr& in, StepCtx& c);
void run_swiglu(const Instr& in, StepCtx& c);
void run_add(const Instr& in, StepCtx& c);
void run_merge_visual(const Instr& in, StepCtx& c);
void run_router_topk(const Instr& in, StepCtx& c);
void run_moe_permute(const Instr& in, StepCtx& c);
void run_grouped_linear(const Instr& in, StepCtx& c);
void run_moe_unpermute(const Instr& in, StepCtx& c);
void run_moe_aux_loss(const Instr& in, StepCtx& c);
void run_cross_entropy(const Instr& in, StepCtx& c);
void run_vocab_logsumexp(const Instr& in, StepCtx& c);
void run_lse_combine(const Instr& in, StepCtx& c);
void run_vocab_target_logit(const Instr& in, StepCtx& c);
void run_ce_from_stats(const Instr& in, StepCtx& c);
void run_moe_rank_counts(const Instr& in, StepCtx& c);
void run_moe_sort_chunks(const Instr& in, StepCtx& c);
void run_moe_local_counts(const Instr& in, StepCtx& c);

// the ViT data-parallel balance (balance.cc)
void run_image_sizes(const Instr& in, StepCtx& c);
void run_vit_balance_route(const Instr& in, StepCtx& c);
void run_segment_offset(const Instr& in, StepCtx& c);
void run_gather_rows(const Instr& in, StepCtx& c);
void run_scatter_rows(const Instr& in, StepCtx& c);

// backward (backward.cc)
void run_embedding_grad(const Instr& in, StepCtx& c);
void run_linear_dgrad(const Instr& in, StepCtx& c);
void run_linear_wgrad(const Instr& in, StepCtx& c);
void run_layernorm_grad(const Instr& in, StepCtx& c);
void run_rmsnorm_grad(const Instr& in, StepCtx& c);
void run_rope_grad(const Instr& in, StepCtx& c);
void run_attention_grad(const Instr& in, StepCtx& c);
void run_gelu_grad(const Instr& in, StepCtx& c);
void run_swiglu_grad(const Instr& in, StepCtx& c);
void run_merge_visual_grad(const Instr& in, StepCtx& c);
void run_router_topk_grad(const Instr& in, StepCtx& c);
void run_moe_permute_grad(const Instr& in, StepCtx& c);
void run_grouped_linear_dgrad(const Instr& in, StepCtx& c);
void run_grouped_linear_wgrad(const Instr& in, StepCtx& c);
void run_linear_wgrad_accumulate(const Instr& in, StepCtx& c);
void run_grouped_linear_wgrad_accumulate(const Instr& in, StepCtx& c);
void run_moe_unpermute_grad(const Instr& in, StepCtx& c);
void run_moe_aux_loss_grad(const Instr& in, StepCtx& c);
void run_cross_entropy_grad(const Instr& in, StepCtx& c);
void run_vocab_logsumexp_grad(const Instr& in, StepCtx& c);
void run_lse_combine_grad(const Instr& in, StepCtx& c);
void run_vocab_target_logit_grad(const Instr& in, StepCtx& c);
void run_ce_from_stats_grad(const Instr& in, StepCtx& c);

// layout and constants (layout.cc)
void run_reshape(const Instr& in, StepCtx& c);
void run_split(const Instr& in, StepCtx& c);
void run_concat(const Instr& in, StepCtx& c);
void run_constant(const Instr& in, StepCtx& c);
void run_copy_to_group(const Instr& in, StepCtx& c);
void run_group_slice(const Instr& in, StepCtx& c);

// optimizer (optimizer.cc)
void run_grad_accumulate(const Instr& in, StepCtx& c);
void run_sum_squares(const Instr& in, StepCtx& c);
void run_clip_coef(const Instr& in, StepCtx& c);
void run_adamw(const Instr& in, StepCtx& c);

// memory moves (layout.cc)
void run_offload(const Instr& in, StepCtx& c);
void run_reload(const Instr& in, StepCtx& c);

}  // namespace lfc::ops
