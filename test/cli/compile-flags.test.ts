// lfc compile's flags → CompileOptions, parsed by the command's own declaration
// (parseCompileArgs): the article's two launch lines, list flags followed by overrides and by -o.
import { describe, expect, it } from 'vitest';
import { parseCompileArgs } from '../../cli/compile.js';
import { compile } from '../../compiler/pipeline.js';
import { ARTICLE_30B, ARTICLE_7B, argvOf as argv } from '../../examples/article-launch-lines.js';

describe('lfc compile: the article launch lines parse into their options', () => {
  it('hetero DP: Qwen2.5-VL-7B SFT, tp 4, an override before --micro-batch-size', () => {
    const r = parseCompileArgs(argv(`${ARTICLE_7B} -o DIR`));
    expect(r).toEqual({
      options: {
        model: 'qwen2_5_vl_7b',
        overrides: ['+model.image_encoder.freeze=True'],
        nnodes: 1,
        nprocPerNode: 8,
        parallel: { tp: 4, pp: 1 },
        distributedOptimizer: true,
        encoder: { heteroDp: true },
        microBatchSize: 1,
        globalBatchSize: 32,
        optimizer: { lr: 1e-5 },
        // --hardware's default: the partition balances priced seconds on it
        hardware: expect.objectContaining({ name: 'h800' }),
      },
      output: 'DIR',
      compatibility: { trainingPhase: 'sft', attentionBackend: 'flash' },
    });
    expect(r.options.moeOverlap).toBeUndefined();
    expect(r.options.recompute).toBeUndefined();
    expect(r.options.offloadTensors).toBeUndefined();
  });

  it('full separation + A2A overlap: Qwen3-VL-30B-A3B, list flags ended by a flag and by -o', () => {
    const r = parseCompileArgs(argv(`${ARTICLE_30B} -o DIR`));
    expect(r).toEqual({
      options: {
        model: 'qwen3_vl_30b_a3b',
        overrides: ['+model.image_encoder.freeze=True'],
        nnodes: 4,
        nprocPerNode: 8,
        parallel: { tp: 1, pp: 2, ep: 4, vpp: 2 },
        distributedOptimizer: true,
        encoder: { fullHeteroDp: true },
        moeOverlap: { overlap: true, delayWgrad: true },
        microBatchSize: 1,
        globalBatchSize: 64,
        optimizer: { lr: 1e-5 },
        recompute: {
          granularity: 'selective',
          modules: ['a2a_overlap_attn', 'a2a_overlap_post_attn', 'a2a_overlap_mlp'],
        },
        offloadTensors: ['dispatched_input', 'pre_mlp_layernorm_output'],
        hardware: expect.objectContaining({ name: 'h800' }),
        moeTokenDispatcher: 'alltoall',
      },
      output: 'DIR',
      compatibility: {
        trainingPhase: 'sft',
        attentionBackend: 'flash',
      },
    });
  });
});

describe('lfc compile: list flags', () => {
  it('an override after a list is an override, the model argument before it the model', () => {
    const r = parseCompileArgs(
      argv(`tiny-vlm-moe --recompute-granularity selective --recompute-modules core_attn moe_act
        model.image_encoder.tensor_model_parallel_size=1 --fine-grained-activation-offloading
        --offload-tensors attn_norm +model.image_encoder.freeze=True ~training.caption_metric`),
    );
    expect(r.options.model).toBe('tiny-vlm-moe');
    expect(r.options.recompute).toEqual({
      granularity: 'selective',
      modules: ['core_attn', 'moe_act'],
    });
    expect(r.options.offloadTensors).toEqual(['attn_norm']);
    expect(r.options.overrides).toEqual([
      'model.image_encoder.tensor_model_parallel_size=1',
      '+model.image_encoder.freeze=True',
      '~training.caption_metric',
    ]);
    expect(r.output).toBeUndefined();
  });

  it("token dropping: Megatron's capacity factor and drop policy, and the config keys they win over", () => {
    const r = parseCompileArgs(
      argv(`tiny-vlm-moe --moe-expert-capacity-factor 0.5 --moe-token-drop-policy position
        +model.text_decoder.moe_expert_capacity_factor=2 -o DIR`),
    );
    expect(r.options).toMatchObject({
      moeExpertCapacityFactor: 0.5,
      moeTokenDropPolicy: 'position',
    });
    const d = compile({ ...r.options, nprocPerNode: 2, parallel: { ep: 2 } }).config.model
      .text_decoder;
    expect([d.moe_expert_capacity_factor, d.moe_token_drop_policy]).toEqual([0.5, 'position']);
  });

  it('the encoder options of full separation, ViT DP balance', () => {
    const r = parseCompileArgs(
      argv(`tiny-vlm-moe --enable-full-hetero-dp --full-hetero-dp-cpu-offload
        --full-hetero-dp-encoder-recompute --use-vit-dp-balance -o DIR`),
    );
    expect(r.options.encoder).toEqual({
      fullHeteroDp: true,
      cpuOffload: true,
      recompute: true,
      vitDpBalance: true,
    });
  });
});

describe('the article launch lines compile, and the plan verifier accepts them', () => {
  it('hetero DP: Qwen2.5-VL-7B, tp 4, encoder frozen: one program per TP rank', () => {
    const { options } = parseCompileArgs(argv(`${ARTICLE_7B} -o DIR`));
    const r = compile(options); // throws on any verifier problem
    expect(r.placement.level).toBe(2);
    expect(r.programs.map((p) => p.id)).toEqual(['p0.t0', 'p0.t1', 'p0.t2', 'p0.t3']);
    expect(r.programs[1].instructions.filter((i) => i.op === 'broadcast')).toHaveLength(16);
  }, 120_000);

  it('full separation + A2A overlap + recompute + offload: Qwen3-VL-30B-A3B on 32 ranks', () => {
    const { options } = parseCompileArgs(argv(`${ARTICLE_30B} -o DIR`));
    const r = compile(options);
    expect(r.placement.level).toBe(3);
    for (const p of r.programs) {
      const ops = new Set(p.instructions.map((i) => `${i.stream}:${i.op}`));
      for (const want of ['compute:gather_v', 'comm:all_to_all_v', 'copy:offload', 'copy:reload'])
        expect(ops, `${p.id}: ${want}`).toContain(want);
      expect(p.instructions.some((i) => p.buffers[i.outputs[0]]?.name.endsWith('.recompute'))).toBe(
        true,
      );
    }
  }, 120_000);
});
