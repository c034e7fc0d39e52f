// The layouts' compile options as the search builds them (space.ts layoutOptions) against the
// parse of their `lfc compile` lines (the request's flags + flagsOf): equal for every layout of a
// space that has every knob (tp with SP, pp, vpp, ep, the three levels and encoder TPs, overlap,
// both recomputes, offload, the distributed optimizer), with an override of the request's own.
import { describe, expect, it } from 'vitest';
import { parseCompileArgs } from '../../cli/compile.js';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import { enumerateLayouts, flagsOf, layoutOptions } from '../../compiler/tune/space.js';

describe('layoutOptions', () => {
  it('equals the parse of base + flagsOf for every layout', () => {
    const base = [
      'tiny-vlm-moe',
      'model.text_decoder.num_layers=4',
      ...['--nnodes', '2', '--nproc-per-node', '4', '--global-batch-size', '16'],
      ...['--bf16', '--hardware', 'h800', '--data-profile', 'default'],
    ];
    const config = loadModelConfig('tiny-vlm-moe', ['model.text_decoder.num_layers=4']);
    const preset = config.model.image_encoder.tensor_model_parallel_size;
    const layouts = enumerateLayouts({ config, nnodes: 2, nprocPerNode: 4, globalBatchSize: 16 });
    const knobs = new Set(
      layouts.flatMap((l) => [
        `level${l.level}`,
        `etp${l.encoderTp}`,
        `vpp${l.vpp}`,
        l.recompute,
        ...(l.overlap ? ['overlap'] : []),
        ...(l.offload ? ['offload'] : []),
        ...(l.distopt ? ['distopt'] : []),
      ]),
    );
    for (const k of ['level1', 'level2', 'level3', 'etp2', 'vpp2', 'selective', 'full'])
      expect(knobs).toContain(k);
    for (const k of ['overlap', 'offload', 'distopt']) expect(knobs).toContain(k);
    const parsedBase = parseCompileArgs(base).options;
    for (const l of layouts) {
      const parsed = parseCompileArgs([...base, ...flagsOf(l, preset)]).options;
      expect(layoutOptions(parsedBase, l, preset), flagsOf(l, preset).join(' ')).toEqual(parsed);
    }
  });
});
