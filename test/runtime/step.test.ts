// A whole training step of a tiny embedding → linear → cross-entropy model on two streams
// (backward on compute, gradient accumulation on comm, events both ways), checked against the
// same step computed in JavaScript in float64; and views.
import { describe, expect, it } from 'vitest';

import { OP_KINDS } from '../../ir/ops.js';
import { PLAN_VERSION, PROGRAM_REGIONS, STREAMS } from '../../compiler/plan/format.js';
import { loadNative } from '../../runtime/native.js';
import { f32At, ProgramBuilder, textMicrobatch } from './program-builder.js';

const native = loadNative();

const V = 16; // vocab
const H = 4; // hidden
const S = 8; // sequence bound
const MAX_NORM = 0.1; // small enough that the step clips

function tinyModel() {
  const b = new ProgramBuilder('tiny-ce', { S, Nv: 0 });
  const tokens = b.input('tokens', 'i32', ['S']);
  const labels = b.input('labels', 'i32', ['S']);
  const mask = b.input('loss_mask', 'u8', ['S']);
  const lossTokens = b.scalar('loss_tokens');
  const normSq = b.scalar('grad_norm_sq');
  const clip = b.scalar('clip_coef');
  const embed = b.param('embed.weight', [V, H]);
  const w = b.param('head.weight', [V, H]);
  const bias = b.param('head.bias', [V]);
  const h = b.arena('h', 'f32', ['S', H]);
  const logits = b.arena('logits', 'f32', ['S', V]);
  const loss = b.arena('loss', 'f32', []);
  const dloss = b.arena('dloss', 'f32', []);
  const dlogits = b.arena('dlogits', 'f32', ['S', V]);
  const dW = b.arena('dW', 'f32', [V, H]);
  const db = b.arena('db', 'f32', [V]);
  const dh = b.arena('dh', 'f32', ['S', H]);
  const dE = b.arena('dE', 'f32', [V, H]);
  const headDone = b.event();
  const embedDone = b.event();
  const gradsDone = b.event();
  const bw = { phase: 'backward' as const };
  b.instr('compute', 'embedding', [tokens, embed.buffer], [h], {}, { scope: 'embed' });
  b.instr('compute', 'linear', [h, w.buffer, bias.buffer], [logits], {}, { scope: 'head' });
  b.instr(
    'compute',
    'cross_entropy',
    [logits, labels, mask, lossTokens],
    [loss],
    {},
    { scope: 'loss' },
  );
  b.instr(
    'compute',
    'constant',
    [],
    [dloss],
    { value: 1, dtype: 'f32', shape: [] },
    { ...bw, scope: 'loss' },
  );
  b.instr(
    'compute',
    'cross_entropy_grad',
    [dloss, logits, labels, mask, lossTokens],
    [dlogits],
    {},
    bw,
  );
  b.instr(
    'compute',
    'linear_wgrad',
    [dlogits, h],
    [dW, db],
    { bias: true },
    { ...bw, record: [headDone] },
  );
  b.instr('compute', 'linear_dgrad', [dlogits, w.buffer], [dh], {}, bw);
  b.instr(
    'compute',
    'embedding_grad',
    [dh, tokens],
    [dE],
    { rows: V },
    { ...bw, record: [embedDone] },
  );
  b.instr('comm', 'grad_accumulate', [dW, w.grad], [], {}, { ...bw, wait: [headDone] });
  b.instr('comm', 'grad_accumulate', [db, bias.grad], [], {}, bw);
  b.instr(
    'comm',
    'grad_accumulate',
    [dE, embed.grad],
    [],
    {},
    { ...bw, wait: [embedDone], record: [gradsDone] },
  );
  const opt = { phase: 'optimizer' as const, microbatch: -1, scope: 'optimizer' };
  b.instr(
    'compute',
    'sum_squares',
    [embed.grad, w.grad, bias.grad],
    [normSq],
    {},
    { ...opt, wait: [gradsDone] },
  );
  b.instr('compute', 'clip_coef', [normSq], [clip], { max_norm: MAX_NORM }, opt);
  const adam = { beta1: 0.9, beta2: 0.95, eps: 1e-8 };
  for (const [p, wd] of [
    [embed, 0.1],
    [w, 0.1],
    [bias, 0],
  ] as const)
    b.instr(
      'compute',
      'adamw',
      [p.buffer, p.grad, p.m, p.v, clip],
      [],
      { ...adam, weight_decay: wd },
      opt,
    );
  b.output('loss', loss);
  return { b, embed, w, bias };
}

