// bench/published: published training-throughput points (issue 17, item 2) as lfc predicts them.
// Each point is a measured step of another project's training run, with its model, layout and
// hardware stated by its source; lfc compiles the same layout (as `lfc compile` would, without the
// verifier: the figures do not depend on it) and simulates it on the profile of that hardware. The
// comparison is tokens/s per GPU (global batch × sequence / step / GPUs), never MFU: FLOP
// conventions differ between projects. The bench prints, per point, lfc's step and tokens/s per
// GPU, the published figure, their ratio and whether it is within ±15%, and how the busiest rank's
// simulated step divides (GEMMs, attention, other kernels, exposed communication, idle).
//
// Text-only decoders run on a text-only stand-in: the decoder of the published model on the
// smallest encoder (configs/models/llama*-text.yaml), under configs/data/text.yaml (packed text,
// no images), so the step is the decoder's. Pipeline splits are Megatron's default, the decoder's
// layers evenly over the stages (none of the runs sets a split).
//
// Attention is priced with the kernel each run used (--attention-kernel; the profile's figures for
// it, configs/hardware). FlagPerf's READMEs list "flash attention 2" among the runs'
// optimisations, and Megatron-Core 0.6 predates FlashAttention-3; Transformer Engine's later
// releases pick cuDNN's fused attention over FlashAttention on Hopper
// (transformer_engine/pytorch/attention/dot_product_attention/utils.py, "FusedAttention preference
// on Hopper+"), which NeMo AutoModel's Transformer Engine run (point 5) gets. The bench prints each
// point's ratio under every kernel its profile has, to show how much the match rests on that.
//
// The points, bf16 all, each with its primary source:
//
// 1. Llama 3 8B on 8 A800 SXM4 80GB (a800), Megatron-Core 0.6: tp 1, pp 2, dp 4, distributed
//    optimizer, sequence 8192, micro-batch 1, global batch 512, FlashAttention 2, no recompute:
//    3698.7 tokens/s per GPU. FlagPerf (BAAI), training/nvidia/llama3_8B-megatron/README.md, its
//    launch script training/benchmarks/llama3_8B/megatron/pretrain_llama3.sh,
//    https://github.com/FlagOpen/FlagPerf/tree/main/training/nvidia/llama3_8B-megatron
//    The script sets no --untie-embeddings-and-output-weights, so the run ties them (Megatron's
//    default), as the bench does; it keeps Megatron's default linear biases and learned absolute
//    positions, which lfc's decoder lacks (a few MFLOP a token, no GEMM).
// 2. Llama 3 8B on 8 H100 SXM5 80GB (h100), the same source and script: tp 2 (sequence
//    parallel), pp 1, dp 4: 8103 tokens/s per GPU.
// 3. Llama 3 70B on 64 H100 (h100), 8 nodes, 400 Gb/s InfiniBand, the same project:
//    tp 8 (sequence parallel), pp 4, dp 2, distributed optimizer, sequence 8192, micro-batch 1,
//    global batch 512: 851 tokens/s per GPU. FlagPerf,
//    https://github.com/FlagOpen/FlagPerf/tree/main/training/nvidia/llama3_70B-megatron
// 4. Llama 2 70B on 32 H800 SXM5 80GB (h800), FlagScale (BAAI's Megatron-LM, commit 6fc099c):
//    tp 4 (sequence parallel), pp 8, dp 1, distributed optimizer, sequence 4096, micro-batch 1,
//    global batch 44 (44 accumulation steps), untied embeddings, no biases, FlashAttention 2, bf16
//    ("amp" in the table; the launch script passes --bf16), no recompute: 791.37 tokens/s per GPU.
//    FlagPerf, https://github.com/FlagOpen/FlagPerf/tree/main/training/nvidia/llama2_70B-megatron
//    and training/benchmarks/llama2_70B/megatron/megatron_main.sh.
// 5. Qwen3-30B-A3B (MoE, 128 experts, top 8) on 8 H100 (h100), NeMo AutoModel (PyTorch FSDP2 with
//    expert parallelism, Transformer Engine, DeepEP): ep 8, FSDP over the 8 GPUs, tp 1, pp 1,
//    sequence 4096, micro-batch 4, global batch 512, activation checkpointing (every layer),
//    routing forced balanced (fake_balanced_gate): 21.773 s a step, 12,040 tokens/s per GPU.
//    NeMo AutoModel's performance summary, "Pre-Training Performance", DGX-H100 BF16,
//    https://github.com/NVIDIA-NeMo/Automodel/blob/main/docs/performance-summary.mdx (also
//    https://docs.nvidia.com/nemo/automodel/latest/performance-summary.html), recipe
//    examples/llm_benchmark/qwen/qwen3_moe_30b_te_deepep.yaml. lfc has no FSDP: the bench shards
//    the optimizer state (--use-distributed-optimizer) and keeps the weights whole, the same
//    compute and, per step, the same gradient and parameter traffic, without FSDP's weight
//    all-gathers before each micro-batch; lfc's expert exchange is NCCL's all-to-all, not DeepEP.
//    Qwen3-VL-30B-A3B's decoder is Qwen3-30B-A3B. (Inside one node lfc prices DeepEP as the
//    all-to-all: compiler/sim/cost.ts.)
// 6. Qwen3-235B-A22B (MoE, 128 experts, top 8, 94 layers) on 256 H100 (h100), 32 nodes, NVLink 4
//    and InfiniBand 8 × 50 GB/s a node, Megatron-Core (moe_dev f3e6c5), DeepEP, bf16, the
//    "cross-node EP strategy" row: tp 2 (sequence parallel), pp 8, vpp 4, ep 32, expert tp 1,
//    dp 16, sequence 4096, micro-batch 1, global batch 2048, selective recompute of the norms and
//    the MoE activation: 19.7 s a step, 1663 tokens/s per GPU. Megatron-MoE-ModelZoo,
//    best_practice/Qwen3/readme.md, "Performance Results",
//    https://github.com/yanring/Megatron-MoE-ModelZoo/blob/main/best_practice/Qwen3/readme.md
//    lfc prices DeepEP with its node deduplication (--moe-token-dispatcher-type flex). The table
//    states no optimizer sharding (the bench uses the distributed optimizer, as for the others)
//    and no pipeline split (94 layers do not divide into 32 virtual stages): lfc's own split, by
//    priced seconds. Attention as Transformer Engine picks it on Hopper (cuDNN).
// 7. The same model, source and cluster, the "intra-node EP strategy" row with DeepEP: tp 4
//    (sequence parallel), pp 8, vpp 4, ep 8, expert tp 1, dp 8, no recompute: 29.0 s a step,
//    1130 tokens/s per GPU. The expert exchange stays inside a node.
// 8. Point 6's row again with the "+1f1b overlap" note: the MoE all-to-all overlap of one
//    microbatch's forward with another's backward (lfc: --overlap-moe-expert-parallel-comm
//    --delay-wgrad-compute): 17.6 s a step, 1862 tokens/s per GPU.
// 9. The same model, source and cluster, the "Long Context" table's row at sequence 16384 (cp 1,
//    the one row without context parallelism, which lfc lacks): tp 4 (sequence parallel), pp 8,
//    vpp 4, ep 8, expert tp 1, global batch 256, DeepEP, selective recompute of the norms and the
//    whole MoE block (its command line), routing forced balanced
//    (--moe-router-force-load-balancing): 295 TFLOP/s per GPU, 1440 tokens/s per GPU over
//    Megatron's FLOP count (modelZooFlopsPerToken). The same run dropless: 237 TFLOP/s, 1157. lfc
//    prices balanced routing unless told the busiest expert rank's share
//    (--moe-expected-imbalance): the bench prints the share at which lfc's step is the dropless
//    run's. This is point 7's layout family (tp 4, ep 8, expert tp 1) at four times the sequence.
//
// `--sensitivity` re-simulates each point's plan with one efficiency family of its profile ×0.8
// at a time (compiler/sim/hardware.ts scaleEfficiency), to show which figures the ratio rests on.
// `--ablation` adds FlagPerf's other layouts of point 1 (the same README, "A100单机8卡 消融实验":
// the A800 machine of its header) and whether lfc ranks the seven in their measured order.
//
//   npx tsx bench/published.ts [--only 1,3] [--sensitivity] [--ablation]

