// Every executable op through the runtime: each backward op's gradients against central finite
// differences of its forward op, run in float64 by the runtime itself (the registry's wiring of
// operands, sizes, attributes and zeroing is what is under test; the kernels have their own
// checks), plus the layout, memory and constant ops against exact values.
import { describe, expect, it } from 'vitest';

import { loadNative, type NativeMicrobatch, type NativeRuntime } from '../../runtime/native.js';
import { ProgramBuilder, textMicrobatch } from './program-builder.js';

const native = loadNative();

const H_FD = 1e-5;

interface FdCase {
  readonly b: ProgramBuilder;
  /** parameters (f64) whose gradients are checked, by name → their gradient buffer */
  readonly grads: Record<string, number>;
  /** L = Σ over terms of Σ dy ⊙ y; dy is a parameter buffer, y any buffer */
  readonly terms: readonly { y: number; dy: number }[];
  readonly mb?: NativeMicrobatch;
}

function f64Param(b: ProgramBuilder, name: string, shape: readonly number[]): number {
  return b.param(name, shape, { dtype: 'f64', trainable: false }).buffer;
}

function f64(b: ProgramBuilder, name: string, shape: readonly (string | number)[]): number {
  return b.arena(name, 'f64', shape);
}

/** A runtime of the program with its parameters drawn from normal(0.7). */
function runtimeOf(program: ReturnType<ProgramBuilder['build']>): NativeRuntime {
  const rt: NativeRuntime = new native.Runtime(JSON.stringify(program));
  rt.initParams(
    5,
    program.params.map((p) => ({
      name: p.name,
      init: 'normal(0.7)',
      shape: p.shard.map(([, n]) => n),
    })),
  );
  return rt;
}

/** Runs the case once for its gradients, then twice per checked element for L(p ± h). */
async function checkGradients(c: FdCase): Promise<void> {
  const program = c.b.build();
  const rt = runtimeOf(program);
  if (c.mb) rt.setMicrobatch(0, c.mb);
  if (program.scalars.loss_tokens !== undefined) rt.setScalar('loss_tokens', 3);
  const params = rt.region('param');
  const view = (id: number) =>
    new Float64Array(params, program.buffers[id].offset, program.buffers[id].bytes / 8);
  const lossNow = async (): Promise<number> => {
    await rt.step({ lr: 0, step: 1 });
    let L = 0;
    for (const { y, dy } of c.terms) {
      const yv = new Float64Array(rt.readBuffer(y));
      const w = view(dy);
      expect(yv.length).toBe(w.length);
      yv.forEach((v, i) => (L += v * w[i]));
    }
    return L;
  };
  await lossNow();
  const analytic = Object.fromEntries(
    Object.entries(c.grads).map(([name, g]) => [name, new Float64Array(rt.readBuffer(g))]),
  );
  for (const [name, grad] of Object.entries(analytic)) {
    const p = program.params.find((q) => q.name === name)!;
    const values = view(p.buffer);
    expect(grad.length, `gradient of ${name}`).toBe(values.length);
    let worst = 0;
    for (let i = 0; i < values.length; i++) {
      const orig = values[i];
      values[i] = orig + H_FD;
      const up = await lossNow();
      values[i] = orig - H_FD;
      const down = await lossNow();
      values[i] = orig;
      const fd = (up - down) / (2 * H_FD);
      worst = Math.max(worst, Math.abs(fd - grad[i]) / (1e-3 + Math.abs(fd)));
    }
    expect(worst, `gradient of ${name}: worst error vs finite differences`).toBeLessThan(1e-5);
  }
}

/** Φ, the standard normal CDF, by its series (independent of the kernels' erf) */
function PHI(x: number): number {
  // erf by its Taylor series: converges fast for |x| ≤ 3
  const z = x / Math.SQRT2;
  let term = z;
  let sum = z;
  for (let n = 1; n < 80; n++) {
    term *= (-z * z) / n;
    sum += term / (2 * n + 1);
  }
  return 0.5 * (1 + (2 / Math.sqrt(Math.PI)) * sum);
}

/** rotate-half RoPE of x [T, nh, d] by angle(token, j) for the pair (j, j + d/2) */
function plainRope(
  x: Float64Array,
  T: number,
  nh: number,
  d: number,
  angle: (token: number, j: number) => number,
): Float64Array {
  const y = new Float64Array(x.length);
  for (let t = 0; t < T; t++)
    for (let h = 0; h < nh; h++)
      for (let j = 0; j < d / 2; j++) {
        const a = angle(t, j);
        const i = (t * nh + h) * d;
        const [u, v] = [x[i + j], x[i + j + d / 2]];
        y[i + j] = u * Math.cos(a) - v * Math.sin(a);
        y[i + j + d / 2] = v * Math.cos(a) + u * Math.sin(a);
      }
  return y;
}

function expectClose(got: Float64Array, want: Float64Array): void {
  expect(got.length).toBe(want.length);
  let worst = 0;
  got.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - want[i]))));
  expect(worst).toBeLessThan(1e-12);
}

/** f64 dy parameters for a list of outputs: one term each */
function terms(b: ProgramBuilder, ys: readonly [number, readonly number[]][]) {
  return ys.map(([y, shape], i) => ({ y, dy: f64Param(b, `dy${i}`, shape) }));
}

