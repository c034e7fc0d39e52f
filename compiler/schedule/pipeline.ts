// Microbatch schedules: the order of forward and backward passes on each pipeline stage for one
// step, exactly as Megatron-LM orders them (reference/schedules.md), plus bubble estimates.
// Pure functions of the sizes; no IR.
//
// Notation: p stages (r = 0 … p−1), v chunks per stage, m microbatches per data-parallel rank,
// g microbatch group size of the interleaved schedule. Virtual stage s = c·p + r is chunk c of
// stage r; a forward runs virtual stages 0 … p·v−1 in turn, a backward the reverse.
//
// Each stage's list has three phases:
//   1 warm-up    the first w forwards
//   2 steady     one forward, then one backward, until the forwards run out (with MoE all-to-all
//                overlap each pair is one combined step, run layer by layer: anchors.md)
//   3 cool-down  the remaining backwards

import { UserError } from '../errors.js';

/** One pass of one microbatch through one chunk of a stage. */
export interface Pass {
  readonly microbatch: number;
  readonly chunk: number;
}

export type Action =
  | ({ readonly kind: 'F' } & Pass)
  | ({ readonly kind: 'B' } & Pass)
  /** a steady-state forward and backward of different microbatches, run as one combined step */
  | { readonly kind: 'FB'; readonly f: Pass; readonly b: Pass };

export interface StageSchedule {
  readonly stage: number;
  /** warm-up forwards (phase 1); without A2A overlap one more forward precedes the first backward */
  readonly warmup: number;
  readonly actions: readonly Action[];
}

export interface PipelineSchedule {
  readonly kind: '1f1b' | 'interleaved';
  readonly p: number;
  readonly v: number;
  readonly m: number;
  /** microbatch group size (interleaved); m for 1F1B, where there are no groups */
  readonly g: number;
  readonly a2aOverlap: boolean;
  readonly stages: readonly StageSchedule[];
}

function fail(rule: string, msg: string): never {
  throw new UserError(`invalid schedule (${rule}): ${msg}`);
}

function checkPositive(sizes: Record<string, number>): void {
  for (const [name, n] of Object.entries(sizes)) {
    if (!Number.isInteger(n) || n < 1)
      fail('sizes-positive', `${name} must be a positive integer, got ${n}`);
  }
}

/** 1F1B warm-up forwards on stage r: min(p − r − 1, m). */
export function warmup1F1B(p: number, r: number, m: number): number {
  return Math.min(p - r - 1, m);
}

/**
 * Interleaved warm-up forwards on stage r: (p − r − 1)·2 + (v − 1)·g, one more with A2A overlap
 * (so each combined step pairs a forward and a backward of different microbatches), capped at m·v.
 */
export function warmupInterleaved(
  p: number,
  r: number,
  v: number,
  m: number,
  g: number,
  a2aOverlap = false,
): number {
  const w = (p - r - 1) * 2 + (v - 1) * g + (a2aOverlap ? 1 : 0);
  return Math.min(w, m * v);
}

/**
 * Phases 1–3 from the forward order and the backward order of one stage: w forwards, then
 * forward w + k with backward k (combined when `combine`), then the remaining backwards.
 */
function stageActions(
  forwards: readonly Pass[],
  backwards: readonly Pass[],
  w: number,
  combine: boolean,
): Action[] {
  const n = forwards.length;
  const actions: Action[] = forwards.slice(0, w).map((f) => ({ kind: 'F', ...f }));
  for (let k = 0; k < n - w; k++) {
    const f = forwards[w + k];
    const b = backwards[k];
    if (combine) actions.push({ kind: 'FB', f, b });
    else actions.push({ kind: 'F', ...f }, { kind: 'B', ...b });
  }
  for (let k = n - w; k < n; k++) actions.push({ kind: 'B', ...backwards[k] });
  return actions;
}

/** Plain 1F1B (no virtual stages): microbatches in order, forward and backward alike. */
export function schedule1F1B(p: number, m: number): PipelineSchedule {
  checkPositive({ 'pipeline size p': p, 'microbatches m': m });
  const passes = Array.from({ length: m }, (_, k) => ({ microbatch: k, chunk: 0 }));
  const stages = Array.from({ length: p }, (_, r) => {
    const w = warmup1F1B(p, r, m);
    return { stage: r, warmup: w, actions: stageActions(passes, passes, w, false) };
  });
  return { kind: '1f1b', p, v: 1, m, g: m, a2aOverlap: false, stages };
}

/**
 * The forward order of the interleaved schedule (Megatron's schedule table): for each group of g
 * microbatches, chunk 0 of all of them, then chunk 1, … chunk v−1. The last group, the one that
 * reaches m, takes every microbatch left.
 */
export function interleavedForwardOrder(m: number, v: number, g: number): Pass[] {
  const order: Pass[] = [];
  for (let first = 0; first < m; first += g) {
    const end = Math.min(first + g, m);
    for (let chunk = 0; chunk < v; chunk++)
      for (let microbatch = first; microbatch < end; microbatch++)
        order.push({ microbatch, chunk });
  }
  return order;
}

