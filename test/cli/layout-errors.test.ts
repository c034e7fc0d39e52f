// lfc compile refuses invalid layouts with one line naming the rule, exit code 2 (the rules
// themselves are tested in test/parallel/validate.test.ts), and flags that need another flag or
// take a value lfc does not build with one line naming the flag.
import { describe, expect, it } from 'vitest';
import { cli } from '../helpers.js';

const CASES: [string, string[], RegExp][] = [
  [
    'world not a product of the sizes',
    ['tiny-vlm-moe', '--nproc-per-node', '6', '--tp', '4'],
    /\(world-decoder-grid\)/,
  ],
  [
    'expert grid',
    ['tiny-vlm-moe', '--nproc-per-node', '4', '--ep', '8'],
    /\((world-expert-grid|ep-experts)\)/,
  ],
  [
    'heads not divisible by tp',
    ['tiny-vlm', '--nproc-per-node', '16', '--tp', '16'],
    /\(tp-heads\)/,
  ],
  [
    'KV heads not divisible by tp',
    ['tiny-vlm', '--nproc-per-node', '8', '--tp', '8'],
    /\(tp-kv-heads\)/,
  ],
  [
    'experts not divisible by ep',
    ['tiny-vlm-moe', '--nproc-per-node', '6', '--ep', '3'],
    /\(ep-experts\)/,
  ],
  ['ep on a dense model', ['tiny-vlm', '--nproc-per-node', '2', '--ep', '2'], /\(ep-dense\)/],
  [
    'layers fewer than pp·vpp',
    ['tiny-vlm', '--nproc-per-node', '4', '--pp', '4', '--vpp', '2'],
    /\(pp-layers\)/,
  ],
  ['vpp without pp', ['tiny-vlm', '--vpp', '2'], /\(vpp-needs-pp\)/],
  [
    'global batch vs micro-batch × dp',
    ['tiny-vlm', '--nproc-per-node', '4', '--global-batch-size', '6'],
    /\(global-batch\)/,
  ],
  [
    'microbatch group size',
    [
      'tiny-vlm',
      '--nproc-per-node',
      '2',
      '--pp',
      '2',
      '--vpp',
      '2',
      '--global-batch-size',
      '4',
      '--microbatch-group-size-per-vp-stage',
      '5',
    ],
    /\(microbatch-group\)/,
  ],
  ['sequence parallel without tp', ['tiny-vlm', '--sequence-parallel'], /\(sp-needs-tp\)/],
  ['context parallelism', ['tiny-vlm', '--context-parallel-size', '2'], /\(cp-unsupported\)/],
  [
    'encoder tp not dividing decoder tp',
    [
      'tiny-vlm',
      '--nproc-per-node',
      '2',
      '--tp',
      '2',
      '+model.image_encoder.tensor_model_parallel_size=4',
    ],
    /\((encoder-tp-divides-tp|encoder-tp-heads)\)/,
  ],
  [
    'first-stage layers',
    ['tiny-vlm', '--nproc-per-node', '2', '--pp', '2', '--decoder-first-pipeline-num-layers', '4'],
    /\(pp-uneven-layers\)/,
  ],
  [
    'the embedding counted as a layer, 5 pieces over 2 stages',
    ['tiny-vlm', '--nproc-per-node', '2', '--pp', '2', '--account-for-embedding-in-pipeline-split'],
    /\(pp-account-for\)/,
  ],
  [
    'hetero DP and full separation together',
    ['tiny-vlm-moe', '--enable-encoder-hetero-dp', '--enable-full-hetero-dp'],
    /\(encoder-levels-exclusive\)/,
  ],
  [
    'hetero DP with encoder TP 2',
    [
      'tiny-vlm-moe',
      '--nproc-per-node',
      '2',
      '--tp',
      '2',
      '--enable-encoder-hetero-dp',
      'model.image_encoder.tensor_model_parallel_size=2',
    ],
    /\(encoder-level-tp\): --enable-encoder-hetero-dp needs encoder tensor parallel size 1, got 2/,
  ],
  [
    'full separation with context parallelism',
    [
      'tiny-vlm-moe',
      '--nproc-per-node',
      '2',
      '--context-parallel-size',
      '2',
      '--enable-full-hetero-dp',
    ],
    /\(full-hetero-dp-cp\)/,
  ],
  [
    'encoder recompute without full separation',
    ['tiny-vlm-moe', '--enable-encoder-hetero-dp', '--full-hetero-dp-encoder-recompute'],
    /\(full-hetero-dp-options\): --full-hetero-dp-encoder-recompute needs --enable-full-hetero-dp/,
  ],
  [
    'A2A overlap without expert parallelism',
    ['tiny-vlm-moe', '--overlap-moe-expert-parallel-comm'],
    /\(a2a-overlap-ep\)/,
  ],
  [
    'A2A overlap on a pipeline without virtual stages',
    [
      'tiny-vlm-moe',
      '--nproc-per-node',
      '4',
      '--pp',
      '2',
      '--ep',
      '2',
      '--overlap-moe-expert-parallel-comm',
    ],
    /\(a2a-overlap-vpp\)/,
  ],
  [
    'A2A overlap with full recompute',
    [
      'tiny-vlm-moe',
      '--nproc-per-node',
      '2',
      '--ep',
      '2',
      '--overlap-moe-expert-parallel-comm',
      '--recompute-granularity',
      'full',
    ],
    /\(a2a-overlap-full-recompute\)/,
  ],
  [
    'delayed weight gradients without A2A overlap',
    ['tiny-vlm-moe', '--delay-wgrad-compute'],
    /\(delay-wgrad-needs-overlap\)/,
  ],
  [
    'recompute modules under full recompute',
    ['tiny-vlm-moe', '--recompute-granularity', 'full', '--recompute-modules', 'core_attn', 'mlp'],
    /\(recompute-modules-selective\)/,
  ],
  [
    'a misspelt recompute module, an override after the list',
    [
      'tiny-vlm-moe',
      '--recompute-granularity',
      'selective',
      '--recompute-modules',
      'a2a_overlap_atn',
      '+model.image_encoder.freeze=True',
    ],
    /\(recompute-module-known\): --recompute-modules: unknown module 'a2a_overlap_atn' \(did you mean 'a2a_overlap_attn'\?\)/,
  ],
  [
    "the article's misspelt offload tensor",
    [
      'tiny-vlm-moe',
      '--fine-grained-activation-offloading',
      '--offload-tensors',
      'dispatched_input',
      'pre_mlm_layernorm_output',
    ],
    /\(offload-tensor-known\): --offload-tensors: unknown tensor 'pre_mlm_layernorm_output' \(did you mean 'pre_mlp_layernorm_output'\?\)/,
  ],
  [
    'an expert capacity for a dense model',
    ['tiny-vlm', '--moe-expert-capacity-factor', '1'],
    /\(moe-capacity-factor\): --moe-expert-capacity-factor 1 needs an MoE decoder; tiny-vlm is dense/,
  ],
];