describe('native runtime: backward ops against finite differences (f64)', () => {
  it('linear, linear_dgrad, linear_wgrad (with bias)', async () => {
    const b = new ProgramBuilder('linear');
    const x = f64Param(b, 'x', [3, 4]);
    const w = f64Param(b, 'w', [5, 4]);
    const bias = f64Param(b, 'b', [5]);
    const y = f64(b, 'y', [3, 5]);
    const t = terms(b, [[y, [3, 5]]]);
    const [dx, dw, db] = [f64(b, 'dx', [3, 4]), f64(b, 'dw', [5, 4]), f64(b, 'db', [5])];
    b.instr('compute', 'linear', [x, w, bias], [y]);
    b.instr('compute', 'linear_dgrad', [t[0].dy, w], [dx]);
    b.instr('compute', 'linear_wgrad', [t[0].dy, x], [dw, db], { bias: true });
    await checkGradients({ b, terms: t, grads: { x: dx, w: dw, b: db } });
  });

  it('layernorm, layernorm_grad', async () => {
    const b = new ProgramBuilder('layernorm');
    const [x, w, bias] = [f64Param(b, 'x', [3, 6]), f64Param(b, 'w', [6]), f64Param(b, 'b', [6])];
    const y = f64(b, 'y', [3, 6]);
    const t = terms(b, [[y, [3, 6]]]);
    const [dx, dw, db] = [f64(b, 'dx', [3, 6]), f64(b, 'dw', [6]), f64(b, 'db', [6])];
    b.instr('compute', 'layernorm', [x, w, bias], [y], { eps: 1e-6 });
    b.instr('compute', 'layernorm_grad', [t[0].dy, x, w], [dx, dw, db], { eps: 1e-6 });
    await checkGradients({ b, terms: t, grads: { x: dx, w: dw, b: db } });
  });

  it('rmsnorm, rmsnorm_grad', async () => {
    const b = new ProgramBuilder('rmsnorm');
    const [x, w] = [f64Param(b, 'x', [3, 6]), f64Param(b, 'w', [6])];
    const y = f64(b, 'y', [3, 6]);
    const t = terms(b, [[y, [3, 6]]]);
    const [dx, dw] = [f64(b, 'dx', [3, 6]), f64(b, 'dw', [6])];
    b.instr('compute', 'rmsnorm', [x, w], [y], { eps: 1e-6 });
    b.instr('compute', 'rmsnorm_grad', [t[0].dy, x, w], [dx, dw], { eps: 1e-6 });
    await checkGradients({ b, terms: t, grads: { x: dx, w: dw } });
  });

  it('rope, rope_grad (positions from the microbatch)', async () => {
    const b = new ProgramBuilder('rope', { S: 5, Nv: 0 });
    const pos = b.input('positions', 'i32', ['S']);
    const x = f64Param(b, 'x', [5, 2, 4]);
    const y = f64(b, 'y', [5, 2, 4]);
    const t = terms(b, [[y, [5, 2, 4]]]);
    const dx = f64(b, 'dx', [5, 2, 4]);
    b.instr('compute', 'rope', [x, pos], [y], { theta: 10, sections: [2] });
    b.instr('compute', 'rope_grad', [t[0].dy, pos], [dx], { theta: 10, sections: [2] });
    await checkGradients({
      b,
      terms: t,
      grads: { x: dx },
      mb: textMicrobatch(
        [
          [2, 3, 4],
          [5, 6],
        ],
        5,
      ),
    });
  });

  for (const causal of [true, false])
    it(`attention, attention_grad (GQA, packed segments, padding; causal ${causal})`, async () => {
      const b = new ProgramBuilder('attention', { S: 5, Nv: 0 });
      const seg = b.input('segments', 'i32', ['S']);
      const [q, k, v] = [
        f64Param(b, 'q', [5, 4, 3]),
        f64Param(b, 'k', [5, 2, 3]),
        f64Param(b, 'v', [5, 2, 3]),
      ];
      const out = f64(b, 'out', [5, 4, 3]);
      const lse = f64(b, 'lse', [5, 4]);
      const t = terms(b, [[out, [5, 4, 3]]]);
      const [dq, dk, dv] = [
        f64(b, 'dq', [5, 4, 3]),
        f64(b, 'dk', [5, 2, 3]),
        f64(b, 'dv', [5, 2, 3]),
      ];
      const attrs = { causal, scale: 0.5 };
      b.instr('compute', 'attention', [q, k, v, seg], [out, lse], attrs);
      b.instr('compute', 'attention_grad', [t[0].dy, q, k, v, seg, out, lse], [dq, dk, dv], attrs);
      const mb = textMicrobatch(
        [
          [2, 3],
          [4, 5],
        ],
        5,
      ); // segments 0 0 1 1 −1
      await checkGradients({ b, terms: t, grads: { q: dq, k: dk, v: dv }, mb });
    });

  it('gelu, gelu_grad; swiglu, swiglu_grad', async () => {
    const b = new ProgramBuilder('activations');
    const [x, gate, up] = [f64Param(b, 'x', [7]), f64Param(b, 'gate', [7]), f64Param(b, 'up', [7])];
    const [g, s] = [f64(b, 'gelu', [7]), f64(b, 'swiglu', [7])];
    const t = terms(b, [
      [g, [7]],
      [s, [7]],
    ]);
    const [dx, dgate, dup] = [f64(b, 'dx', [7]), f64(b, 'dgate', [7]), f64(b, 'dup', [7])];
    b.instr('compute', 'gelu', [x], [g]);
    b.instr('compute', 'swiglu', [gate, up], [s]);
    b.instr('compute', 'gelu_grad', [t[0].dy, x], [dx]);
    b.instr('compute', 'swiglu_grad', [t[1].dy, gate, up], [dgate, dup]);
    await checkGradients({ b, terms: t, grads: { x: dx, gate: dgate, up: dup } });
  });

  it('gelu exact, gelu_grad exact: 0.5·x·(1 + erf(x/√2)) and its gradient', async () => {
    const b = new ProgramBuilder('gelu-exact');
    const x = f64Param(b, 'x', [9]);
    const g = f64(b, 'gelu', [9]);
    const t = terms(b, [[g, [9]]]);
    const dx = f64(b, 'dx', [9]);
    b.instr('compute', 'gelu', [x], [g], { exact: true });
    b.instr('compute', 'gelu_grad', [t[0].dy, x], [dx], { exact: true });
    await checkGradients({ b, terms: t, grads: { x: dx } });
    // the forward against x·Φ(x), Φ by its own series
    const program = b.build();
    const rt = runtimeOf(program);
    await rt.step({ lr: 0, step: 1 });
    const xs = new Float64Array(rt.region('param'), program.buffers[x].offset, 9);
    const ys = new Float64Array(rt.readBuffer(g));
    xs.forEach((v, i) => expect(ys[i]).toBeCloseTo(v * PHI(v), 12));
  });

  it('rope layouts against a plain implementation: interleaved M-RoPE over (t, h, w) ids', async () => {
    const S = 5;
    const b = new ProgramBuilder('rope-mrope', { S, Nv: 0 });
    const pos = b.input('positions', 'i32', ['S', 3]);
    const x = f64Param(b, 'x', [S, 2, 16]);
    const y = f64(b, 'y', [S, 2, 16]);
    const t = terms(b, [[y, [S, 2, 16]]]);
    const dx = f64(b, 'dx', [S, 2, 16]);
    const attrs = { theta: 100, sections: [4, 2, 2], layout: 'interleaved' };
    b.instr('compute', 'rope', [x, pos], [y], attrs);
    b.instr('compute', 'rope_grad', [t[0].dy, pos], [dx], attrs);
    // rows t, h, w of 5 tokens: distinct per axis, so a wrong column assignment shows
    const ids = Int32Array.from([0, 1, 1, 1, 3, 0, 1, 1, 2, 5, 0, 1, 2, 1, 7]);
    const mb = { ...textMicrobatch([[2, 3, 4, 5, 6]], S), positions: ids };
    await checkGradients({ b, terms: t, grads: { x: dx }, mb });
    const program = b.build();
    const rt = runtimeOf(program);
    rt.setMicrobatch(0, mb);
    await rt.step({ lr: 0, step: 1 });
    const xs = new Float64Array(rt.region('param'), program.buffers[x].offset, S * 32);
    // frequency j of 8: h where j % 3 = 1 and j < 6, w where j % 3 = 2 and j < 6, else t
    const axis = (j: number) => (j % 3 === 1 && j < 6 ? 1 : j % 3 === 2 && j < 6 ? 2 : 0);
    const want = plainRope(xs, S, 2, 16, (tok, j) => ids[axis(j) * S + tok] * 100 ** (-j / 8));
    expectClose(new Float64Array(rt.readBuffer(y)), want);
  });

  it('rope layouts against a plain implementation: per-axis 2-D rotary of patches', async () => {
    const b = new ProgramBuilder('rope-2d', { S: 4, Nv: 1 });
    const pos = b.input('patch_positions', 'i32', ['4*Nv', 2]);
    const x = f64Param(b, 'x', [4, 2, 8]);
    const y = f64(b, 'y', [4, 2, 8]);
    const t = terms(b, [[y, [4, 2, 8]]]);
    const dx = f64(b, 'dx', [4, 2, 8]);
    const attrs = { theta: 10000, sections: [2, 2], layout: 'per_axis' };
    b.instr('compute', 'rope', [x, pos], [y], attrs);
    b.instr('compute', 'rope_grad', [t[0].dy, pos], [dx], attrs);
    // one 8×8 image: 2×2 patches, rows/cols (0,0) (0,1) (1,0) (1,1)
    const mb = {
      ...textMicrobatch([[2, 1, 3]], 4),
      images: [{ height: 8, width: 8, pixels: new Float32Array(3 * 64) }],
    };
    await checkGradients({ b, terms: t, grads: { x: dx }, mb });
    const program = b.build();
    const rt = runtimeOf(program);
    rt.setMicrobatch(0, mb);
    await rt.step({ lr: 0, step: 1 });
    const xs = new Float64Array(rt.region('param'), program.buffers[x].offset, 4 * 16);
    // HF's vision rotary: d/4 = 2 frequencies θ^(−4k/d), the row's then the column's
    const rc = [
      [0, 0],
      [0, 1],
      [1, 0],
      [1, 1],
    ];
    const want = plainRope(
      xs,
      4,
      2,
      8,
      (p, j) => rc[p][j < 2 ? 0 : 1] * 10000 ** (-(4 * (j % 2)) / 8),
    );
    expectClose(new Float64Array(rt.readBuffer(y)), want);
  });

  it('embedding with weights (the interpolated table): Σ_k w·table[ids], its gradient', async () => {
    const b = new ProgramBuilder('embedding-bag', { S: 6, Nv: 0 });
    const tokens = b.input('tokens', 'i32', ['S']);
    const ids = b.view('ids', tokens, [3, 2]);
    const table = f64Param(b, 'table', [5, 4]);
    const weights = f64Param(b, 'weights', [3, 2]);
    const y = f64(b, 'y', [3, 4]);
    const t = terms(b, [[y, [3, 4]]]);
    const dtable = f64(b, 'dtable', [5, 4]);
    b.instr('compute', 'embedding', [ids, table, weights], [y]);
    b.instr('compute', 'embedding_grad', [t[0].dy, ids, weights], [dtable], { rows: 5 });
    // ids (2, 3) (3, 3) (4, 2): a repeated row sums its weights
    const mb = textMicrobatch([[2, 3, 3, 3, 4, 2]], 6);
    await checkGradients({ b, terms: t, grads: { table: dtable }, mb });
    const program = b.build();
    const rt = runtimeOf(program);
    rt.setMicrobatch(0, mb);
    await rt.step({ lr: 0, step: 1 });
    const region = rt.region('param');
    const tab = new Float64Array(region, program.buffers[table].offset, 20);
    const w = new Float64Array(region, program.buffers[weights].offset, 6);
    const id = [2, 3, 3, 3, 4, 2];
    const want = new Float64Array(12);
    for (let r = 0; r < 3; r++)
      for (let k = 0; k < 2; k++)
        for (let h = 0; h < 4; h++) want[r * 4 + h] += w[r * 2 + k] * tab[id[r * 2 + k] * 4 + h];
    expectClose(new Float64Array(rt.readBuffer(y)), want);
  });

  it('router_topk without renormalization (normalize false): weights are the top-k probabilities', async () => {
    const b = new ProgramBuilder('router-raw');
    const logits = f64Param(b, 'logits', [5, 4]);
    const [probs, weights] = [f64(b, 'probs', [5, 4]), f64(b, 'weights', [5, 2])];
    const experts = b.arena('experts', 'i32', [5, 2]);
    const t = terms(b, [
      [probs, [5, 4]],
      [weights, [5, 2]],
    ]);
    const dlogits = f64(b, 'dlogits', [5, 4]);
    b.instr('compute', 'router_topk', [logits], [probs, weights, experts], {
      k: 2,
      normalize: false,
    });
    b.instr('compute', 'router_topk_grad', [t[0].dy, t[1].dy, probs, experts], [dlogits], {
      normalize: false,
    });
    await checkGradients({ b, terms: t, grads: { logits: dlogits } });
    const program = b.build();
    const rt = runtimeOf(program);
    await rt.step({ lr: 0, step: 1 });
    const p = new Float64Array(rt.readBuffer(probs));
    const wv = new Float64Array(rt.readBuffer(weights));
    const e = new Int32Array(rt.readBuffer(experts));
    for (let i = 0; i < 10; i++) expect(wv[i]).toBe(p[Math.floor(i / 2) * 4 + e[i]]);
  });

  for (const mode of ['replace', 'add'])
    it(`merge_visual, merge_visual_grad (${mode})`, async () => {
      const b = new ProgramBuilder('merge', { S: 4, Nv: 1 });
      const tokens = b.input('tokens', 'i32', ['S']);
      const placeholder = b.scalar('image_token_id', 'i32');
      const [text, vis] = [f64Param(b, 'text', [4, 3]), f64Param(b, 'visual', [1, 3])];
      const y = f64(b, 'y', [4, 3]);
      const t = terms(b, [[y, [4, 3]]]);
      const [dtext, dvis] = [f64(b, 'dtext', [4, 3]), f64(b, 'dvisual', [1, 3])];
      b.instr('compute', 'merge_visual', [text, vis, tokens, placeholder], [y], { mode });
      b.instr('compute', 'merge_visual_grad', [t[0].dy, tokens, placeholder], [dtext, dvis], {
        mode,
        visual_rows: ['1'],
      });
      const mb = {
        ...textMicrobatch([[2, 1, 3, 4]], 4),
        images: [{ height: 8, width: 8, pixels: new Float32Array(3 * 64) }],
      };
      await checkGradients({ b, terms: t, grads: { text: dtext, visual: dvis }, mb });
    });

  it('router_topk, router_topk_grad', async () => {
    const b = new ProgramBuilder('router');
    const logits = f64Param(b, 'logits', [5, 4]);
    const [probs, weights] = [f64(b, 'probs', [5, 4]), f64(b, 'weights', [5, 2])];
    const experts = b.arena('experts', 'i32', [5, 2]);
    const t = terms(b, [
      [probs, [5, 4]],
      [weights, [5, 2]],
    ]);
    const dlogits = f64(b, 'dlogits', [5, 4]);
    b.instr('compute', 'router_topk', [logits], [probs, weights, experts], { k: 2 });
    b.instr('compute', 'router_topk_grad', [t[0].dy, t[1].dy, probs, experts], [dlogits]);
    await checkGradients({ b, terms: t, grads: { logits: dlogits } });
  });

  // capacity 2: T·k = 10 assignments, at most E·2 = 8 kept, so at least 2 are dropped (row_of −1):
  // their tokens lose that expert's output, and no gradient flows through them
  it.each([undefined, 2])(
    'an MoE layer: router, moe_permute (capacity %s), grouped_linear, moe_unpermute and their backward',
    async (capacity) => {
      const [T, Hd, E, k, F] = [5, 3, 4, 2, 2];
      const N = capacity === undefined ? T * k : Math.min(T * k, E * capacity);
      const b = new ProgramBuilder('moe');
      const x = f64Param(b, 'x', [T, Hd]);
      const logits = f64Param(b, 'logits', [T, E]);
      const ws = Array.from({ length: E }, (_, e) => f64Param(b, `w${e}`, [F, Hd]));
      const [probs, weights] = [f64(b, 'probs', [T, E]), f64(b, 'weights', [T, k])];
      const experts = b.arena('experts', 'i32', [T, k]);
      const rows = f64(b, 'rows', [N, Hd]);
      const counts = b.arena('counts', 'i32', [E]);
      const rowOf = b.arena('row_of', 'i32', [T * k]);
      const h = f64(b, 'h', [N, F]);
      const y = f64(b, 'y', [T, F]);
      const t = terms(b, [[y, [T, F]]]);
      const zeros = f64(b, 'dprobs.zero', [T, E]);
      const [dh, dweights, drows, dx, dlogits] = [
        f64(b, 'dh', [N, F]),
        f64(b, 'dweights', [T, k]),
        f64(b, 'drows', [N, Hd]),
        f64(b, 'dx', [T, Hd]),
        f64(b, 'dlogits', [T, E]),
      ];
      const dws = ws.map((_, e) => f64(b, `dw${e}`, [F, Hd]));
      const permute =
        capacity === undefined
          ? { num_experts: E }
          : { num_experts: E, capacity, out_rows: [String(N)] };
      b.instr('compute', 'router_topk', [logits], [probs, weights, experts], { k });
      b.instr('compute', 'moe_permute', [x, experts], [rows, counts, rowOf], permute);
      b.instr('compute', 'grouped_linear', [rows, counts, ...ws], [h]);
      b.instr('compute', 'moe_unpermute', [h, rowOf, weights], [y]);
      b.instr('compute', 'moe_unpermute_grad', [t[0].dy, h, rowOf, weights], [dh, dweights]);
      b.instr('compute', 'grouped_linear_dgrad', [dh, counts, ...ws], [drows]);
      b.instr('compute', 'grouped_linear_wgrad', [dh, rows, counts], dws);
      b.instr('compute', 'moe_permute_grad', [drows, rowOf], [dx], { k });
      b.instr('compute', 'constant', [], [zeros], {
        value: 0,
        dtype: 'f64',
        shape: [String(T), String(E)],
      });
      b.instr('compute', 'router_topk_grad', [zeros, dweights, probs, experts], [dlogits]);
      const grads: Record<string, number> = { x: dx, logits: dlogits };
      dws.forEach((d, e) => (grads[`w${e}`] = d));
      await checkGradients({ b, terms: t, grads });
    },
  );

  it.each(['position', 'probs'] as const)(
    'moe_permute with a capacity, drop policy %s: counts, row_of and rows against a plain reference',
    async (policy) => {
      // 12 tokens, top-2 of 4 experts, capacity 3 (Megatron's ceil(T·k/E · 0.5)): 24 assignments,
      // at most 12 kept; the rows buffer has 13 rows, so one past the kept ones is checked zero
      const [T, Hd, E, k, capacity, N] = [12, 2, 4, 2, 3, 13];
      const b = new ProgramBuilder('moe-capacity');
      const x = f64Param(b, 'x', [T, Hd]);
      const logits = f64Param(b, 'logits', [T, E]);
      const [probs, weights] = [f64(b, 'probs', [T, E]), f64(b, 'weights', [T, k])];
      const experts = b.arena('experts', 'i32', [T, k]);
      const rows = f64(b, 'rows', [N, Hd]);
      const counts = b.arena('counts', 'i32', [E]);
      const rowOf = b.arena('row_of', 'i32', [T * k]);
      b.instr('compute', 'router_topk', [logits], [probs, weights, experts], { k });
      const probsPolicy = policy === 'probs';
      b.instr(
        'compute',
        'moe_permute',
        probsPolicy ? [x, experts, weights] : [x, experts],
        [rows, counts, rowOf],
        {
          num_experts: E,
          capacity,
          out_rows: [String(N)],
          ...(probsPolicy ? { drop_policy: 'probs' } : {}),
        },
      );
      const rt = runtimeOf(b.build());
      await rt.step({ lr: 0, step: 1 });
      const chosen = new Int32Array(rt.readBuffer(experts));
      const w = new Float64Array(rt.readBuffer(weights));
      const xs = new Float64Array(rt.readBuffer(x));
      // the policies written out, expert by expert: position keeps the first `capacity`
      // assignments in assignment order, probs the `capacity` of highest routing weight (ties to
      // the earlier); the kept ones are laid out expert after expert, in assignment order
      const want = {
        counts: Array<number>(E).fill(0),
        rowOf: Array<number>(T * k).fill(-1),
        rows: [] as number[],
      };
      let dropped = 0;
      for (let e = 0; e < E; e++) {
        const mine = [...Array(T * k).keys()].filter((a) => chosen[a] === e);
        const ranked = probsPolicy ? [...mine].sort((p, q) => w[q] - w[p] || p - q) : mine;
        const kept = new Set(ranked.slice(0, capacity));
        dropped += mine.length - kept.size;
        for (const a of mine) {
          if (!kept.has(a)) continue;
          want.counts[e]++;
          want.rowOf[a] = want.rows.length / Hd;
          want.rows.push(...xs.subarray(Math.floor(a / k) * Hd, Math.floor(a / k) * Hd + Hd));
        }
      }
      expect(dropped).toBeGreaterThan(0);
      while (want.rows.length < N * Hd) want.rows.push(0);
      expect([...new Int32Array(rt.readBuffer(counts))]).toEqual(want.counts);
      expect([...new Int32Array(rt.readBuffer(rowOf))]).toEqual(want.rowOf);
      expect([...new Float64Array(rt.readBuffer(rows))]).toEqual(want.rows);
    },
  );

  it('moe_aux_loss, moe_aux_loss_grad (padding excluded)', async () => {
    const b = new ProgramBuilder('aux', { S: 5, Nv: 0 });
    const seg = b.input('segments', 'i32', ['S']);
    const logits = b.param('logits', [5, 4], { dtype: 'f64', trainable: false }).buffer;
    const probs = f64Param(b, 'probs', [5, 4]);
    const [p0, w0] = [f64(b, 'router.probs', [5, 4]), f64(b, 'router.weights', [5, 2])];
    const experts = b.arena('experts', 'i32', [5, 2]);
    const aux = f64(b, 'aux', []);
    const t = terms(b, [[aux, []]]);
    const dprobs = f64(b, 'dprobs', [5, 4]);
    b.instr('compute', 'router_topk', [logits], [p0, w0, experts], { k: 2 });
    b.instr('compute', 'moe_aux_loss', [probs, experts, seg], [aux], { coeff: 0.5 });
    b.instr('compute', 'moe_aux_loss_grad', [t[0].dy, probs, experts, seg], [dprobs], {
      coeff: 0.5,
    });
    await checkGradients({
      b,
      terms: t,
      grads: { probs: dprobs },
      mb: textMicrobatch([[2, 3, 4]], 5),
    });
  });

  it('cross_entropy, cross_entropy_grad (labels and mask from the microbatch)', async () => {
    const b = new ProgramBuilder('ce', { S: 5, Nv: 0 });
    const labels = b.input('labels', 'i32', ['S']);
    const mask = b.input('loss_mask', 'u8', ['S']);
    const count = b.scalar('loss_tokens');
    const logits = f64Param(b, 'logits', [5, 6]);
    const loss = f64(b, 'loss', []);
    const t = terms(b, [[loss, []]]);
    const dlogits = f64(b, 'dlogits', [5, 6]);
    b.instr('compute', 'cross_entropy', [logits, labels, mask, count], [loss]);
    b.instr('compute', 'cross_entropy_grad', [t[0].dy, logits, labels, mask, count], [dlogits]);
    await checkGradients({
      b,
      terms: t,
      grads: { logits: dlogits },
      mb: textMicrobatch([[2, 3, 5, 4]], 5),
    });
  });

  it('embedding, embedding_grad (a repeated id sums)', async () => {
    const b = new ProgramBuilder('embedding', { S: 5, Nv: 0 });
    const tokens = b.input('tokens', 'i32', ['S']);
    const table = f64Param(b, 'table', [6, 3]);
    const y = f64(b, 'y', ['S', 3]);
    const t = terms(b, [[y, [5, 3]]]);
    const dtable = f64(b, 'dtable', [6, 3]);
    b.instr('compute', 'embedding', [tokens, table], [y]);
    b.instr('compute', 'embedding_grad', [t[0].dy, tokens], [dtable], { rows: 6 });
    await checkGradients({
      b,
      terms: t,
      grads: { table: dtable },
      mb: textMicrobatch([[2, 3, 2, 5]], 5),
    });
  });
});