import { spawnSync } from 'node:child_process';
import { getHeapStatistics } from 'node:v8';
import { EFFICIENCY_FAMILIES, loadHardware, scaleEfficiency } from '../compiler/sim/hardware.js';
import { predict } from './predict.js';

// Points 6-8 compile 256-rank plans of 8 programs (about 290k instructions each), one after
// another in this process: under node's default heap the third is refused (compiler/pipeline.ts,
// checkPlanFitsHeap). Run again with a heap of 8 GiB.
const HEAP_MIB = 8192;
if (getHeapStatistics().heap_size_limit < HEAP_MIB * 2 ** 20) {
  const options = `${process.env.NODE_OPTIONS ?? ''} --max-old-space-size=${HEAP_MIB}`.trim();
  const r = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)], {
    stdio: 'inherit',
    env: { ...process.env, NODE_OPTIONS: options },
  });
  process.exit(r.status ?? 1);
}

interface Point {
  name: string;
  hardware: string;
  /** the attention kernel the run used (--attention-kernel; the profile's figures for it) */
  attention: string;
  gpus: number;
  /** lfc compile's arguments, --hardware and the data profile aside */
  args: string[];
  /** the published tokens/s per GPU */
  published: number;
  /** where the point's routing was forced balanced: the same run's tokens/s per GPU dropless */
  dropless?: number;
  source: string;
}