/**
 * Interleaved 1F1B with v chunks per stage and microbatch groups of g (default p). The k-th
 * backward is the microbatch of the k-th forward-table entry in chunk v − 1 − c (Megatron pops
 * each chunk's oldest forward, which is that microbatch). With `a2aOverlap`
 * (--overlap-moe-expert-parallel-comm) the steady-state pairs are combined steps. v = 1 is
 * Megatron's interleaved code path with one chunk (warm-up 2·(p − r − 1)), not schedule1F1B.
 */
export function scheduleInterleaved(
  p: number,
  v: number,
  m: number,
  g = p,
  opts: { readonly a2aOverlap?: boolean } = {},
): PipelineSchedule {
  checkPositive({
    'pipeline size p': p,
    'chunks per stage v': v,
    'microbatches m': m,
    'group size g': g,
  });
  if (g < p || g > m)
    fail(
      'microbatch-group',
      `group size ${g} must lie in [pipeline ${p}, microbatches per data-parallel rank ${m}]`,
    );
  const remainder = m % g;
  if (remainder >= 1 && remainder < p)
    fail(
      'microbatch-group',
      `${m} microbatches per data-parallel rank in groups of ${g} leave a last group of ${remainder}, which must be 0 or at least pipeline ${p}`,
    );
  const a2aOverlap = opts.a2aOverlap ?? false;
  const forwards = interleavedForwardOrder(m, v, g);
  const backwards = forwards.map((f) => ({ microbatch: f.microbatch, chunk: v - 1 - f.chunk }));
  const stages = Array.from({ length: p }, (_, r) => {
    const w = warmupInterleaved(p, r, v, m, g, a2aOverlap);
    return { stage: r, warmup: w, actions: stageActions(forwards, backwards, w, a2aOverlap) };
  });
  return { kind: 'interleaved', p, v, m, g, a2aOverlap, stages };
}

/**
 * A stage's actions as text: `F3.1` is the forward of microbatch 3 in chunk 1, `B0` a backward
 * when there is one chunk, `F4.0+B1.1` a combined step.
 */
export function formatActions(actions: readonly Action[], v: number): string {
  const pass = (kind: 'F' | 'B', x: Pass) => `${kind}${x.microbatch}${v > 1 ? `.${x.chunk}` : ''}`;
  return actions
    .map((a) => (a.kind === 'FB' ? `${pass('F', a.f)}+${pass('B', a.b)}` : pass(a.kind, a)))
    .join(' ');
}

/**
 * Idle fraction of a step with equal stages: (p − 1) / (v·m + p − 1). Plain 1F1B (v = 1) is
 * (p − 1) / (m + p − 1); interleaving divides the warm-up and cool-down time by v.
 */
export function bubbleFraction(p: number, m: number, v = 1): number {
  return (p - 1) / (v * m + p - 1);
}

export interface StepEstimate {
  /** forward + backward FLOPs on the critical path of one step (backward = 2 × forward) */
  readonly criticalFlops: number;
  /** the average over stages of the idle fraction of the step */
  readonly bubbleFraction: number;
}

/**
 * Step length and bubble from the forward FLOPs f_s of each virtual stage (s = c·p + r), for
 * uneven stages. Stage r works W_r = Σ_c 3·f_{c·p+r} per microbatch; its first forward waits for
 * microbatch 0 to pass virtual stages 0 … r−1 and its last backward's gradient must still pass
 * them back, so
 *   T = max_r ( m·W_r + 3·Σ_{s<r} f_s ).
 * This critical-path bound is exact for equal stages (it is then bubbleFraction) and whenever
 * one stage is the bottleneck throughout; it never exceeds the executed step. Under levels 1–2
 * the encoder is part of f_0 and so lengthens stage 0; under full separation it runs before the
 * pipeline and is not in f at all.
 */
export function estimateStep(
  virtualStageFlops: readonly number[],
  p: number,
  v: number,
  m: number,
): StepEstimate {
  if (virtualStageFlops.length !== p * v)
    throw new Error(`estimateStep: ${virtualStageFlops.length} virtual stages, p·v = ${p * v}`);
  const stageWork = Array.from({ length: p }, (_, r) => {
    let w = 0;
    for (let c = 0; c < v; c++) w += 3 * virtualStageFlops[c * p + r];
    return w;
  });
  let criticalFlops = 0;
  let fill = 0;
  for (let r = 0; r < p; r++) {
    criticalFlops = Math.max(criticalFlops, m * stageWork[r] + fill);
    fill += 3 * virtualStageFlops[r];
  }
  const total = stageWork.reduce((a, b) => a + b, 0);
  return { criticalFlops, bubbleFraction: 1 - (m * total) / (p * criticalFlops) };
}
