// The layouts `lfc tune` searches: one point of the space is a Layout, and its `lfc compile` flags
// (flagsOf) are what the tuner prices and prints, so a printed line compiles to the figures shown.
//
//   tp            powers of two up to the node's GPUs (tensor parallelism stays inside a node);
//                 sequence parallelism with it, as Megatron-LM requires for MoE with tp > 1
//   pp, vpp       pipeline stages dividing the ranks left, up to 16; vpp 1, 2 or 4 with pp > 1
//   ep            powers of two dividing the experts (MoE decoders)
//   expert tp     powers of two up to tp; below tp only with ep > 1 (the layout rules)
//   mbs           1, 2 or 4
//   encoder       level 1 with an encoder TP dividing tp, level 2 or level 3 (encoder TP 1)
//   overlap       the A2A overlap with delayed weight gradients (ep > 1)
//   recompute     none, selective (the overlap's own modules under it) or full
//   offload       the fine-grained activation offload (level 3 with the overlap, as LoongForge
//                 builds it)
//   distopt       the distributed optimizer (dp > 1)
//
// The layout rules (compiler/parallel/validate.ts) refuse what does not combine; enumerate keeps
// only what the cheap size checks allow and leaves the rest to them. --fix pins a knob, --exclude
// turns a feature off.

import { UserError } from '../errors.js';
import type { ModelConfig } from '../frontend/config.js';
import type { CompileOptions } from '../pipeline.js';

export interface Layout {
  readonly tp: number;
  readonly pp: number;
  readonly vpp: number;
  readonly ep: number;
  /** expert TP (--expert-tensor-parallel-size): tp, or a power of two below it */
  readonly etp: number;
  readonly mbs: number;
  /** 1: hetero TP (encoder TP encoderTp), 2: hetero DP, 3: full separation */
  readonly level: 1 | 2 | 3;
  readonly encoderTp: number;
  readonly overlap: boolean;
  readonly recompute: 'none' | 'selective' | 'full';
  readonly offload: boolean;
  readonly distopt: boolean;
}

/** What the search is for: the cluster and the batch every layout must train. */
export interface SearchSpaceRequest {
  readonly config: ModelConfig;
  readonly nnodes: number;
  readonly nprocPerNode: number;
  readonly globalBatchSize: number;
  readonly fix?: Readonly<Partial<Record<Knob, string>>>;
  readonly exclude?: readonly Feature[];
}

export const KNOBS = [
  'tp',
  'pp',
  'vpp',
  'ep',
  'expert-tp',
  'mbs',
  'level',
  'encoder-tp',
  'overlap',
  'recompute',
  'offload',
  'distopt',
] as const;
export type Knob = (typeof KNOBS)[number];

/** --exclude: the features a search can leave out, and the knob each pins */
export const FEATURES = {
  pipeline: ['pp', '1'],
  vpp: ['vpp', '1'],
  'expert-parallel': ['ep', '1'],
  'hetero-dp': ['level', '1,3'],
  'full-hetero-dp': ['level', '1,2'],
  'a2a-overlap': ['overlap', 'off'],
  recompute: ['recompute', 'none'],
  offload: ['offload', 'off'],
  'distributed-optimizer': ['distopt', 'off'],
} as const satisfies Record<string, readonly [Knob, string]>;
export type Feature = keyof typeof FEATURES;

const SELECTIVE = ['core_attn', 'mlp', 'moe_act'];
const SELECTIVE_OVERLAP = ['a2a_overlap_attn', 'a2a_overlap_post_attn', 'a2a_overlap_mlp'];
const OFFLOAD = ['dispatched_input', 'pre_mlp_layernorm_output'];

/**
 * A layout's `lfc compile` flags (beside the request's model, cluster and batch flags); the
 * encoder's TP as an override when it differs from the preset's `presetEncoderTp`.
 */
export function flagsOf(l: Layout, presetEncoderTp: number): string[] {
  const f = ['--tp', String(l.tp), '--pp', String(l.pp)];
  if (l.vpp > 1) f.push('--vpp', String(l.vpp));
  if (l.ep > 1) f.push('--ep', String(l.ep));
  if (l.etp !== l.tp) f.push('--expert-tensor-parallel-size', String(l.etp));
  if (l.tp > 1) f.push('--sequence-parallel');
  f.push('--micro-batch-size', String(l.mbs));
  if (l.distopt) f.push('--use-distributed-optimizer');
  if (l.level === 2) f.push('--enable-encoder-hetero-dp');
  if (l.level === 3) f.push('--enable-full-hetero-dp');
  if (l.overlap) f.push('--overlap-moe-expert-parallel-comm', '--delay-wgrad-compute');
  if (l.recompute === 'full') f.push('--recompute-granularity', 'full');
  if (l.recompute === 'selective')
    f.push(
      '--recompute-granularity',
      'selective',
      '--recompute-modules',
      ...(l.overlap ? SELECTIVE_OVERLAP : SELECTIVE),
    );
  if (l.offload) f.push('--fine-grained-activation-offloading', '--offload-tensors', ...OFFLOAD);
  // an override last: the list flags above take every argument up to the next flag
  if (l.encoderTp !== presetEncoderTp)
    f.push(`model.image_encoder.tensor_model_parallel_size=${l.encoderTp}`);
  return f;
}