/** every run: Megatron's bf16 mixed precision and its distributed optimizer */
const BF16_DISTOPT = ['--bf16', '--use-distributed-optimizer'];
/** Megatron's default split: `layers / pp` on every stage */
const even = (layers: number, pp: number) =>
  pp > 1
    ? [
        ...['--decoder-first-pipeline-num-layers', String(layers / pp)],
        ...['--decoder-last-pipeline-num-layers', String(layers / pp)],
      ]
    : [];
/** a single node's or several nodes' shape and the decoder layout */
const layout = (gpus: number, tp: number, pp: number, layers: number) => [
  ...['--nnodes', String(gpus / 8), '--nproc-per-node', '8'],
  ...['--tp', String(tp), '--pp', String(pp), ...(tp > 1 ? ['--sequence-parallel'] : [])],
  ...even(layers, pp),
];
/** Megatron-MoE-ModelZoo's Qwen3-235B-A22B rows: 256 H100, pp 8, vpp 4, expert tp 1, DeepEP */
const MODEL_ZOO =
  'https://github.com/yanring/Megatron-MoE-ModelZoo/blob/main/best_practice/Qwen3/readme.md';
const modelZoo235b = (tp: number, ep: number, seq = 4096, globalBatch = 2048) => [
  'qwen3-vl-235b-a22b',
  ...['--nnodes', '32', '--nproc-per-node', '8', '--tp', String(tp), '--sequence-parallel'],
  ...['--pp', '8', '--vpp', '4', '--ep', String(ep), '--expert-tensor-parallel-size', '1'],
  ...['--seq-length', String(seq), '--micro-batch-size', '1'],
  ...['--global-batch-size', String(globalBatch)],
  ...['--moe-token-dispatcher-type', 'flex'],
  ...BF16_DISTOPT,
];
/** the cross-node row (point 6): tp 2, ep 32, the norms and the MoE activation recomputed */
const modelZooCrossNode = [
  ...modelZoo235b(2, 32),
  ...['--recompute-granularity', 'selective', '--recompute-modules', 'layernorm', 'moe_act'],
];
/** tokens/s per GPU of a ModelZoo row's step: global batch 2048 × 4096 over 256 GPUs */
const modelZooPerGpu = (step: number) => Math.round((2048 * 4096) / step / 256);
/**
 * FLOPs a token of Qwen3-235B-A22B at sequence `seq`, as Megatron-LM counts them for its TFLOP/s
 * (megatron/training/training.py, num_floating_point_operations, with causal attention):
 * 12·L·h²·((1 + g/a + s/2h)·a·d/h + k·(3/2)·F/h) + 6·h·V, L 94 layers, hidden h 4096, a 64 heads
 * of d 128 in g 4 groups, top k 8 of experts with F 1536 (SwiGLU: 3/2), vocabulary V 151936. The
 * Model Zoo's long-context table gives TFLOP/s per GPU, not steps; over this count they are
 * tokens/s. Its main table checks the count: each row's step × TFLOP/s is this count × 2048 × 4096
 * tokens / 256 GPUs within 0.5% (printed by the bench).
 */