describe('native runtime: weight gradients summed into their buffers (gradient-accumulation fusion)', () => {
  it('linear_wgrad_accumulate and grouped_linear_wgrad_accumulate add what linear_wgrad and grouped_linear_wgrad give', async () => {
    const [N, inF, outF, E] = [4, 3, 5, 2];
    const b = new ProgramBuilder('wgrad-accumulate');
    const x = f64Param(b, 'x', [N, inF]);
    const dy = f64Param(b, 'dy', [N, outF]);
    // accumulators in the param region: the runtime zeroes the grad region at each step
    const acc = f64Param(b, 'acc', [outF, inF]);
    const accBias = f64Param(b, 'acc_bias', [outF]);
    const accExperts = [0, 1].map((e) => f64Param(b, `acc_expert${e}`, [outF, inF]));
    const [dw, db] = [f64(b, 'dw', [outF, inF]), f64(b, 'db', [outF])];
    const dwExperts = [0, 1].map((e) => f64(b, `dw_expert${e}`, [outF, inF]));
    const counts = b.arena('counts', 'i32', [E]);
    b.instr('compute', 'constant', [], [counts], { value: 2, dtype: 'i32', shape: [String(E)] });
    b.instr('compute', 'linear_wgrad', [dy, x], [dw, db], { bias: true });
    b.instr('compute', 'linear_wgrad_accumulate', [dy, x, acc, accBias], [], { bias: true });
    b.instr('compute', 'grouped_linear_wgrad', [dy, x, counts], dwExperts);
    b.instr('compute', 'grouped_linear_wgrad_accumulate', [dy, x, counts, ...accExperts], []);
    const program = b.build();
    const rt = runtimeOf(program);
    const param = (id: number) =>
      Array.from(
        new Float64Array(
          rt.region('param'),
          program.buffers[id].offset,
          program.buffers[id].bytes / 8,
        ),
      );
    const pairs = [
      [acc, dw],
      [accBias, db],
      [accExperts[0], dwExperts[0]],
      [accExperts[1], dwExperts[1]],
    ] as const;
    const before = pairs.map(([a]) => param(a));
    await rt.step({ lr: 0, step: 1 });
    pairs.forEach(([a, d], i) => {
      const g = Array.from(new Float64Array(rt.readBuffer(d)));
      expect(g.some((v) => Math.abs(v) > 1e-3)).toBe(true);
      const got = param(a);
      got.forEach((v, j) => expect(v).toBeCloseTo(before[i][j] + g[j], 12));
    });
    // the two experts' gradients come from different rows
    expect(Array.from(new Float64Array(rt.readBuffer(dwExperts[0])))).not.toEqual(
      Array.from(new Float64Array(rt.readBuffer(dwExperts[1]))),
    );
  });
});