/**
 * A layout's compile options: `base` (the request's flags, parsed) with the layout's flags
 * (flagsOf) applied as `lfc compile` parses them, without the parse. The search builds thousands;
 * test/tune/space.test.ts holds it equal to the parse of base + flagsOf for every layout of a
 * space that has every knob.
 */
export function layoutOptions(
  base: CompileOptions,
  l: Layout,
  presetEncoderTp: number,
): CompileOptions {
  const recompute =
    l.recompute === 'full'
      ? { granularity: 'full' as const }
      : l.recompute === 'selective'
        ? {
            granularity: 'selective' as const,
            modules: [...(l.overlap ? SELECTIVE_OVERLAP : SELECTIVE)],
          }
        : undefined;
  return {
    ...base,
    overrides: [
      ...(base.overrides ?? []),
      ...(l.encoderTp !== presetEncoderTp
        ? [`model.image_encoder.tensor_model_parallel_size=${l.encoderTp}`]
        : []),
    ],
    microBatchSize: l.mbs,
    parallel: {
      ...base.parallel,
      tp: l.tp,
      pp: l.pp,
      ...(l.vpp > 1 ? { vpp: l.vpp } : {}),
      ...(l.ep > 1 ? { ep: l.ep } : {}),
      ...(l.etp !== l.tp ? { etp: l.etp } : {}),
    },
    ...(l.tp > 1 ? { sequenceParallel: true } : {}),
    ...(l.distopt ? { distributedOptimizer: true } : {}),
    ...(l.level === 2 ? { encoder: { heteroDp: true } } : {}),
    ...(l.level === 3 ? { encoder: { fullHeteroDp: true } } : {}),
    ...(l.overlap ? { moeOverlap: { overlap: true, delayWgrad: true } } : {}),
    ...(recompute ? { recompute } : {}),
    ...(l.offload ? { offloadTensors: [...OFFLOAD] } : {}),
  };
}

/** A short name of a layout: `tp4 pp2 vpp2 ep4 etp1 mbs1 L3 overlap sel offload distopt`. */
export function layoutName(l: Layout): string {
  return [
    `tp${l.tp}`,
    `pp${l.pp}`,
    ...(l.vpp > 1 ? [`vpp${l.vpp}`] : []),
    ...(l.ep > 1 ? [`ep${l.ep}`] : []),
    ...(l.etp !== l.tp ? [`etp${l.etp}`] : []),
    `mbs${l.mbs}`,
    l.level === 1 ? `L1/enc-tp${l.encoderTp}` : `L${l.level}`,
    ...(l.overlap ? ['overlap'] : []),
    ...(l.recompute === 'none' ? [] : [l.recompute === 'full' ? 'full-recompute' : 'selective']),
    ...(l.offload ? ['offload'] : []),
    ...(l.distopt ? ['distopt'] : []),
  ].join(' ');
}

const pow2Upto = (n: number) => {
  const out: number[] = [];
  for (let k = 1; k <= n; k *= 2) out.push(k);
  return out;
};
const divisorsUpto = (n: number, max: number) =>
  Array.from({ length: Math.min(n, max) }, (_, i) => i + 1).filter((d) => n % d === 0);

/** The values --fix gives a knob: `tp=4`, `level=1,3`, `overlap=on`. */
function allowed(knob: Knob, fix: SearchSpaceRequest['fix'], exclude: readonly Feature[]) {
  const sets: string[][] = [];
  const given = fix?.[knob];
  if (given !== undefined) sets.push(given.split(','));
  for (const f of exclude) {
    const [k, v] = FEATURES[f];
    if (k === knob) sets.push(v.split(','));
  }
  return (value: string | number | boolean): boolean => {
    const text = typeof value === 'boolean' ? (value ? 'on' : 'off') : String(value);
    return sets.every((s) => s.includes(text));
  };
}

