// bench/mfu: lfc's model FLOPs utilization on this machine, and its step time against PyTorch's,
// for a model in the shape of tiny-vlm-moe at real widths (issue 20, acceptance 1).
//
//   npx tsx bench/mfu.ts [--steps 3] [--warmup 1] [--threads 2]
//
// The model: configs/models/vlm-moe-150m.yaml, 193,564,800 parameters (80,318,592 active per
// token), f32, 1 rank, 2 threads:
//   image_encoder  vit_384: 12 blocks × 384, 6 heads of 64, GELU (tanh) MLP 1536, LayerNorm,
//                  biases, learned row/column positions; patch 14, merge 2      21,532,032
//   image_projector patch_merger: LayerNorm, 1536 → 1536 → 512                   3,148,544
//   text_decoder   moe_512: 12 layers × 512, 8 query heads / 4 KV groups of 64, QK RMSNorm,
//                  every layer MoE, 8 experts of SwiGLU FFN 1024, top-2, aux loss
//                  0.001; vocabulary 8192, untied                              168,884,224
// The batch: 4 microbatches of 1024 tokens, each 4 samples of one 224×224 image (16×16
// patches, 64 merged visual tokens) and 192 text tokens, no padding: 16 images, 4096 patches and
// 4096 tokens (1024 of them visual) per step, one seeded batch replayed every step.
//
// The FLOP convention is the project's (docs/design.md, compiler/inspect.ts): matmul FLOPs only,
// training = 3 × forward, causal attention at half, bidirectional attention over each image. Per
// step: the decoder's FLOPs per token at sequence 1024 × 4096 tokens + the encoder and
// projector's FLOPs per 224×224 image × 16 images, 2.02 TFLOP. MFU = those FLOPs / step time /
// the peak, where the peak is this machine's best cblas_sgemm rate at 2048³ and 3072³ on the same
// threads and the same OpenBLAS kernels (runtime/blas.ts picks them, native.blasCore names them),
// measured in this run before, between and after the two models' steps (the best of them).
//
// PyTorch: bench/step_torch.py --config (the tiny-vlm-moe model of test/reference/tiny_vlm.py at
// these sizes, written as a user would), on lfc's initial weights and the same batch (lfc's
// --dump-step files of its first step), the same thread count and OPENBLAS_CORETYPE. Printed:
// both medians, the ratio lfc / PyTorch (target ≤ 0.7), both MFUs (target ≥ 50% for lfc), and lfc's
// time per op kind over the timed steps (the runtime's per-instruction timestamps).

import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { compile, writePlan } from '../compiler/pipeline.js';
import { projectRoot } from '../compiler/paths.js';
import { loadModelConfig } from '../compiler/frontend/config.js';
import { buildForwardGraph } from '../compiler/frontend/build.js';
import { inspectModel } from '../compiler/inspect.js';
import { writeBatchFile, type Microbatch } from '../runtime/batch.js';
import { chooseOpenblasKernel } from '../runtime/blas.js';
import { loadNative } from '../runtime/native.js';
import { readPlan } from '../runtime/plan-io.js';
import { train } from '../runtime/train.js';
import { benchDir } from './temp-dir.js';
import { setupOrExit } from '../scripts/setup.mjs';

// the Debian packages and the native runtime this bench needs (scripts/setup.mjs)
setupOrExit('bench step');

function arg(name: string, def: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
}
const steps = arg('steps', 3);
const warmup = arg('warmup', 1);
const threads = arg('threads', 2);
const median = (xs: readonly number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const MODEL = 'vlm-moe-150m';
const MICROBATCHES = 4;
const SAMPLES_PER_MICROBATCH = 4;
const IMAGE_SIDE = 224;
const TEXT_TOKENS = 192;
const PLACEHOLDER = 1; // the model's image_token_id (tiny-vlm.md): 0 pads, 1 marks a visual token

// ---- the peak: cblas_sgemm with the kernels lfc chose ----------------------------------------

const blas = chooseOpenblasKernel(); // before the addon (and OpenBLAS) loads
const native = loadNative();
const PEAK_SIZES = [2048, 3072];
const PEAK_REPS = 3;
const peakGflopsRuns: number[] = [];
const peakCpuGflopsRuns: number[] = [];
/** The best wall-clock rate of the sizes, and beside it the rate per `threads` CPU-seconds of the
 * process over all its calls (the shared machine's other jobs take cores, not CPU time). */
function measurePeak(): number {
  let best = 0;
  for (const n of PEAK_SIZES) {
    const cpu0 = process.cpuUsage();
    best = Math.max(best, native.sgemmGflops(n, threads, PEAK_REPS));
    const cpu = process.cpuUsage(cpu0);
    const cpuS = (cpu.user + cpu.system) / 1e6;
    peakCpuGflopsRuns.push(((PEAK_REPS + 1) * 2 * n ** 3) / (cpuS / threads) / 1e9);
  }
  peakGflopsRuns.push(best);
  return best;
}

// ---- the model's FLOPs per step, by the project's convention -------------------------------

const cfg = loadModelConfig(MODEL);
const S = cfg.training.seq_length;
const enc = cfg.model.image_encoder;
const visualPerImage = (IMAGE_SIDE / enc.patch_size / enc.spatial_merge_size) ** 2;
if (SAMPLES_PER_MICROBATCH * (visualPerImage + TEXT_TOKENS) !== S)
  throw new Error(`bench/mfu: the samples do not fill the sequence of ${S}`);
const report = inspectModel(buildForwardGraph(cfg), cfg, {
  seqLength: S,
  imageHeight: IMAGE_SIDE,
  imageWidth: IMAGE_SIDE,
});
const images = MICROBATCHES * SAMPLES_PER_MICROBATCH;
const stepFlops = report.flops.perTextToken * S * MICROBATCHES + report.flops.perImage * images;

// ---- the batch: 4 × 4 samples of one 224×224 image and 192 text tokens -----------------------

/** xorshift32 in [0, 1), seeded: the batch is the same in every run */
function rng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 2 ** 32;
  };
}