const PARAM_INITS = [
  { name: 'embed.weight', init: 'normal(0.5)', shape: [V, H] },
  { name: 'head.weight', init: 'normal(0.5)', shape: [V, H] },
  { name: 'head.bias', init: 'normal(0.5)', shape: [V] },
];

/** The step in float64: loss, gradients, clipping and AdamW, as tiny-vlm.md states them. */
function referenceStep(
  E: Float64Array,
  W: Float64Array,
  B: Float64Array,
  mb: ReturnType<typeof textMicrobatch>,
  n: number,
  lossTokens: number,
  lr: number,
) {
  const gE = new Float64Array(V * H);
  const gW = new Float64Array(V * H);
  const gB = new Float64Array(V);
  let loss = 0;
  for (let t = 0; t < n; t++) {
    const x = Array.from({ length: H }, (_, j) => E[mb.tokens[t] * H + j]);
    const z = Array.from(
      { length: V },
      (_, v) => B[v] + x.reduce((s, xj, j) => s + xj * W[v * H + j], 0),
    );
    if (!mb.lossMask[t]) continue;
    const m = Math.max(...z);
    const lse = m + Math.log(z.reduce((s, zv) => s + Math.exp(zv - m), 0));
    loss += (lse - z[mb.labels[t]]) / lossTokens;
    const dz = z.map((zv, v) => (Math.exp(zv - lse) - (v === mb.labels[t] ? 1 : 0)) / lossTokens);
    for (let v = 0; v < V; v++) {
      gB[v] += dz[v];
      for (let j = 0; j < H; j++) {
        gW[v * H + j] += dz[v] * x[j];
        gE[mb.tokens[t] * H + j] += dz[v] * W[v * H + j];
      }
    }
  }
  const normSq = [gE, gW, gB].reduce((s, g) => s + g.reduce((a, x) => a + x * x, 0), 0);
  const clip = Math.min(1, MAX_NORM / (Math.sqrt(normSq) + 1e-6));
  const adamw = (p: Float64Array, g: Float64Array, wd: number) =>
    p.map((pv, i) => {
      const gi = g[i] * clip;
      const m = 0.1 * gi;
      const v = 0.05 * gi * gi;
      const mh = m / (1 - 0.9);
      const vh = v / (1 - 0.95);
      return pv * (1 - lr * wd) - (lr * mh) / (Math.sqrt(vh) + 1e-8);
    });
  return {
    loss,
    gE,
    gW,
    gB,
    normSq,
    clip,
    E1: adamw(E, gE, 0.1),
    W1: adamw(W, gW, 0.1),
    B1: adamw(B, gB, 0),
  };
}

function expectClose(
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  tol: number,
  what: string,
): void {
  expect(got.length, what).toBe(want.length);
  let worst = 0;
  for (let i = 0; i < want.length; i++)
    worst = Math.max(worst, Math.abs(got[i] - want[i]) / (Math.abs(want[i]) + 1e-3));
  expect(worst, `${what}: worst relative error`).toBeLessThan(tol);
}

describe('native runtime: schema', () => {
  it('the addon was built from the current op table and plan version', () => {
    expect(native.opNames).toEqual([...OP_KINDS]);
    expect(native.planVersion).toBe(PLAN_VERSION);
    expect(native.streams).toEqual([...STREAMS]);
    expect(native.regions).toEqual([...PROGRAM_REGIONS]);
  });
});

