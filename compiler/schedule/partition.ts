// Pipeline partitioning: the L decoder layers split into p·v contiguous virtual stages in layer
// order; virtual stage s = c·p + r is chunk c of pipeline stage r (reference/schedules.md). The
// first virtual stage also carries what runs before layer 0 (embedding; the encoder and projector
// when they run on stage 0) and the last what runs after the last layer (final norm, lm_head,
// loss).
//
// after: every virtual stage holds ≥ 1 layer and, unless the user fixed the split, the most
//        expensive virtual stage is as cheap as any contiguous split allows. Where the embedding
//        or the loss counts as a layer (Megatron's --account-for-embedding-in-pipeline-split,
//        --account-for-loss-in-pipeline-split), every virtual stage holds the same number of
//        pieces, so the first (embedding) or the last (lm_head and loss) may hold no layer.
//
// Notation: L layers, p stages, v chunks per stage, K = p·v virtual stages. Costs are a rank's
// seconds per microbatch on the compile's hardware profile where it has one (priced.ts: kernels
// and collectives, forward and backward), else forward FLOPs (backward is 2 × forward for every
// piece, so forward balance is step balance) as the caller weighs them: the compiler passes a
// stage-0 rank's share of the encoder in the decoder's unsharded units, at the expected visual
// tokens (compiler/pipeline.ts, stageCosts). The stage lines report forward FLOPs either way.

import { UserError } from '../errors.js';
import { preFlops, type ForwardCosts } from './costs.js';

export interface PartitionOptions {
  /** --pipeline-model-parallel-size */
  readonly pp: number;
  /** --num-virtual-stages-per-pipeline-rank; default 1 */
  readonly vpp?: number;
  /** the encoder and projector run in stage 0's chunk 0 (levels 1–2); false under full separation */
  readonly encoderOnStage0?: boolean;
  /** --decoder-first-pipeline-num-layers: layers of stage 0, over all its chunks */
  readonly firstStageLayers?: number;
  /** --decoder-last-pipeline-num-layers: layers of stage p−1, over all its chunks */
  readonly lastStageLayers?: number;
  /** --account-for-embedding-in-pipeline-split: the embedding takes a layer's place */
  readonly accountForEmbedding?: boolean;
  /** --account-for-loss-in-pipeline-split: lm_head and the loss take a layer's place */
  readonly accountForLoss?: boolean;
  /**
   * what to balance instead of forward FLOPs: each piece's seconds on the hardware profile
   * (compiler/schedule/priced.ts), pre already holding what runs before layer 0 on stage 0
   */
  readonly weights?: {
    readonly layer: readonly number[];
    readonly pre: number;
    readonly post: number;
  };
}

export interface PipelineLayout {
  readonly pp: number;
  readonly vpp: number;
  readonly encoderOnStage0: boolean;
  /**
   * 'balanced': chosen by forward FLOPs; 'priced': by seconds on a hardware profile; 'given':
   * Megatron's split from the first/last-stage overrides or with the embedding or loss counted
   */
  readonly method: 'balanced' | 'priced' | 'given';
  /** layers of virtual stage s = c·pp + r, s = 0 … pp·vpp − 1 (in layer order) */
  readonly virtualStageLayers: readonly number[];
  /** first decoder layer of each virtual stage */
  readonly virtualStageFirstLayer: readonly number[];
  /** forward FLOPs of each virtual stage, pre and post pieces included */
  readonly virtualStageFlops: readonly number[];
  /** the most expensive virtual stage */
  readonly maxVirtualStageFlops: number;
}

/** a ≤ b up to floating-point rounding of sums of the same terms in another order */
const leq = (a: number, b: number) => a <= b + 1e-9 * Math.max(Math.abs(a), Math.abs(b));
const less = (a: number, b: number) => !leq(b, a);

/**
 * The exact min-max split of `weights` into `parts` contiguous non-empty parts, where part 0 also
 * costs `pre` and the last part `post`. Among the optimal splits it takes the one with the least
 * sum of squared part costs (the most even), ties going to the split whose later parts are larger.
 * Returns the number of weights in each part.
 *
 * Dynamic programme, O(parts · L²): pass 1 finds the optimal maximum X; pass 2 minimises the sum
 * of squares over splits whose every part costs ≤ X.
 */
