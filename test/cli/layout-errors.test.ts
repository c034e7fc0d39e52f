// lfc compile refuses invalid layouts with one line naming the rule, exit code 2 (the rules
// themselves are tested in test/parallel/validate.test.ts).
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