describe('native runtime: a training step', () => {
  it('matches the step computed in JS: loss, gradients, norm, clipping, AdamW', async () => {
    const { b, embed, w, bias } = tinyModel();
    const program = b.build();
    const rt = new native.Runtime(b.json(), { timing: true });
    expect(rt.info().streams).toEqual(['compute', 'comm']);
    rt.initParams(7, PARAM_INITS);
    const params = rt.region('param');
    const buf = (id: number) => program.buffers[id];
    const before = {
      E: Float64Array.from(f32At(params, buf(embed.buffer))),
      W: Float64Array.from(f32At(params, buf(w.buffer))),
      B: Float64Array.from(f32At(params, buf(bias.buffer))),
    };
    const mb = textMicrobatch(
      [
        [3, 5, 7, 9, 11],
        [2, 4, 6],
      ],
      S,
    );
    rt.setMicrobatch(0, mb);
    const lossTokens = mb.lossMask.reduce((a, x) => a + x, 0);
    rt.setScalar('loss_tokens', lossTokens);

    const lr = 0.01;
    const result = await rt.step({ lr, step: 1 });
    const ref = referenceStep(before.E, before.W, before.B, mb, 8, lossTokens, lr);

    expect(result.instructionsRun).toBe(program.instructions.length);
    expect(result.outputs).toHaveLength(1);
    expect(result.outputs[0].name).toBe('loss');
    expect(result.outputs[0].value).toBeCloseTo(ref.loss, 5);
    expect(result.scalars.loss_tokens).toBe(lossTokens);
    expect(result.scalars.grad_norm_sq).toBeCloseTo(ref.normSq, 4);
    expect(result.scalars.clip_coef).toBeCloseTo(ref.clip, 5);
    expect(ref.clip).toBeLessThan(1); // the test exercises clipping
    const grads = rt.region('grad');
    expectClose(f32At(grads, buf(embed.grad)), ref.gE, 1e-4, 'embed grad');
    expectClose(f32At(grads, buf(w.grad)), ref.gW, 1e-4, 'head weight grad');
    expectClose(f32At(grads, buf(bias.grad)), ref.gB, 1e-4, 'head bias grad');
    expectClose(f32At(params, buf(embed.buffer)), ref.E1, 1e-5, 'embed after AdamW');
    expectClose(f32At(params, buf(w.buffer)), ref.W1, 1e-5, 'head weight after AdamW');
    expectClose(f32At(params, buf(bias.buffer)), ref.B1, 1e-5, 'head bias after AdamW');

    // the comm stream's accumulation started only after the compute stream recorded its event
    const t = result.perInstruction!;
    expect(t).toHaveLength(program.instructions.length);
    expect(t[8].start).toBeGreaterThanOrEqual(t[5].end);
    expect(t[10].start).toBeGreaterThanOrEqual(t[7].end);
    expect(t[11].start).toBeGreaterThanOrEqual(t[10].end);
  });

  it('zeroes the gradients each step and runs the next step with t = 2', async () => {
    const { b, embed } = tinyModel();
    const program = b.build();
    const rt = new native.Runtime(b.json());
    rt.initParams(7, PARAM_INITS);
    const mb = textMicrobatch([[3, 5, 7, 9, 11]], S);
    rt.setMicrobatch(0, mb);
    rt.setScalar('loss_tokens', 4);
    const r1 = await rt.step({ lr: 0.01, step: 1 });
    const g1 = Float32Array.from(f32At(rt.region('grad'), program.buffers[embed.grad]));
    const r2 = await rt.step({ lr: 0.01, step: 2 });
    const g2 = f32At(rt.region('grad'), program.buffers[embed.grad]);
    expect(r2.outputs[0].value).toBeLessThan(r1.outputs[0].value); // it learns
    // same order of magnitude: the gradient was not accumulated over both steps
    const n1 = Math.hypot(...g1);
    const n2 = Math.hypot(...g2);
    expect(n2).toBeLessThan(1.5 * n1);
    expect(n2).toBeGreaterThan(0.5 * n1);
  });
});