export function splitMinMax(
  weights: readonly number[],
  parts: number,
  pre = 0,
  post = 0,
): number[] {
  const L = weights.length;
  if (!Number.isInteger(parts) || parts < 1 || parts > L)
    throw new Error(`splitMinMax: ${L} weights cannot fill ${parts} non-empty parts`);
  const prefix = [0];
  for (const w of weights) prefix.push(prefix[prefix.length - 1] + w);
  /** cost of part k holding weights i … j−1 */
  const cost = (k: number, i: number, j: number) =>
    prefix[j] - prefix[i] + (k === 0 ? pre : 0) + (k === parts - 1 ? post : 0);

  // pass 1: best[k][j] = least possible maximum over parts 0 … k−1 holding weights 0 … j−1
  const best = Array.from({ length: parts + 1 }, () => new Array<number>(L + 1).fill(Infinity));
  best[0][0] = 0;
  for (let k = 1; k <= parts; k++) {
    for (let j = k; j <= L - (parts - k); j++) {
      for (let i = k - 1; i < j; i++) {
        const x = Math.max(best[k - 1][i], cost(k - 1, i, j));
        if (x < best[k][j]) best[k][j] = x;
      }
    }
  }
  const cap = best[parts][L];

  // pass 2: even[k][j] = least sum of squares under the cap; from[k][j] = start of part k−1
  const even = Array.from({ length: parts + 1 }, () => new Array<number>(L + 1).fill(Infinity));
  const from = Array.from({ length: parts + 1 }, () => new Array<number>(L + 1).fill(-1));
  even[0][0] = 0;
  for (let k = 1; k <= parts; k++) {
    for (let j = k; j <= L - (parts - k); j++) {
      for (let i = k - 1; i < j; i++) {
        const c = cost(k - 1, i, j);
        if (even[k - 1][i] === Infinity || !leq(c, cap)) continue;
        const x = even[k - 1][i] + c * c;
        if (from[k][j] < 0 || less(x, even[k][j])) {
          even[k][j] = x;
          from[k][j] = i;
        }
      }
    }
  }
  const counts: number[] = [];
  for (let k = parts, j = L; k > 0; k--) {
    const i = from[k][j];
    counts.unshift(j - i);
    j = i;
  }
  return counts;
}

const isPosInt = (n: number) => Number.isInteger(n) && n > 0;

/**
 * Megatron's split under --decoder-first/last-pipeline-num-layers: the stages given keep their
 * count, the other stages share the rest evenly, and each stage's count splits evenly over its
 * chunks. Returns layers per virtual stage.
 */
function givenSplit(L: number, p: number, v: number, first?: number, last?: number): number[] {
  const flag = (f: string, n: number) => `--decoder-${f}-pipeline-num-layers ${n}`;
  const fail = (msg: string): never => {
    throw new UserError(`invalid layout (pp-uneven-layers): ${msg}`);
  };
  for (const [f, n] of [
    ['first', first],
    ['last', last],
  ] as const) {
    if (n === undefined) continue;
    if (p === 1) fail(`${flag(f, n)} needs pipeline parallelism (pipeline size is 1)`);
    if (!isPosInt(n)) fail(`${flag(f, n)} must be a positive integer`);
    if (n % v !== 0) fail(`${flag(f, n)} is not a multiple of ${v} chunks per stage`);
  }
  const middleStages = p - (first === undefined ? 0 : 1) - (last === undefined ? 0 : 1);
  const middleLayers = L - (first ?? 0) - (last ?? 0);
  if (middleStages === 0 && middleLayers !== 0)
    fail(`first ${first} and last ${last} stage layers do not add up to the ${L} decoder layers`);
  if (middleStages > 0 && (middleLayers < middleStages * v || middleLayers % middleStages !== 0))
    fail(
      `the ${middleLayers} layers left for ${middleStages} middle stages do not split evenly with at least one per chunk`,
    );
  const perMiddle = middleStages > 0 ? middleLayers / middleStages : 0;
  if (perMiddle % v !== 0)
    fail(`each middle stage gets ${perMiddle} layers, not a multiple of ${v} chunks per stage`);
  const stageLayers = Array.from({ length: p }, (_, r) =>
    r === 0 && first !== undefined ? first : r === p - 1 && last !== undefined ? last : perMiddle,
  );
  return Array.from({ length: p * v }, (_, s) => stageLayers[s % p] / v);
}

/**
 * Megatron's split where the embedding (`e`) and the loss (`l`) each count as a layer: the L + e
 * + l pieces split evenly over the K virtual stages, the first giving one place to the embedding
 * and the last one to the loss. Returns layers per virtual stage.
 */
function accountedSplit(L: number, K: number, e: boolean, l: boolean): number[] {
  const pieces = L + (e ? 1 : 0) + (l ? 1 : 0);
  if (pieces % K !== 0)
    throw new UserError(
      `invalid layout (pp-account-for): ${L} decoder layers${e ? ' + the embedding' : ''}${l ? ' + the loss' : ''} = ${pieces} pieces do not split evenly over pp·vpp = ${K} virtual stages`,
    );
  const each = pieces / K;
  return Array.from(
    { length: K },
    (_, s) => each - (e && s === 0 ? 1 : 0) - (l && s === K - 1 ? 1 : 0),
  );
}

