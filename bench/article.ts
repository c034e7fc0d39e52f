// bench/article: the LoongForge article's three throughput lines (issue 17, item 1) as lfc
// predicts them. The article gives Qwen3-VL at a 32k sequence on 4 nodes of A-series cards:
// about 800 tokens/s per GPU at hetero TP, 855 (+6.8%) at hetero DP and 900 (+12.5%) at full
// separation. The model, the GPU and the layout are this project's assumptions (README, "The
// article's lines"): Qwen3-VL-30B-A3B on a800, decoder tp 4, pp 2, ep 4 with the distributed
// optimizer, from the article's own examples. Each line is compiled as `lfc compile` would
// (without the verifier: the figures do not depend on it) and simulated on a800; the bench prints
// per level the step, tokens/s per GPU, the gain over level 1, and the targets: gains within
// ±3 points, tokens/s per GPU within ±20%. It does so under the article's data profile and two
// other documented ones, so a reader sees how much the match rests on the profile. Under each, the
// step each level saves: with one split for all three, level 2 → 3 saves at most a quarter of
// what level 1 → 2 saves, where the article's figures save 0.73 of it; and what level 2 → 3 would
// have to save for level 3's gain to reach the low edge of its target band (savedLine).
//
// Two splits of the decoder over the two stages are printed: the article's, Megatron's default
// of 24 + 24 layers, which the lines leave as it is (the article says so: "with the decoder split
// evenly, the first pipeline stage has more parameters and compute than the others", section 2),
// and lfc's own, balanced by each piece's priced seconds on a800 (compiler/schedule/priced.ts),
// what `lfc compile` of the lines gives.
//
// The lines as written do not fit an 80 GB card in lfc's plan, not even at the expected sizes, so
// the runs the article measured must have saved memory somehow; the article does not say how. The
// bench prints each line's largest program (expected and at the bounds) and, under the article
// profile and split, the lines again with each memory saving the article itself shows: full
// recompute (its encoder YAML, section 6.1) and its Qwen3-VL-30B-A3B example's selective
// recompute of the A2A-overlap modules with fine-grained offload (section 6.3). These are
// readings, not the targets: item 1 is judged on the lines as written.
//
//   npx tsx bench/article.ts [--profiles article,sft-multi-image,caption] [--splits even,lfc]
//                            [--no-savings]

import { parseCompileArgs } from '../cli/compile.js';
import { compile } from '../compiler/pipeline.js';
import { EFFICIENCY_FAMILIES, loadHardware, scaleEfficiency } from '../compiler/sim/hardware.js';
import { deviceMemoryOf, memoryByProgram } from '../compiler/report/memory.js';
import { forecastStep } from '../compiler/sim/report.js';

const SEQ = 32768;
const GLOBAL_BATCH = 64;
/** item 1's targets: each gain within ±3 points of the article's */
const GAIN_BAND = 0.03;
const BASE = [
  'qwen3-vl-30b-a3b',
  ...['--nnodes', '4', '--nproc-per-node', '8', '--tp', '4', '--pp', '2', '--ep', '4'],
  ...['--seq-length', String(SEQ), '--micro-batch-size', '1'],
  ...['--global-batch-size', String(GLOBAL_BATCH)],
  ...['--use-distributed-optimizer', '--bf16'],
  'model.image_encoder.tensor_model_parallel_size=1',
  ...['--hardware', 'a800'],
];
const SPLITS: Record<string, { name: string; flags: string[] }> = {
  even: {
    name: "the article's split: 24 + 24 decoder layers (Megatron's default)",
    flags: ['--decoder-first-pipeline-num-layers', '24'],
  },
  lfc: { name: "lfc's split: balanced by priced seconds on a800", flags: [] },
};
const LEVELS = [
  { name: 'hetero TP (level 1)', flags: [], article: 800 },
  { name: 'hetero DP (level 2)', flags: ['--enable-encoder-hetero-dp'], article: 855 },
  { name: 'full separation (level 3)', flags: ['--enable-full-hetero-dp'], article: 900 },
];
const GPUS = 32;