describe('native runtime: forward only (an evaluation)', () => {
  it("gives the training step's loss, bit for bit, and changes no parameter or optimizer state", async () => {
    const { b } = tinyModel();
    const program = b.build();
    const rt = new native.Runtime(b.json(), { timing: true });
    rt.initParams(7, PARAM_INITS);
    const mb = textMicrobatch([[3, 5, 7, 9, 11]], S);
    rt.setMicrobatch(0, mb);
    rt.setScalar('loss_tokens', 4);
    const params = Float32Array.from(new Float32Array(rt.region('param')));
    const optim = Float32Array.from(new Float32Array(rt.region('optim')));

    const e1 = await rt.step({ lr: 0.01, step: 1, forwardOnly: true });
    const e2 = await rt.step({ lr: 0.01, step: 1, forwardOnly: true });
    // the forward's instructions alone ran: embedding, linear, cross_entropy
    const forward = program.instructions.filter((i) => i.phase === 'forward').length;
    expect(forward).toBe(3);
    expect(e1.instructionsRun).toBe(forward);
    expect(e1.perInstruction!.filter((t) => t.end > 0)).toHaveLength(forward);
    expect(new Float32Array(rt.region('param'))).toEqual(params);
    expect(new Float32Array(rt.region('optim'))).toEqual(optim);
    expect(e2.outputs[0].value).toBe(e1.outputs[0].value);

    // the training step computes its loss before it updates: the same bits
    const t1 = await rt.step({ lr: 0.01, step: 1 });
    expect(t1.instructionsRun).toBe(program.instructions.length);
    expect(t1.outputs[0].value).toBe(e1.outputs[0].value);
    expect(new Float32Array(rt.region('param'))).not.toEqual(params);
    const e3 = await rt.step({ lr: 0.01, step: 2, forwardOnly: true });
    const t2 = await rt.step({ lr: 0.01, step: 2 });
    expect(e3.outputs[0].value).toBe(t2.outputs[0].value);
    expect(e3.outputs[0].value).toBeLessThan(e1.outputs[0].value); // it learned meanwhile
  });
});

describe('native runtime: views', () => {
  it('a reshape with viewOf shares bytes; one without copies; rope reads the view', async () => {
    const b = new ProgramBuilder('views', { S: 6, Nv: 0 });
    const tokens = b.input('tokens', 'i32', ['S']);
    const positions = b.input('positions', 'i32', ['S']);
    const table = b.param('table', [10, 8], { trainable: false });
    const h = b.arena('h', 'f32', ['S', 8]);
    const hv = b.view('h.heads', h, ['S', 2, 4]); // [S, nh, d] over h's bytes
    const r = b.arena('rope', 'f32', ['S', 2, 4]);
    const flat = b.arena('rope.flat', 'f32', ['S', 8]); // a copy: no viewOf
    b.instr('compute', 'embedding', [tokens, table.buffer], [h]);
    b.instr('compute', 'reshape', [h], [hv], { shape: ['S', '2', '4'] });
    b.instr('compute', 'rope', [hv, positions], [r], { theta: 100, sections: [2] });
    b.instr('compute', 'reshape', [r], [flat], { shape: ['S', '8'] });
    const program = b.build();
    const rt = new native.Runtime(b.json());
    rt.initParams(1, [{ name: 'table', init: 'normal(1)', shape: [10, 8] }]);
    const mb = textMicrobatch(
      [
        [2, 3, 4],
        [5, 6],
      ],
      6,
    );
    rt.setMicrobatch(0, mb);
    await rt.step({ lr: 0, step: 1 });
    const T = f32At(rt.region('param'), program.buffers[table.buffer]);
    const hBytes = new Float32Array(rt.readBuffer(h));
    expect(Array.from(new Float32Array(rt.readBuffer(hv)))).toEqual(Array.from(hBytes));
    const out = new Float32Array(rt.readBuffer(flat));
    expect(out).toHaveLength(6 * 8);
    for (let t = 0; t < 6; t++)
      for (let head = 0; head < 2; head++)
        for (let j = 0; j < 2; j++) {
          const x = (k: number) => T[mb.tokens[t] * 8 + head * 4 + k];
          const angle = mb.positions[t] * Math.pow(100, (-2 * j) / 4);
          const y0 = x(j) * Math.cos(angle) - x(j + 2) * Math.sin(angle);
          const y1 = x(j + 2) * Math.cos(angle) + x(j) * Math.sin(angle);
          expect(out[t * 8 + head * 4 + j]).toBeCloseTo(y0, 5);
          expect(out[t * 8 + head * 4 + j + 2]).toBeCloseTo(y1, 5);
        }
  });
});