function benchBatch(): Microbatch[] {
  const rand = rng(20);
  const vocab = cfg.model.text_decoder.vocab_size;
  return Array.from({ length: MICROBATCHES }, () => {
    const tokens = new Int32Array(S);
    const labels = new Int32Array(S);
    const lossMask = new Uint8Array(S);
    const positions = new Int32Array(S);
    const segments = new Int32Array(S);
    const imgs = [];
    let at = 0;
    for (let sample = 0; sample < SAMPLES_PER_MICROBATCH; sample++) {
      const toks = [
        ...Array<number>(visualPerImage).fill(PLACEHOLDER),
        ...Array.from({ length: TEXT_TOKENS }, () => 2 + Math.floor(rand() * (vocab - 2))),
      ];
      toks.forEach((t, i) => {
        const next = i + 1 < toks.length ? toks[i + 1] : 0;
        tokens[at] = t;
        labels[at] = next > PLACEHOLDER ? next : 0;
        lossMask[at] = next > PLACEHOLDER ? 1 : 0;
        positions[at] = i;
        segments[at] = sample;
        at++;
      });
      const pixels = new Float32Array(3 * IMAGE_SIDE * IMAGE_SIDE);
      for (let i = 0; i < pixels.length; i++) pixels[i] = 2 * rand() - 1;
      imgs.push({ height: IMAGE_SIDE, width: IMAGE_SIDE, pixels });
    }
    return { tokens, labels, lossMask, positions, segments, images: imgs };
  });
}

// ---- run -------------------------------------------------------------------------------------

const dir = benchDir('lfc-bench-mfu-');
const { plan, programs } = compile({ model: MODEL, globalBatchSize: MICROBATCHES });
writePlan(join(dir, 'plan'), plan, programs);
const program = readPlan(join(dir, 'plan')).programs.get('p0')!;
writeBatchFile(join(dir, 'batch.safetensors'), benchBatch());

const peakBefore = measurePeak();

// lfc: the first step (a warm-up step) dumps the initial weights and the batch for PyTorch
const perOp = new Map<string, number[]>();
const lfcCpuMs: number[] = []; // CPU time of this process from one step's end to the next's
let cpuAt = process.cpuUsage();
const lfc = await train({
  planDir: join(dir, 'plan'),
  trainIters: warmup + steps,
  batch: join(dir, 'batch.safetensors'),
  dumpStep: join(dir, 'dump'),
  threads,
  onStep: (m) => {
    const cpu = process.cpuUsage(cpuAt);
    cpuAt = process.cpuUsage();
    if (m.step > warmup) lfcCpuMs.push((cpu.user + cpu.system) / 1e3);
  },
  onTiming: (step, perInstruction) => {
    if (step <= warmup || !perInstruction) return;
    const acc = new Map<string, number>();
    perInstruction.forEach((t, i) => {
      const op = program.instructions[i].op;
      acc.set(op, (acc.get(op) ?? 0) + (t.end - t.start));
    });
    for (const [op, ms] of acc) perOp.set(op, [...(perOp.get(op) ?? []), ms]);
  },
});
const lfcStepMs = lfc.steps.slice(warmup).map((s) => s.stepMs);
const lfcMs = median(lfcStepMs);

const peakBetween = measurePeak();