const arg = (name: string, def: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};

const hw = loadHardware('a800');
const device = deviceMemoryOf(hw);
const pct = (x: number) => `${x >= 0 ? '+' : ''}${(100 * x).toFixed(1)}%`;
const gib = (bytes: number) => (bytes / 2 ** 30).toFixed(1);

/** a line compiled as `lfc compile` would (no verifier) and simulated on a800: the step, tokens/s
 * per GPU and the largest program's device memory per rank, expected and at the bounds */
function predicted(options: ReturnType<typeof parseCompileArgs>['options']) {
  const r = compile({ ...options, skipVerify: true });
  const programs = new Map(r.programs.map((p) => [p.id, p]));
  const { forecast } = forecastStep(r.modelForwardFlops, r.plan, programs, hw);
  const memory = memoryByProgram(r, device);
  return {
    step: forecast.stepSeconds,
    perGpu: forecast.tokensPerSecond / GPUS,
    expected: Math.max(...memory.map((m) => m.expected.deviceBytes)),
    bound: Math.max(...memory.map((m) => m.bound.deviceBytes)),
  };
}
/**
 * What each level saves of the step, and the second saving over the first. With one split for
 * all three levels, level 2 → 3 saves at most a quarter of what level 1 → 2 saves (docs/
 * benchmarks.md, "Session 41"); the article's figures save 5.3 s then 3.8 s (0.73). The band of
 * item 1 is wider than that ratio: level 3's gain reaches its low edge (the article's +12.5% less
 * 3 points) when level 2 → 3 saves level 2's step less level 1's over 1.095, which the line
 * prints beside the saving made ("Session 42").
 */
function savedLine(steps: readonly number[], fixedSplit: boolean): string {
  const stepOf = (perGpu: number) => (GLOBAL_BATCH * SEQ) / (perGpu * GPUS);
  const [a1, a2, a3] = LEVELS.map((l) => stepOf(l.article));
  const first = steps[0] - steps[1];
  const second = steps[1] - steps[2];
  const lowEdge = LEVELS[2].article / LEVELS[0].article - 1 - GAIN_BAND;
  const needed = steps[1] - steps[0] / (1 + lowEdge);
  return (
    `step saved: level 1 → 2 ${first.toFixed(2)} s, level 2 → 3 ${second.toFixed(2)} s (${(second / first).toFixed(2)} of the first; ` +
    `the article's ${(a1 - a2).toFixed(1)} s, ${(a2 - a3).toFixed(1)} s, ${((a2 - a3) / (a1 - a2)).toFixed(2)}` +
    (fixedSplit ? '; with one split for all levels at most 0.25' : '; each level its own split') +
    ')' +
    (needed > 0
      ? `; level 3 at ${pct(lowEdge)} needs level 2 → 3 to save ${needed.toFixed(2)} s` +
        (fixedSplit ? ` (${(needed / (first / 4)).toFixed(2)} of that bound)` : '')
      : `; level 2's step already puts level 3 past ${pct(lowEdge)}`)
  );
}

for (const split of arg('splits', 'even,lfc').split(','))
  for (const profile of arg('profiles', 'article,sft-multi-image,caption').split(',')) {
    const { name: splitName, flags: splitFlags } = SPLITS[split];
    console.log(`data profile ${profile} (a800, 4 × 8 GPUs), ${splitName}`);
    console.log(
      '  level                         step s  tokens/s/GPU  article  ratio   gain     article gain  GiB expected / bound',
    );
    let base = 0;
    const steps: number[] = [];
    for (const level of LEVELS) {
      const t0 = performance.now();
      const { options } = parseCompileArgs([
        ...BASE,
        ...splitFlags,
        ...level.flags,
        ...['--data-profile', profile],
      ]);
      const x = predicted(options);
      steps.push(x.step);
      if (!base) base = x.perGpu;
      const gain = x.perGpu / base - 1;
      const articleGain = level.article / LEVELS[0].article - 1;
      console.log(
        `  ${level.name.padEnd(28)} ${x.step.toFixed(1).padStart(7)}  ${x.perGpu.toFixed(0).padStart(12)}  ${String(level.article).padStart(7)}  ${(x.perGpu / level.article).toFixed(2).padStart(5)}  ${pct(gain).padStart(6)}  ${pct(articleGain).padStart(6)}  ${gib(x.expected).padStart(8)} / ${gib(x.bound).padStart(5)}  (${((performance.now() - t0) / 1000).toFixed(0)} s)`,
      );
    }
    console.log(`  ${savedLine(steps, split === 'even')}`);
  }