/** Flags that need another flag, or a value lfc does not build: refused before any layout rule. */
const FLAG_CASES: [string, string[], RegExp][] = [
  [
    'offloading without the tensors to offload',
    ['tiny-vlm-moe', '--fine-grained-activation-offloading'],
    /^lfc: error: --fine-grained-activation-offloading needs --offload-tensors/,
  ],
  [
    'tensors to offload without offloading',
    ['tiny-vlm-moe', '--offload-tensors', 'dispatched_input'],
    /^lfc: error: --offload-tensors dispatched_input needs --fine-grained-activation-offloading/,
  ],
  [
    'recompute modules without a granularity',
    ['tiny-vlm-moe', '--recompute-modules', 'core_attn'],
    /^lfc: error: --recompute-modules core_attn needs --recompute-granularity selective/,
  ],
  [
    "Megatron's allgather dispatcher",
    ['tiny-vlm-moe', '--moe-token-dispatcher-type', 'allgather'],
    /--moe-token-dispatcher-type allgather is not built; lfc's expert parallelism runs the alltoall and flex dispatchers/,
  ],
  [
    'an unknown dispatcher',
    ['tiny-vlm-moe', '--moe-token-dispatcher-type', 'a2a'],
    /--moe-token-dispatcher-type must be alltoall/,
  ],
  [
    'a capacity factor of 0',
    ['tiny-vlm-moe', '--moe-expert-capacity-factor', '0'],
    /--moe-expert-capacity-factor must be a positive number, got '0'/,
  ],
  [
    'a capacity factor that is not a number',
    ['tiny-vlm-moe', '--moe-expert-capacity-factor', 'auto'],
    /--moe-expert-capacity-factor must be a positive number, got 'auto'/,
  ],
  [
    'an unknown token drop policy',
    ['tiny-vlm-moe', '--moe-token-drop-policy', 'random'],
    /--moe-token-drop-policy.*'random' is invalid.*position, probs/,
  ],
  [
    'an unknown recompute granularity',
    ['tiny-vlm-moe', '--recompute-granularity', 'partial'],
    /--recompute-granularity.*'partial' is invalid/,
  ],
  [
    'an unknown training phase',
    ['tiny-vlm-moe', '--training-phase', 'rl'],
    /--training-phase.*'rl' is invalid.*pretrain, sft/,
  ],
  [
    'an unknown attention backend',
    ['tiny-vlm-moe', '--attention-backend', 'flash3'],
    /--attention-backend.*'flash3' is invalid/,
  ],
];

describe('lfc compile: invalid layouts', () => {
  it.each(CASES)('%s', async (_what, argv, rule) => {
    const r = await cli('compile', ...argv, '-o', '/tmp/lfc-never-written');
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/^lfc: error: invalid layout \(/);
    expect(r.err).toMatch(rule);
    expect(r.err.trim().split('\n')).toHaveLength(1);
  });
  it('the messages differ case by case', async () => {
    const messages = new Set<string>();
    for (const [, argv] of CASES)
      messages.add((await cli('compile', ...argv, '-o', '/tmp/lfc-never-written')).err);
    expect(messages.size).toBe(CASES.length);
  });
});

describe('lfc compile: flags that need another flag or a value not built', () => {
  it.each(FLAG_CASES)('%s', async (_what, argv, message) => {
    const r = await cli('compile', ...argv, '-o', '/tmp/lfc-never-written');
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/^lfc: error: /);
    expect(r.err).toMatch(message);
    expect(r.err.trim().split('\n')).toHaveLength(1);
  });
});