describe('native runtime: vocab-parallel and expert-parallel ops (f64, group rank 0)', () => {
  it('vocab_logsumexp, lse_combine, vocab_target_logit, ce_from_stats and their backward', async () => {
    // a loss through every piece: logits [5, 6] of a vocabulary of 2·6 (rank 0's block), the
    // gathered lse [2, 5] a parameter of its own
    const b = new ProgramBuilder('vocab-ce', { S: 5, Nv: 0 });
    const labels = b.input('labels', 'i32', ['S']);
    const mask = b.input('loss_mask', 'u8', ['S']);
    const count = b.scalar('loss_tokens');
    const shard = { shard_group: 'tp', group_size: 2 };
    const logits = f64Param(b, 'logits', [5, 6]);
    const gathered = f64Param(b, 'gathered', [2, 5]);
    const [lseLocal, lse, target, loss] = [
      f64(b, 'lse_local', [5]),
      f64(b, 'lse', [5]),
      f64(b, 'target', [5]),
      f64(b, 'loss', []),
    ];
    const t = terms(b, [
      [lseLocal, [5]],
      [target, [5]],
      [lse, [5]],
      [loss, []],
    ]);
    const [d1, d2, dgathered, dlse, dtarget] = [
      f64(b, 'dlogits.lse', [5, 6]),
      f64(b, 'dlogits.target', [5, 6]),
      f64(b, 'dgathered', [2, 5]),
      f64(b, 'dlse', [5]),
      f64(b, 'dtarget', [5]),
    ];
    const dlogits = f64(b, 'dlogits', [5, 6]);
    b.instr('compute', 'vocab_logsumexp', [logits], [lseLocal]);
    b.instr('compute', 'vocab_target_logit', [logits, labels, mask], [target], shard);
    b.instr('compute', 'lse_combine', [gathered], [lse]);
    b.instr('compute', 'ce_from_stats', [lse, target, mask, count], [loss]);
    // the loss's own gradient pieces are checked through dlse/dtarget of ce_from_stats_grad,
    // scaled by dy3, and added to the direct terms' gradients
    const [dlseCe, dtargetCe] = [f64(b, 'dlse.ce', [5]), f64(b, 'dtarget.ce', [5])];
    b.instr('compute', 'ce_from_stats_grad', [t[3].dy, lse, mask, count], [dlseCe, dtargetCe]);
    b.instr('compute', 'add', [t[2].dy, dlseCe], [dlse]);
    b.instr('compute', 'add', [t[1].dy, dtargetCe], [dtarget]);
    b.instr('compute', 'lse_combine_grad', [dlse, gathered, lse], [dgathered]);
    b.instr('compute', 'vocab_logsumexp_grad', [t[0].dy, logits, lseLocal], [d1]);
    b.instr('compute', 'vocab_target_logit_grad', [dtarget, labels, mask], [d2], {
      ...shard,
      columns: 6,
    });
    b.instr('compute', 'add', [d1, d2], [dlogits]);
    await checkGradients({
      b,
      terms: t,
      grads: { logits: dlogits, gathered: dgathered },
      // labels 3, 5, 4, 9(other block), 0 for padding; mask 1 1 1 1 0
      mb: textMicrobatch([[2, 3, 5, 4, 9]], 5),
    });
  });

  it('one rank: the vocab-parallel pieces give cross_entropy and its gradient', async () => {
    const b = new ProgramBuilder('vocab-ce-1', { S: 5, Nv: 0 });
    const labels = b.input('labels', 'i32', ['S']);
    const mask = b.input('loss_mask', 'u8', ['S']);
    const count = b.scalar('loss_tokens');
    const one = { group: 'tp', group_size: 1 };
    const logits = f64Param(b, 'logits', [5, 6]);
    const dloss = f64Param(b, 'dloss', []);
    const [ce, dce] = [f64(b, 'ce', []), f64(b, 'dce', [5, 6])];
    const [local, row, gathered, lse, target, loss] = [
      f64(b, 'lse_local', [5]),
      f64(b, 'lse_row', [1, 5]),
      f64(b, 'gathered', [1, 5]),
      f64(b, 'lse', [5]),
      f64(b, 'target', [5]),
      f64(b, 'loss', []),
    ];
    const [dlse, dtarget, dgathered, d1, d2, dlogits] = [
      f64(b, 'dlse', [5]),
      f64(b, 'dtarget', [5]),
      f64(b, 'dgathered', [1, 5]),
      f64(b, 'd1', [5, 6]),
      f64(b, 'd2', [5, 6]),
      f64(b, 'dlogits', [5, 6]),
    ];
    b.instr('compute', 'cross_entropy', [logits, labels, mask, count], [ce]);
    b.instr('compute', 'cross_entropy_grad', [dloss, logits, labels, mask, count], [dce]);
    b.instr('compute', 'vocab_logsumexp', [logits], [local]);
    b.instr('compute', 'reshape', [local], [row], { shape: ['1', '5'] });
    b.instr('compute', 'group_slice', [row], [gathered], one); // the one-rank all_gather's place
    b.instr('compute', 'lse_combine', [gathered], [lse]);
    b.instr('compute', 'vocab_target_logit', [logits, labels, mask], [target], {
      shard_group: 'tp',
      group_size: 1,
    });
    b.instr('compute', 'ce_from_stats', [lse, target, mask, count], [loss]);
    b.instr('compute', 'ce_from_stats_grad', [dloss, lse, mask, count], [dlse, dtarget]);
    b.instr('compute', 'lse_combine_grad', [dlse, gathered, lse], [dgathered]);
    b.instr('compute', 'vocab_logsumexp_grad', [dgathered, logits, local], [d1]);
    b.instr('compute', 'vocab_target_logit_grad', [dtarget, labels, mask], [d2], {
      shard_group: 'tp',
      group_size: 1,
      columns: 6,
    });
    b.instr('compute', 'add', [d1, d2], [dlogits]);
    const program = b.build();
    const rt = new native.Runtime(JSON.stringify(program));
    rt.initParams(
      3,
      program.params.map((p) => ({
        name: p.name,
        init: 'normal(2)',
        shape: p.shard.map(([, n]) => n),
      })),
    );
    rt.setMicrobatch(0, textMicrobatch([[2, 3, 5, 4, 0]], 5));
    rt.setScalar('loss_tokens', 3);
    await rt.step({ lr: 0, step: 1 });
    const read = (id: number) => Array.from(new Float64Array(rt.readBuffer(id)));
    expect(read(loss)).toEqual(read(ce));
    expect(read(dlogits)).toEqual(read(dce));
    expect(read(loss)[0]).toBeGreaterThan(0);
  });

  it('embedding, embedding_grad vocab-parallel (rank 0 of 2: ids of the other block give 0)', async () => {
    const b = new ProgramBuilder('embedding-shard', { S: 5, Nv: 0 });
    const tokens = b.input('tokens', 'i32', ['S']);
    const table = f64Param(b, 'table', [4, 3]); // rows 0–3 of a vocabulary of 8
    const y = f64(b, 'y', ['S', 3]);
    const t = terms(b, [[y, [5, 3]]]);
    const dtable = f64(b, 'dtable', [4, 3]);
    const shard = { shard_group: 'tp', group_size: 2 };
    b.instr('compute', 'embedding', [tokens, table], [y], shard);
    b.instr('compute', 'embedding_grad', [t[0].dy, tokens], [dtable], { rows: 4, ...shard });
    const mb = textMicrobatch([[2, 6, 2, 3, 7]], 5);
    await checkGradients({ b, terms: t, grads: { table: dtable }, mb });
    const program = b.build();
    const rt = new native.Runtime(JSON.stringify(program));
    rt.initParams(
      1,
      program.params.map((p) => ({
        name: p.name,
        init: 'normal(1)',
        shape: p.shard.map(([, n]) => n),
      })),
    );
    rt.setMicrobatch(0, mb);
    await rt.step({ lr: 0, step: 1 });
    const rows = Array.from(new Float64Array(rt.readBuffer(y)));
    expect(rows.slice(3, 6)).toEqual([0, 0, 0]); // id 6 is rank 1's
    expect(rows.slice(12, 15)).toEqual([0, 0, 0]); // id 7
    expect(rows.slice(0, 3).some((v) => v !== 0)).toBe(true);
  });

  it('moe_sort_chunks and its inverse (the backward) against finite differences', async () => {
    // counts [[1, 1], [1, 1]] (P = 2 source ranks, L = 2 local experts): rows 1 and 2 swap, the
    // 3 rows past Σ counts pass through
    const b = new ProgramBuilder('sort-chunks');
    const expertCounts = b.arena('expert_counts', 'i32', [4]);
    const counts = b.arena('counts', 'i32', [2, 2]);
    const rows = f64Param(b, 'rows', [7, 2]);
    const y = f64(b, 'y', [7, 2]);
    const t = terms(b, [[y, [7, 2]]]);
    const drows = f64(b, 'drows', [7, 2]);
    b.instr('compute', 'constant', [], [expertCounts], { value: 1, dtype: 'i32', shape: ['4'] });
    b.instr('compute', 'reshape', [expertCounts], [counts], { shape: ['2', '2'] });
    b.instr('compute', 'moe_sort_chunks', [rows, counts], [y], { inverse: false });
    b.instr('compute', 'moe_sort_chunks', [t[0].dy, counts], [drows], { inverse: true });
    await checkGradients({ b, terms: t, grads: { rows: drows } });
  });

  it('moe_rank_counts and moe_local_counts', async () => {
    const b = new ProgramBuilder('ep-counts');
    const expertCounts = b.arena('expert_counts', 'i32', [4]);
    const counts = b.arena('counts', 'i32', [2, 2]);
    const [perRank, perExpert] = [b.arena('rank', 'i32', [2]), b.arena('local', 'i32', [2])];
    b.instr('compute', 'constant', [], [expertCounts], { value: 3, dtype: 'i32', shape: ['4'] });
    b.instr('compute', 'reshape', [expertCounts], [counts], { shape: ['2', '2'] });
    b.instr('compute', 'moe_rank_counts', [expertCounts], [perRank], { group_size: 2 });
    b.instr('compute', 'moe_local_counts', [counts], [perExpert]);
    const rt = new native.Runtime(JSON.stringify(b.build()));
    await rt.step({ lr: 0, step: 1 });
    expect(Array.from(new Int32Array(rt.readBuffer(perRank)))).toEqual([6, 6]);
    expect(Array.from(new Int32Array(rt.readBuffer(perExpert)))).toEqual([6, 6]);
  });

  it('copy_to_group copies; group_slice keeps the block of group rank 0', async () => {
    const b = new ProgramBuilder('regions');
    const x = b.param('x', [4, 3], { trainable: false }).buffer;
    const [copy, slice] = [b.arena('copy', 'f32', [4, 3]), b.arena('slice', 'f32', [2, 3])];
    b.instr('compute', 'copy_to_group', [x], [copy], { group: 'tp', group_size: 2 });
    b.instr('compute', 'group_slice', [x], [slice], { group: 'tp', group_size: 2 });
    const program = b.build();
    const rt = new native.Runtime(JSON.stringify(program));
    const xs = new Float32Array(rt.region('param'), program.buffers[x].offset, 12);
    xs.set(Array.from({ length: 12 }, (_, i) => i + 1));
    await rt.step({ lr: 0, step: 1 });
    expect(Array.from(new Float32Array(rt.readBuffer(copy)))).toEqual(Array.from(xs));
    expect(Array.from(new Float32Array(rt.readBuffer(slice)))).toEqual([1, 2, 3, 4, 5, 6]);
  });
});