// the lines with the memory savings the article shows (see the header), under its profile and
// split: what the runs it measured may have been
const SAVINGS = [
  {
    name: '--recompute-granularity full (its encoder YAML, section 6.1)',
    flags: ['--recompute-granularity', 'full'],
  },
  {
    name: 'selective recompute + offload (its 30B example, section 6.3)',
    flags: [
      ...['--recompute-granularity', 'selective', '--recompute-modules'],
      ...['a2a_overlap_attn', 'a2a_overlap_post_attn', 'a2a_overlap_mlp'],
      ...['--fine-grained-activation-offloading', '--offload-tensors'],
      ...['dispatched_input', 'pre_mlp_layernorm_output'],
    ],
  },
];
if (!process.argv.includes('--no-savings')) {
  console.log(
    `the lines with a memory saving the article shows (article profile, 24 + 24; a800: ${hw.memoryGiB} GiB, a plan fits with ${hw.memoryReserveGiB} GiB reserve): tokens/s/GPU (ratio to the article), gain, largest program's GiB expected / bound`,
  );
  for (const saving of SAVINGS) {
    let base = 0;
    const steps: number[] = [];
    const cells = LEVELS.map((level) => {
      const { options } = parseCompileArgs([
        ...BASE,
        ...SPLITS.even.flags,
        ...level.flags,
        ...saving.flags,
        ...['--data-profile', 'article'],
      ]);
      const x = predicted(options);
      steps.push(x.step);
      if (!base) base = x.perGpu;
      return `${x.perGpu.toFixed(0).padStart(5)} (${(x.perGpu / level.article).toFixed(2)})  ${pct(x.perGpu / base - 1).padStart(6)}  ${gib(x.expected).padStart(5)} / ${gib(x.bound).padStart(5)}`;
    });
    console.log(`  ${saving.name}`);
    LEVELS.forEach((level, k) => console.log(`    ${level.name.padEnd(28)} ${cells[k]}`));
    console.log(`    ${savedLine(steps, true)}`);
  }
}
// how much the figures rest on the profile's efficiencies: the article's base line (its split,
// the article data profile) re-simulated with one family moved ±20% at a time, the plan fixed
{
  const { options } = parseCompileArgs([
    ...BASE,
    ...SPLITS.even.flags,
    ...['--data-profile', 'article'],
  ]);
  const r = compile({ ...options, skipVerify: true });
  const programs = new Map(r.programs.map((p) => [p.id, p]));
  const perGpu = (h: typeof hw) =>
    forecastStep(r.modelForwardFlops, r.plan, programs, h).forecast.tokensPerSecond / GPUS;
  const at = perGpu(hw);
  console.log(
    `sensitivity of the base line (${at.toFixed(0)} tokens/s/GPU) to each efficiency family of a800, ×0.8 and ×1.2:`,
  );
  for (const family of EFFICIENCY_FAMILIES) {
    const [lo, hi] = [0.8, 1.2].map((f) => perGpu(scaleEfficiency(hw, family, f)));
    console.log(
      `  ${family.padEnd(12)} ${lo.toFixed(0).padStart(6)} (${pct(lo / at - 1).padStart(6)})  ${hi.toFixed(0).padStart(6)} (${pct(hi / at - 1).padStart(6)})`,
    );
  }
}
console.log(
  'targets (issue 17, item 1): tokens/s per GPU within ±20% (ratio 0.80–1.20) and gains within ±3 points of +6.8% and +12.5%, under the article profile',
);