/** Parses `--fix tp=4,pp=2` (or repeated) into knob → values; `level=1|3` lists values. */
export function parseFix(specs: readonly string[]): Partial<Record<Knob, string>> {
  const out: Partial<Record<Knob, string>> = {};
  for (const spec of specs)
    for (const part of spec.split(/,(?=[a-z-]+=)/)) {
      const m = /^([a-z-]+)=(.+)$/.exec(part.trim());
      if (!m)
        throw new UserError(`--fix ${spec}: expected knob=value (knobs: ${KNOBS.join(', ')})`);
      const knob = m[1] as Knob;
      if (!KNOBS.includes(knob))
        throw new UserError(`--fix ${spec}: no knob ${m[1]} (knobs: ${KNOBS.join(', ')})`);
      const values = m[2].split('|');
      const ok: Record<Knob, RegExp> = {
        tp: /^\d+$/,
        pp: /^\d+$/,
        vpp: /^\d+$/,
        ep: /^\d+$/,
        'expert-tp': /^\d+$/,
        mbs: /^\d+$/,
        level: /^[123]$/,
        'encoder-tp': /^\d+$/,
        overlap: /^(on|off)$/,
        recompute: /^(none|selective|full)$/,
        offload: /^(on|off)$/,
        distopt: /^(on|off)$/,
      };
      const bad = values.find((v) => !ok[knob].test(v));
      if (bad !== undefined) throw new UserError(`--fix ${spec}: ${bad} is not a value of ${knob}`);
      out[knob] = values.join(',');
    }
  return out;
}

export function parseExclude(names: readonly string[]): Feature[] {
  const known = Object.keys(FEATURES);
  for (const n of names)
    if (!known.includes(n))
      throw new UserError(`--exclude ${n}: no such feature (features: ${known.join(', ')})`);
  return names as Feature[];
}

/** Every layout of the space the fixes and exclusions leave, in a fixed order. */
export function enumerateLayouts(r: SearchSpaceRequest): Layout[] {
  const exclude = r.exclude ?? [];
  const ok = (k: Knob) => allowed(k, r.fix, exclude);
  const world = r.nnodes * r.nprocPerNode;
  const dec = r.config.model.text_decoder;
  const moe = dec.num_experts > 0;
  const out: Layout[] = [];
  for (const tp of pow2Upto(Math.min(r.nprocPerNode, 8)).filter(ok('tp')))
    for (const pp of divisorsUpto(world / tp, Math.min(16, dec.num_layers)).filter(ok('pp')))
      for (const vpp of (pp > 1 ? [1, 2, 4] : [1]).filter(ok('vpp')))
        for (const ep of (moe ? pow2Upto(dec.num_experts) : [1]).filter(ok('ep'))) {
          if (world % (tp * ep * pp) !== 0 || world % (tp * pp) !== 0) continue;
          const dp = world / (tp * pp);
          for (const etp of (moe && ep > 1 ? pow2Upto(tp) : [tp]).filter(ok('expert-tp')))
            for (const mbs of [1, 2, 4].filter(ok('mbs'))) {
              if (r.globalBatchSize % (mbs * dp) !== 0) continue;
              const m = r.globalBatchSize / (mbs * dp);
              if (vpp > 1 && m % pp !== 0) continue;
              for (const [level, encoderTp] of encoderChoices(tp))
                if (ok('level')(level) && ok('encoder-tp')(encoderTp))
                  for (const overlap of (moe && ep > 1 ? [false, true] : [false]).filter(
                    ok('overlap'),
                  )) {
                    if (overlap && pp > 1 && vpp === 1) continue;
                    for (const recompute of (['none', 'selective', 'full'] as const).filter(
                      ok('recompute'),
                    )) {
                      if (overlap && recompute === 'full') continue;
                      for (const offload of (level === 3 && overlap
                        ? [false, true]
                        : [false]
                      ).filter(ok('offload')))
                        for (const distopt of (dp > 1 ? [true, false] : [false]).filter(
                          ok('distopt'),
                        ))
                          out.push({
                            tp,
                            pp,
                            vpp,
                            ep,
                            etp,
                            mbs,
                            level,
                            encoderTp,
                            overlap,
                            recompute,
                            offload,
                            distopt,
                          });
                    }
                  }
            }
        }
  return out;
}

/** level 1 at each encoder TP dividing tp, level 2 (tp > 1: else it is level 1), level 3 */
function encoderChoices(tp: number): [1 | 2 | 3, number][] {
  return [
    ...pow2Upto(tp).map((e): [1, number] => [1, e]),
    ...(tp > 1 ? [[2, 1] as [2, number]] : []),
    [3, 1],
  ];
}