/**
 * DESIGN.md's balancing rule, written out plainly: which rank encodes image i of rank p. Cost =
 * patches²; cost descending, then global index; the rank with the least cost so far among those
 * with room for the image's patches, ties to the lower rank; if some image has no room anywhere,
 * nothing moves.
 */
function balanceRule(sizes: readonly (readonly number[])[], capacity: number): number[][] {
  const P = sizes.length;
  const images = sizes
    .flatMap((row, p) => row.map((n, i) => ({ p, i, n, global: p * row.length + i })))
    .filter((x) => x.n > 0)
    .sort((a, b) => b.n * b.n - a.n * a.n || a.global - b.global);
  const cost = new Array<number>(P).fill(0);
  const rows = new Array<number>(P).fill(0);
  const dest = sizes.map((row) => row.map(() => -1));
  for (const im of images) {
    const open = [...Array(P).keys()].filter((q) => rows[q] + im.n <= capacity);
    if (!open.length) return sizes.map((row, p) => row.map((n) => (n > 0 ? p : -1)));
    const q = open.reduce((best, r) => (cost[r] < cost[best] ? r : best));
    dest[im.p][im.i] = q;
    cost[q] += im.n * im.n;
    rows[q] += im.n;
  }
  return dest;
}

describe('native runtime: the ViT balance ops (group rank 0 of 2)', () => {
  it('image_sizes, vit_balance_route, segment_offset and gather_rows on a microbatch with images, against the rule', async () => {
    // rank 0 holds images of 8×16, 16×16, 8×8, 16×8 pixels (8, 16, 4 and 8 patches of 4×4);
    // rank 1's sizes are a constant block of 4 images of 4 patches
    const sides = [
      [8, 16],
      [16, 16],
      [8, 8],
      [16, 8],
    ];
    const own = sides.map(([h, w]) => (h / 4) * (w / 4));
    const Np = own.reduce((a, b) => a + b, 0); // 36 patches, 9 visual tokens
    const I = 8;
    const capacity = 64;
    const b = new ProgramBuilder('vit-balance', { S: 16, Nv: 16 });
    const seg = b.input('image_segments', 'i32', ['4*Nv']);
    const patches = b.input('patches', 'f32', ['4*Nv', 48]);
    const mine = b.arena('sizes', 'i32', [I]);
    const theirs = b.arena('theirs', 'i32', [I]);
    const theirs2 = b.arena('theirs2', 'i32', [1, I]);
    const mine2 = b.view('sizes2', mine, [1, I]);
    const all2 = b.arena('all2', 'i32', [2, I]);
    const all = b.view('all', all2, [2 * I]);
    const outs = [
      b.arena('send', 'i32', [2]),
      b.arena('order', 'i32', ['4*Nv']),
      b.arena('back', 'i32', [2]),
      b.arena('inverse', 'i32', ['Nv']),
      b.scalar('moved'),
    ];
    const offset = b.arena('offset', 'i32', ['4*Nv']);
    const picked = b.arena('picked', 'f32', ['4*Nv', 48]);
    const group = { group: 'dp', group_size: 2 };
    b.instr('compute', 'image_sizes', [seg], [mine], { images: I });
    b.instr('compute', 'constant', [], [theirs], { value: 4, dtype: 'i32', shape: [String(I)] });
    b.instr('compute', 'reshape', [theirs], [theirs2], { shape: ['1', String(I)] });
    b.instr('compute', 'concat', [mine2, theirs2], [all2]);
    b.instr('compute', 'vit_balance_route', [all, seg], outs, {
      ...group,
      images: I,
      merge: 4,
      capacity,
    });
    b.instr('compute', 'segment_offset', [seg], [offset], { ...group, stride: 100 });
    b.instr('compute', 'gather_rows', [patches, outs[1]], [picked]);
    const rt = new native.Runtime(JSON.stringify(b.build()), { patchSize: 4, mergeSize: 2 });
    const images = sides.map(([h, w], k) => ({
      height: h,
      width: w,
      pixels: Float32Array.from({ length: 3 * h * w }, (_, i) => Math.sin(i + 100 * k)),
    }));
    const mb = textMicrobatch([[...Array<number>(Np / 4).fill(1), 5, 6]], 16);
    rt.setMicrobatch(0, { ...mb, images });
    await rt.step({ lr: 0, step: 1 });
    const ints = (id: number) => Array.from(new Int32Array(rt.readBuffer(id)));
    expect(ints(mine)).toEqual([...own, 0, 0, 0, 0]);

    const sizes = [[...own, 0, 0, 0, 0], new Array<number>(I).fill(4)];
    const dest = balanceRule(sizes, capacity);
    const start = own.map((_, i) => own.slice(0, i).reduce((a, n) => a + n, 0));
    const order = [0, 1].flatMap((q) =>
      own.flatMap((n, i) =>
        dest[0][i] === q ? Array.from({ length: n }, (_, k) => start[i] + k) : [],
      ),
    );
    const moved = dest.flat().filter((q, g) => q >= 0 && q !== Math.floor(g / I)).length;
    expect(moved).toBeGreaterThan(0); // the case moves images both ways
    expect(ints(outs[0])).toEqual(
      [0, 1].map((q) => own.reduce((a, n, i) => a + (dest[0][i] === q ? n : 0), 0)),
    );
    expect(ints(outs[1])).toEqual(order);
    expect(ints(outs[2])).toEqual(
      [0, 1].map((p) => sizes[p].reduce((a, n, i) => a + (dest[p][i] === 0 ? n / 4 : 0), 0)),
    );
    const inverse = ints(outs[3]);
    inverse.forEach((row, u) => expect(order[row * 4]).toBe(u * 4));
    expect(rt.getScalar('moved')).toBe(moved);
    const segments = ints(seg);
    expect(ints(offset)).toEqual(segments); // group rank 0: + 0·stride
    const x = new Float32Array(rt.readBuffer(patches));
    const y = new Float32Array(rt.readBuffer(picked));
    order.forEach((row, i) =>
      expect(Array.from(y.subarray(i * 48, (i + 1) * 48))).toEqual(
        Array.from(x.subarray(row * 48, (row + 1) * 48)),
      ),
    );
  });

  it('gather_rows and scatter_rows (its backward) against finite differences', async () => {
    const b = new ProgramBuilder('gather-rows');
    // index = the positions of a sample of 4 tokens padded to 6: 0 1 2 3 0 0 (row 0 picked three
    // times, rows 4 and 5 never: their gradient is 0)
    const index = b.input('positions', 'i32', ['S']);
    const rows = f64Param(b, 'rows', [6, 2]);
    const y = f64(b, 'y', ['S', 2]);
    const t = terms(b, [[y, [6, 2]]]);
    const drows = f64(b, 'drows', [6, 2]);
    b.instr('compute', 'gather_rows', [rows, index], [y]);
    b.instr('compute', 'scatter_rows', [t[0].dy, index], [drows], { rows: ['6'] });
    const mb = textMicrobatch([[2, 3, 4, 5]], 6);
    expect(Array.from(mb.positions)).toEqual([0, 1, 2, 3, 0, 0]);
    await checkGradients({ b, terms: t, grads: { rows: drows }, mb });
  });
});

