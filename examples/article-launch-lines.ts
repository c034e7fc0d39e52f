// The two launch lines of the LoongForge article (../shared/reference), as `lfc compile` takes
// them (`-o DIR` left to the caller): hetero DP on Qwen2.5-VL-7B, and full separation with the
// MoE all-to-all overlap, selective recompute and fine-grained offload on Qwen3-VL-30B-A3B.
// The tests compile both as written (test/cli/compile-flags.test.ts), measure level 3's memory
// options on the second (test/plan/encoder-memory.test.ts, bench/encoder-memory.ts). From a
// shell: ./lfc compile <the line> -o DIR.

export const ARTICLE_7B = `--model-name qwen2_5_vl_7b --nnodes 1 --nproc-per-node 8 --training-phase sft
  --attention-backend flash --tensor-model-parallel-size 4 --pipeline-model-parallel-size 1
  --use-distributed-optimizer --enable-encoder-hetero-dp +model.image_encoder.freeze=True
  --micro-batch-size 1 --global-batch-size 32 --lr 1e-5`;

export const ARTICLE_30B = `--model-name qwen3_vl_30b_a3b --nnodes 4 --nproc-per-node 8 --training-phase sft
  --attention-backend flash --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2
  --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall
  --num-virtual-stages-per-pipeline-rank 2 --use-distributed-optimizer --enable-full-hetero-dp
  --overlap-moe-expert-parallel-comm --delay-wgrad-compute +model.image_encoder.freeze=True
  --micro-batch-size 1 --global-batch-size 64 --lr 1e-5 --recompute-granularity selective
  --recompute-modules a2a_overlap_attn a2a_overlap_post_attn a2a_overlap_mlp
  --fine-grained-activation-offloading --offload-tensors dispatched_input pre_mlp_layernorm_output`;

/** a launch line's arguments */
export const argvOf = (line: string): string[] => line.trim().split(/\s+/);