/** Splits the decoder layers over the virtual stages; see the file comment. */
export function partitionPipeline(costs: ForwardCosts, opts: PartitionOptions): PipelineLayout {
  const p = opts.pp;
  const v = opts.vpp ?? 1;
  const encoderOnStage0 = opts.encoderOnStage0 ?? true;
  if (!isPosInt(p) || !isPosInt(v))
    throw new UserError(
      `invalid layout (sizes-positive): pipeline size ${p} and chunks per stage ${v} must be positive integers`,
    );
  const L = costs.layerFlops.length;
  const K = p * v;
  const accounted = (opts.accountForEmbedding ?? false) || (opts.accountForLoss ?? false);
  if (L < K && !accounted)
    throw new UserError(
      `invalid layout (pp-layers): ${L} decoder layers cannot fill pp·vpp = ${K} virtual stages (pipeline ${p} × virtual ${v}); each needs at least one layer`,
    );
  const pre = preFlops(costs, encoderOnStage0);
  const post = costs.postFlops;
  const fixed = opts.firstStageLayers !== undefined || opts.lastStageLayers !== undefined;
  if (fixed && accounted)
    throw new UserError(
      'invalid layout (pp-account-for): --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split split the layers evenly; they do not combine with --decoder-first-pipeline-num-layers or --decoder-last-pipeline-num-layers',
    );
  const given = fixed || accounted;
  const w = opts.weights;
  if (w && w.layer.length !== L)
    throw new Error(`partitionPipeline: ${w.layer.length} layer weights for ${L} layers`);
  const virtualStageLayers = accounted
    ? accountedSplit(L, K, opts.accountForEmbedding ?? false, opts.accountForLoss ?? false)
    : fixed
      ? givenSplit(L, p, v, opts.firstStageLayers, opts.lastStageLayers)
      : w
        ? splitMinMax(w.layer, K, w.pre, w.post)
        : splitMinMax(costs.layerFlops, K, pre, post);

  const virtualStageFirstLayer: number[] = [];
  const virtualStageFlops: number[] = [];
  let layer = 0;
  for (let s = 0; s < K; s++) {
    virtualStageFirstLayer.push(layer);
    let flops = (s === 0 ? pre : 0) + (s === K - 1 ? post : 0);
    for (let i = 0; i < virtualStageLayers[s]; i++) flops += costs.layerFlops[layer++];
    virtualStageFlops.push(flops);
  }
  if (layer !== L) throw new Error(`partitionPipeline: placed ${layer} of ${L} layers`);
  return {
    pp: p,
    vpp: v,
    encoderOnStage0,
    method: given ? 'given' : w ? 'priced' : 'balanced',
    virtualStageLayers,
    virtualStageFirstLayer,
    virtualStageFlops,
    maxVirtualStageFlops: Math.max(...virtualStageFlops),
  };
}

function formatFlops(flops: number): string {
  const units = ['', 'K', 'M', 'G', 'T', 'P', 'E'];
  let i = 0;
  while (Math.abs(flops) >= 1000 && i < units.length - 1) {
    flops /= 1000;
    i++;
  }
  return `${flops.toFixed(flops < 10 ? 2 : flops < 100 ? 1 : 0)} ${units[i]}FLOP`;
}

/**
 * One line per pipeline stage, e.g.
 * `stage 0: chunk 0 layers 0–5 (+embedding, encoder), chunk 1 layers 24–29; forward 1.23 TFLOP`.
 * Chunks are named only when vpp > 1.
 */
export function describeLayout(layout: PipelineLayout): string[] {
  const { pp: p, vpp: v } = layout;
  const K = p * v;
  const lines: string[] = [];
  for (let r = 0; r < p; r++) {
    const chunks: string[] = [];
    let flops = 0;
    for (let c = 0; c < v; c++) {
      const s = c * p + r;
      const a = layout.virtualStageFirstLayer[s];
      const n = layout.virtualStageLayers[s];
      const extras = [
        ...(s === 0 ? ['embedding', ...(layout.encoderOnStage0 ? ['encoder'] : [])] : []),
        ...(s === K - 1 ? ['lm_head', 'loss'] : []),
      ];
      chunks.push(
        `${v > 1 ? `chunk ${c} ` : ''}${layerRange(a, n)}` +
          (extras.length ? ` (+${extras.join(', ')})` : ''),
      );
      flops += layout.virtualStageFlops[s];
    }
    lines.push(`stage ${r}: ${chunks.join(', ')}; forward ${formatFlops(flops)}`);
  }
  return lines;
}

/** `layer 3`, `layers 3–5`, or `no layer` (a virtual stage the embedding or loss fills) */
export function layerRange(first: number, n: number): string {
  return n === 0 ? 'no layer' : n === 1 ? `layer ${first}` : `layers ${first}–${first + n - 1}`;
}