function modelZooFlopsPerToken(seq: number): number {
  const [L, h, a, d, g, k, F, V] = [94, 4096, 64, 128, 4, 8, 1536, 151936];
  return (
    12 * L * h * h * ((1 + g / a + seq / (2 * h)) * ((a * d) / h) + (k * 1.5 * F) / h) + 6 * h * V
  );
}
/** the main table's rows: step s, TFLOP/s per GPU (sequence 4096, global batch 2048, 256 GPUs) */
const MODEL_ZOO_ROWS: [number, number][] = [
  [19.7, 245],
  [17.6, 276],
  [24.2, 200],
  [29.0, 167],
];
/** FlagPerf's Llama 3 runs: sequence 8192, micro-batch 1, global batch 512, embeddings tied */
const flagperfLlama3 = (model: string, gpus: number, tp: number, pp: number, layers: number) => [
  model,
  'model.text_decoder.untie_embeddings_and_output_weights=false',
  ...layout(gpus, tp, pp, layers),
  ...['--seq-length', '8192', '--micro-batch-size', '1', '--global-batch-size', '512'],
  ...BF16_DISTOPT,
];
const FLAGPERF = 'https://github.com/FlagOpen/FlagPerf/tree/main/training/nvidia';

const POINTS: Point[] = [
  {
    name: 'Llama 3 8B, 8 A800, tp 1 pp 2 dp 4 (Megatron-Core)',
    hardware: 'a800',
    attention: 'flash2',
    gpus: 8,
    args: flagperfLlama3('llama3-8b-text', 8, 1, 2, 32),
    published: 3698.7,
    source: `${FLAGPERF}/llama3_8B-megatron`,
  },
  {
    name: 'Llama 3 8B, 8 H100, tp 2 pp 1 dp 4 (Megatron-Core)',
    hardware: 'h100',
    attention: 'flash2',
    gpus: 8,
    args: flagperfLlama3('llama3-8b-text', 8, 2, 1, 32),
    published: 8103,
    source: `${FLAGPERF}/llama3_8B-megatron`,
  },
  {
    name: 'Llama 3 70B, 64 H100, tp 8 pp 4 dp 2 (Megatron-Core)',
    hardware: 'h100',
    attention: 'flash2',
    gpus: 64,
    args: flagperfLlama3('llama3-70b-text', 64, 8, 4, 80),
    published: 851,
    source: `${FLAGPERF}/llama3_70B-megatron`,
  },
  {
    name: 'Llama 2 70B, 32 H800, tp 4 pp 8 dp 1 (FlagScale)',
    hardware: 'h800',
    attention: 'flash2',
    gpus: 32,
    args: [
      'llama2-70b-text',
      ...layout(32, 4, 8, 80),
      ...['--seq-length', '4096', '--micro-batch-size', '1', '--global-batch-size', '44'],
      ...BF16_DISTOPT,
    ],
    published: 791.37,
    source: `${FLAGPERF}/llama2_70B-megatron`,
  },
  {
    name: 'Qwen3-30B-A3B, 8 H100, ep 8 (NeMo AutoModel, FSDP2)',
    hardware: 'h100',
    attention: 'cudnn',
    gpus: 8,
    args: [
      'qwen3-vl-30b-a3b',
      ...layout(8, 1, 1, 48),
      '--ep',
      '8',
      ...['--seq-length', '4096', '--micro-batch-size', '4', '--global-batch-size', '512'],
      ...['--recompute-granularity', 'full'],
      ...BF16_DISTOPT,
    ],
    published: 12040,
    source: 'https://github.com/NVIDIA-NeMo/Automodel/blob/main/docs/performance-summary.mdx',
  },
  {
    name: 'Qwen3-235B-A22B, 256 H100, tp 2 ep 32 (Megatron-Core)',
    hardware: 'h100',
    attention: 'cudnn',
    gpus: 256,
    args: modelZooCrossNode,
    published: modelZooPerGpu(19.7),
    source: MODEL_ZOO,
  },
  {
    name: 'Qwen3-235B-A22B, 256 H100, tp 4 ep 8 (Megatron-Core)',
    hardware: 'h100',
    attention: 'cudnn',
    gpus: 256,
    args: modelZoo235b(4, 8),
    published: modelZooPerGpu(29.0),
    source: MODEL_ZOO,
  },
  {
    name: 'Qwen3-235B-A22B, 256 H100, point 6 + A2A overlap',
    hardware: 'h100',
    attention: 'cudnn',
    gpus: 256,
    args: [
      ...modelZooCrossNode,
      ...['--overlap-moe-expert-parallel-comm', '--delay-wgrad-compute'],
    ],
    published: modelZooPerGpu(17.6),
    source: MODEL_ZOO,
  },
  {
    name: 'Qwen3-235B-A22B, 256 H100, tp 4 ep 8, sequence 16k',
    hardware: 'h100',
    attention: 'cudnn',
    gpus: 256,
    args: [
      ...modelZoo235b(4, 8, 16384, 256),
      ...['--recompute-granularity', 'selective', '--recompute-modules', 'layernorm', 'moe'],
    ],
    published: Math.round(295e12 / modelZooFlopsPerToken(16384)),
    dropless: Math.round(237e12 / modelZooFlopsPerToken(16384)),
    source: `${MODEL_ZOO} ("Long Context", sequence 16384, cp 1)`,
  },
];