describe('native runtime: layout, memory and constant ops', () => {
  it('split and concat invert each other; add; offload and reload copy; constant fills', async () => {
    const b = new ProgramBuilder('layout');
    const x = b.param('x', [2, 6], { trainable: false }).buffer;
    const parts = [
      b.arena('p0', 'f32', [2, 1]),
      b.arena('p1', 'f32', [2, 3]),
      b.arena('p2', 'f32', [2, 2]),
    ];
    const joined = b.arena('joined', 'f32', [2, 6]);
    const sum = b.arena('sum', 'f32', [2, 6]);
    const host = b.buffer('sum.host', 'arena', 'f32', [2, 6], { space: 'host' });
    const back = b.arena('sum.back', 'f32', [2, 6]);
    const c = b.arena('c', 'i32', [3]);
    const e0 = b.event();
    const e1 = b.event();
    b.instr('compute', 'split', [x], parts, { sizes: [1, 3, 2] });
    b.instr('compute', 'concat', parts, [joined]);
    b.instr('compute', 'add', [x, joined], [sum], {}, { record: [e0] });
    b.instr('copy', 'offload', [sum], [host], {}, { wait: [e0] });
    b.instr('copy', 'reload', [host], [back], {}, { record: [e1] });
    b.instr(
      'compute',
      'constant',
      [],
      [c],
      { value: 7, dtype: 'i32', shape: ['3'] },
      { wait: [e1] },
    );
    const program = b.build();
    const rt = new native.Runtime(JSON.stringify(program));
    const xs = new Float32Array(rt.region('param'), program.buffers[x].offset, 12);
    xs.set(Array.from({ length: 12 }, (_, i) => i + 1));
    await rt.step({ lr: 0, step: 1 });
    const read = (id: number) => Array.from(new Float32Array(rt.readBuffer(id)));
    expect(read(parts[0])).toEqual([1, 7]);
    expect(read(parts[1])).toEqual([2, 3, 4, 8, 9, 10]);
    expect(read(parts[2])).toEqual([5, 6, 11, 12]);
    expect(read(joined)).toEqual(Array.from(xs));
    expect(read(back)).toEqual(Array.from(xs, (v) => 2 * v));
    expect(Array.from(new Int32Array(rt.readBuffer(c)))).toEqual([7, 7, 7]);
  });
});