// PyTorch: the same model at the same sizes, weights, batch, threads and OpenBLAS kernels
const d = cfg.model.text_decoder;
const torchConfig = {
  name: MODEL,
  patch: enc.patch_size,
  merge: enc.spatial_merge_size,
  v_hidden: enc.hidden_size,
  v_heads: enc.num_attention_heads,
  v_ffn: enc.ffn_hidden_size,
  v_layers: enc.num_layers,
  max_side: enc.max_image_size,
  hidden: d.hidden_size,
  layers: d.num_layers,
  heads: d.num_attention_heads,
  kv_heads: d.num_query_groups,
  head_dim: d.kv_channels,
  experts: d.num_experts,
  top_k: d.moe_router_topk,
  expert_ffn: d.moe_ffn_hidden_size,
  aux_coef: d.moe_aux_loss_coeff,
  vocab: d.vocab_size,
  seq: S,
  rope_theta: d.rotary_base,
  eps: d.norm_epsilon,
};
writeFileSync(join(dir, 'torch-config.json'), JSON.stringify(torchConfig));
const torchOut = execFileSync(
  '/usr/bin/python3',
  [
    join(projectRoot(), 'bench/step_torch.py'),
    ...['--config', join(dir, 'torch-config.json')],
    ...['--weights', join(dir, 'dump/weights.safetensors')],
    ...['--batch', join(dir, 'dump/batch.safetensors')],
    ...['--steps', String(steps), '--warmup', String(warmup), '--threads', String(threads)],
  ],
  {
    encoding: 'utf8',
    // OPENBLAS_CORETYPE is lfc's choice, set in this process's environment above
    env: { ...process.env, OMP_NUM_THREADS: String(threads) },
    maxBuffer: 1 << 24,
  },
);
const torch = JSON.parse(torchOut.trim().split('\n').pop()!) as {
  median_ms: number;
  step_ms: number[];
  loss_first: number;
  median_cpu_ms: number;
  blas_threads: number | null;
};

const peakAfter = measurePeak();
const peakGflops = Math.max(...peakGflopsRuns);
const peakCpuGflops = Math.max(...peakCpuGflopsRuns);

// ---- report ----------------------------------------------------------------------------------

const mfu = (ms: number) => stepFlops / (ms / 1e3) / (peakGflops * 1e9);
/** MFU by CPU time: the step's FLOPs per `threads` CPU-seconds against the peak's */
const cpuMfu = (cpuMs: number) => stepFlops / (cpuMs / 1e3 / threads) / (peakCpuGflops * 1e9);
const lfcCpu = median(lfcCpuMs);
const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
const p = report.params.total;
console.log(
  `bench/mfu ${MODEL}: ${p.total.toLocaleString('en-US')} parameters (${p.activePerToken.toLocaleString('en-US')} active per token), f32, 1 rank, ${threads} threads`,
);
console.log(
  `  step: ${MICROBATCHES} microbatches × ${S} tokens, ${images} images ${IMAGE_SIDE}×${IMAGE_SIDE}; ` +
    `${(stepFlops / 1e12).toFixed(3)} TFLOP (matmul only, 3 × forward, causal attention at half)`,
);
console.log(
  `  peak: cblas_sgemm ${PEAK_SIZES.map((n) => `${n}³`).join('/')}, ${threads} threads, OpenBLAS core ${native.blasCore}` +
    ` (OPENBLAS_CORETYPE ${blas.coretype ?? 'unset'}, ${blas.source}): ` +
    `${peakGflops.toFixed(1)} GFLOP/s (before ${peakBefore.toFixed(1)}, between ${peakBetween.toFixed(1)}, after ${peakAfter.toFixed(1)})`,
);
console.log(
  `  lfc     median ${lfcMs.toFixed(0)} ms of ${steps} after ${warmup} warm-up (${lfcStepMs.map((x) => x.toFixed(0)).join(', ')})` +
    `   MFU ${pct(mfu(lfcMs))}   first loss ${lfc.steps[0].loss.toFixed(5)}`,
);
console.log(
  `  PyTorch median ${torch.median_ms.toFixed(0)} ms of ${steps} after ${warmup} warm-up (${torch.step_ms.map((x) => x.toFixed(0)).join(', ')})` +
    `   MFU ${pct(mfu(torch.median_ms))}   first loss ${torch.loss_first.toFixed(5)}   (OpenBLAS threads ${torch.blas_threads})`,
);
console.log(
  `  lfc / PyTorch ${(lfcMs / torch.median_ms).toFixed(2)} (target ≤ 0.7)   lfc MFU ${pct(mfu(lfcMs))} (target ≥ 50%)`,
);
console.log(
  `  by CPU time (the machine is shared: other jobs take cores, not this process's CPU time): peak ${peakCpuGflops.toFixed(1)} GFLOP/s per ${threads} CPU-s;` +
    ` lfc ${lfcCpu.toFixed(0)} CPU-ms/step, MFU ${pct(cpuMfu(lfcCpu))}; PyTorch ${torch.median_cpu_ms.toFixed(0)} CPU-ms/step, MFU ${pct(cpuMfu(torch.median_cpu_ms))};` +
    ` lfc / PyTorch ${(lfcCpu / torch.median_cpu_ms).toFixed(2)}`,
);
const rows = [...perOp].map(([op, xs]) => [op, median(xs)] as const).sort((a, b) => b[1] - a[1]);
const opTotal = rows.reduce((a, [, ms]) => a + ms, 0);
console.log(
  `  lfc time per op kind, median ms per timed step (Σ ${opTotal.toFixed(0)} ms of instructions; the step ${lfcMs.toFixed(0)} ms):`,
);
for (const [op, ms] of rows.slice(0, 15))
  console.log(
    `    ${op.padEnd(28)} ${ms.toFixed(0).padStart(8)}  ${((100 * ms) / lfcMs).toFixed(1).padStart(5)}%`,
  );
