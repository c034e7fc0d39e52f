// Parameter init is a pure function of (seed, name, global element index): a shard initializes
// exactly its slice of the whole tensor.
import { describe, expect, it } from 'vitest';

import { loadNative, type NativeParamInit } from '../../runtime/native.js';
import { f32At, ProgramBuilder } from './program-builder.js';

const native = loadNative();

const SHAPE = [6, 8] as const;
const INITS: NativeParamInit[] = [
  { name: 'layer.weight', init: 'normal(0.02)', shape: [...SHAPE] },
  { name: 'layer.bias', init: 'zeros', shape: [8] },
  { name: 'norm.weight', init: 'ones', shape: [8] },
];

/** A program holding the params, `layer.weight` either whole or as one shard. */
function paramsProgram(shard?: readonly (readonly [number, number])[]) {
  const b = new ProgramBuilder(shard ? 'shard' : 'whole');
  const w = b.param('layer.weight', [...SHAPE], { shard });
  const bias = b.param('layer.bias', [8]);
  const norm = b.param('norm.weight', [8]);
  const program = b.build();
  const rt = new native.Runtime(b.json());
  return { rt, program, w, bias, norm };
}

function weights(seed: number, shard?: readonly (readonly [number, number])[]): Float32Array {
  const { rt, program, w } = paramsProgram(shard);
  rt.initParams(seed, INITS);
  return Float32Array.from(f32At(rt.region('param'), program.buffers[w.buffer]));
}

describe('native runtime: initParams', () => {
  it('a shard holds exactly its slice of the whole tensor', () => {
    const whole = weights(3);
    for (const shard of [
      [
        [2, 3],
        [4, 4],
      ],
      [
        [0, 6],
        [0, 2],
      ],
      [
        [5, 1],
        [1, 7],
      ],
    ] as const) {
      const part = weights(3, shard);
      const [[r0, nr], [c0, nc]] = shard;
      expect(part).toHaveLength(nr * nc);
      for (let r = 0; r < nr; r++)
        for (let c = 0; c < nc; c++)
          expect(part[r * nc + c]).toBe(whole[(r0 + r) * SHAPE[1] + c0 + c]);
    }
  });

  it('normal(std) has that spread; zeros and ones are exact; the optimizer state is zero', () => {
    const b = new ProgramBuilder('stats');
    const big = b.param('big', [128, 64]);
    const bias = b.param('layer.bias', [8]);
    const norm = b.param('norm.weight', [8]);
    const program = b.build();
    const rt = new native.Runtime(b.json());
    new Float32Array(rt.region('optim')).fill(5);
    rt.initParams(11, [{ name: 'big', init: 'normal(0.02)', shape: [128, 64] }, ...INITS.slice(1)]);
    const params = rt.region('param');
    const x = f32At(params, program.buffers[big.buffer]);
    const mean = x.reduce((a, v) => a + v, 0) / x.length;
    const std = Math.sqrt(x.reduce((a, v) => a + (v - mean) ** 2, 0) / x.length);
    expect(Math.abs(mean)).toBeLessThan(0.001);
    expect(std).toBeGreaterThan(0.019);
    expect(std).toBeLessThan(0.021);
    expect(Array.from(f32At(params, program.buffers[bias.buffer]))).toEqual(new Array(8).fill(0));
    expect(Array.from(f32At(params, program.buffers[norm.buffer]))).toEqual(new Array(8).fill(1));
    expect(new Float32Array(rt.region('optim')).every((v) => v === 0)).toBe(true);
  });

  it('depends on the seed and the name, and on nothing else', () => {
    expect(weights(3)).toEqual(weights(3));
    expect(weights(3)).not.toEqual(weights(4));
    const { rt, program, w } = paramsProgram();
    rt.initParams(3, INITS);
    const renamed = paramsProgram();
    const other = new native.Runtime(
      JSON.stringify({
        ...renamed.program,
        params: renamed.program.params.map((p, i) =>
          i === 0 ? { ...p, name: 'other.weight' } : p,
        ),
      }),
    );
    other.initParams(3, [{ ...INITS[0], name: 'other.weight' }, ...INITS.slice(1)]);
    const a = f32At(rt.region('param'), program.buffers[w.buffer]);
    const b = f32At(other.region('param'), renamed.program.buffers[renamed.w.buffer]);
    expect(Array.from(a)).not.toEqual(Array.from(b));
  });

  it('refuses an unknown init, a missing param and a shard that disagrees with the program', () => {
    const { rt } = paramsProgram();
    expect(() =>
      rt.initParams(1, [{ ...INITS[0], init: 'uniform(1)' }, ...INITS.slice(1)]),
    ).toThrow(
      "param layer.weight: unknown init 'uniform(1)' (this runtime knows normal(std), zeros, ones)",
    );
    expect(() => rt.initParams(1, INITS.slice(1))).toThrow(
      'initParams: no init given for param layer.weight',
    );
    expect(() =>
      rt.initParams(1, [
        {
          ...INITS[0],
          shard: [
            [0, 3],
            [0, 8],
          ],
        },
        ...INITS.slice(1),
      ]),
    ).toThrow('initParams: the shard given for param layer.weight differs from the program');
  });
});