/** FlagPerf's ablation of point 1 on the A800 machine: tp, pp, published tokens/s per GPU */
const ABLATION: [number, number, number][] = [
  [1, 2, 3698.7],
  [1, 4, 3306.5],
  [2, 2, 3409.2],
  [4, 2, 3006.1],
  [1, 8, 2690.3],
  [8, 1, 2451.2],
  [2, 4, 3042.7],
];

const BAND = 0.15;

const arg = (name: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const only = arg('only')?.split(',').map(Number);
const pct = (x: number) => `${(100 * x).toFixed(0)}%`;

console.log(
  'point                                                    hardware  step s (lfc / published)  tokens/s/GPU  published  ratio  within ±15%',
);
let within = 0;
let shown = 0;
POINTS.forEach((p, k) => {
  if (only && !only.includes(k + 1)) return;
  const t0 = performance.now();
  const x = predict(p.args, p.hardware, p.attention);
  const ratio = x.perGpu / p.published;
  const tokensPerStep = x.step * x.perGpu * p.gpus;
  const publishedStep = tokensPerStep / (p.published * p.gpus);
  shown++;
  if (Math.abs(ratio - 1) <= BAND) within++;
  console.log(
    `${`${k + 1}. ${p.name}`.padEnd(57)}${p.hardware.padEnd(10)}${`${x.step.toFixed(2)} / ${publishedStep.toFixed(2)}`.padStart(24)}  ${x.perGpu.toFixed(0).padStart(12)}  ${String(p.published).padStart(9)}  ${ratio.toFixed(2).padStart(5)}  ${Math.abs(ratio - 1) <= BAND ? 'yes' : 'no'}  (${((performance.now() - t0) / 1000).toFixed(0)} s)`,
  );
  console.log(
    `     busiest rank: ${x.shares.map(([f, s]) => `${f} ${pct(s / x.step)}`).join(', ')}`,
  );
  // how much the ratio rests on the attention kernel: the same plan priced with each of the profile's
  const kernels = Object.keys(loadHardware(p.hardware).efficiency!.attentionKernels);
  if (kernels.length > 1)
    console.log(
      `     ratio by attention kernel: ${kernels.map((k) => `${k}${k === p.attention ? " (the run's)" : ''} ${(x.perGpuOn(loadHardware(p.hardware, k)) / p.published).toFixed(2)}`).join(', ')}`,
    );
  if (process.argv.includes('--sensitivity')) {
    const hw = loadHardware(p.hardware, p.attention);
    const moved = EFFICIENCY_FAMILIES.map(
      (f) => `${f} ${(x.perGpuOn(scaleEfficiency(hw, f, 0.8)) / p.published).toFixed(2)}`,
    );
    console.log(`     ratio with one family ×0.8: ${moved.join(', ')}`);
  }
  if (p.dropless) droplessShare(p, x.step);
  console.log(`     source: ${p.source}`);
});
console.log(`${within} of ${shown} points within ±15% (issue 17, item 2: at least three)`);
console.log(
  `Megatron's FLOP count (point 9's conversion) against the Model Zoo's main table: step × TFLOP/s over the count, ${MODEL_ZOO_ROWS.map(([step, tf]) => ((step * tf * 1e12 * 256) / (2048 * 4096 * modelZooFlopsPerToken(4096))).toFixed(3)).join(', ')}`,
);

/**
 * A forced-balance point's dropless run: the busiest expert rank's share of the routing
 * (--moe-expected-imbalance) at which lfc's step is the dropless run's, by the secant through lfc's
 * balanced step and its step at 1.5, then that share compiled to check it.
 */
function droplessShare(p: Point, balanced: number): void {
  const stepAt = (f: number) =>
    predict([...p.args, '--moe-expected-imbalance', String(f)], p.hardware, p.attention).step;
  const target = (balanced * p.published) / p.dropless!;
  const at15 = stepAt(1.5);
  const f = 1 + (0.5 * (target - balanced)) / (at15 - balanced);
  const share = Math.round(f * 100) / 100;
  const check = stepAt(share);
  console.log(
    `     dropless: published ${p.dropless} tokens/s per GPU (${(p.dropless! / p.published).toFixed(2)} of forced), a ${target.toFixed(2)} s step; lfc reaches it at --moe-expected-imbalance ${share.toFixed(2)} (${check.toFixed(2)} s; balanced ${balanced.toFixed(2)} s, 1.5 ${at15.toFixed(2)} s)`,
  );
}

if (process.argv.includes('--ablation')) {
  console.log("FlagPerf's Llama 3 8B layouts on 8 A800 (point 1's source), Megatron's even split:");
  console.log('  tp  pp  dp  tokens/s/GPU  published  ratio');
  const rows = ABLATION.map(([tp, pp, published]) => {
    const x = predict(flagperfLlama3('llama3-8b-text', 8, tp, pp, 32), 'a800', 'flash2');
    console.log(
      `  ${String(tp).padStart(2)}  ${String(pp).padStart(2)}  ${String(8 / tp / pp).padStart(2)}  ${x.perGpu.toFixed(0).padStart(12)}  ${String(published).padStart(9)}  ${(x.perGpu / published).toFixed(2).padStart(5)}`,
    );
    return { published, predicted: x.perGpu };
  });
  const order = (key: 'published' | 'predicted') =>
    rows
      .map((r, i) => [r[key], i] as const)
      .sort((a, b) => b[0] - a[0])
      .map(([, i]) => i)
      .join(',');
  console.log(
    `  lfc ranks the ${rows.length} layouts ${order('published') === order('predicted') ? 'in the measured order' : 'in another order than measured'}`,
  );
}
