// A step refuses what does not fit its plan (the runtime memory check), and a failing kernel
// rejects the step's promise with the instruction, op and scope without leaving a stream waiting.
import { describe, expect, it } from 'vitest';

import { loadNative } from '../../runtime/native.js';
import { ProgramBuilder, textMicrobatch } from './program-builder.js';

const native = loadNative();

/** embedding on compute, then an offload on copy that waits for the embedding's event. */
function program(opts: { underPlan?: boolean } = {}) {
  const b = new ProgramBuilder('errors', { S: 16, Nv: 0 });
  const tokens = b.input('tokens', 'i32', ['S']);
  const table = b.param('table', [8, 4], { trainable: false });
  const h = b.arena('h', 'f32', ['S', 4]);
  const wide = b.arena('wide', 'f32', ['2*S', 4]);
  const host = b.buffer('h.host', 'arena', 'f32', ['S', 4], { microbatch: 0, space: 'host' });
  const done = b.event();
  b.instr(
    'compute',
    'embedding',
    [tokens, table.buffer],
    [h],
    {},
    { scope: 'model.embed', record: [done] },
  );
  b.instr('copy', 'offload', [h], [host], {}, { scope: 'model.embed', wait: [done] });
  b.instr('compute', 'constant', [], [wide], { value: 2, dtype: 'f32', shape: ['2*S', '4'] });
  const p = b.build();
  // a plan made for S ≤ 4: the buffer is too small for longer microbatches
  if (opts.underPlan) (p.buffers[wide] as { bytes: number }).bytes = 2 * 4 * 4 * 4;
  const rt = new native.Runtime(JSON.stringify(p));
  rt.initParams(0, [{ name: 'table', init: 'normal(1)', shape: [8, 4] }]);
  return { rt, h, wide };
}

describe('native runtime: step errors', () => {
  it('rejects a buffer whose resolved size exceeds its planned bytes, naming it', async () => {
    const { rt } = program({ underPlan: true });
    rt.setMicrobatch(0, textMicrobatch([[2, 3, 4]], 4)); // S = 4 fits the plan
    await expect(rt.step({ lr: 0, step: 1 })).resolves.toMatchObject({ instructionsRun: 3 });
    rt.setMicrobatch(0, textMicrobatch([[2, 3, 4, 5, 6, 7]], 10)); // S = 10 does not
    await expect(rt.step({ lr: 0, step: 1 })).rejects.toThrow(
      "step: buffer 3 (wide) f32[2*S, 4] needs 320 bytes at microbatch 0's sizes, planned 128",
    );
  });

  it('rejects a step whose microbatch has no data yet', async () => {
    const { rt } = program();
    await expect(rt.step({ lr: 0, step: 1 })).rejects.toThrow(
      /step: buffer 0 \(mb0\.tokens\) \[S\] depends on microbatch 0, which has no data \(setMicrobatch or synthesize\)/,
    );
  });

  it('a kernel error rejects with the instruction, op and scope; the waiting stream is released', async () => {
    const { rt, h, wide } = program();
    rt.setMicrobatch(0, textMicrobatch([[2, 20, 4]], 6)); // token 20 is outside the 8-row table
    await expect(rt.step({ lr: 0, step: 1 })).rejects.toThrow(
      'step failed at instruction 0 (embedding, scope model.embed): embedding_forward: ids[1] = 20 is outside the table of 8 rows',
    );
    // the runtime is usable again: nothing was left running
    rt.setMicrobatch(0, textMicrobatch([[2, 3, 4]], 6));
    const r = await rt.step({ lr: 0, step: 1 });
    expect(r.instructionsRun).toBe(3);
    expect(new Float32Array(rt.readBuffer(h))).toHaveLength(6 * 4);
    expect(Array.from(new Float32Array(rt.readBuffer(wide)))).toEqual(new Array(12 * 4).fill(2));
  });

  it('one step at a time; no data changes while it runs; t ≥ 1', async () => {
    const { rt } = program();
    rt.setMicrobatch(0, textMicrobatch([[2, 3, 4]], 6));
    const running = rt.step({ lr: 0, step: 1 });
    expect(() => rt.step({ lr: 0, step: 1 })).toThrow(
      'step: a step is already running; wait for its promise',
    );
    expect(() => rt.setMicrobatch(0, textMicrobatch([[2]], 6))).toThrow(
      'setMicrobatch: a step is running; wait for its promise',
    );
    await running;
    await expect(rt.step({ lr: 0, step: 0 })).rejects.toThrow('step: t = 0 must be ≥ 1');
  });
});
