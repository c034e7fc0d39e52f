// bench/gpu-step: lfc's simulated step against a step measured on a GPU (bench/gpu_step.py).
//
// gpu_step.py trains a decoder (Llama 3 8B's, or Qwen3-30B-A3B's with its experts) cut to a few
// layers on one GPU, Megatron-style in bf16
// (fp32 master weights and AdamW), and records its step time and its GPU kernel time by kind
// (GEMMs, attention, other). This bench compiles the same step with lfc (`llama3-8b-text` with
// model.text_decoder.num_layers set, one rank, text data profile, --bf16, the same attention
// kernel) and simulates it on the GPU's profile, then prints both side by side: the step, and
// the seconds of each kind. Where they part, the kind says which part of the cost model to look
// at. The measured step includes what lfc does not model (the host's launches, PyTorch's
// gradient accumulation in bf16, its elementwise RoPE); the kinds separate those out.
//
//   npx tsx bench/gpu-step.ts [--measured FILE[,FILE…]] [--hardware h200]
//
// bench/data/h200 holds three steps measured on one H200 on 2026-12-04: step-compiled.json (cuDNN
// attention; RoPE, SwiGLU and the loss fused by torch.compile, as Megatron fuses them), step.json
// (the same, eager) and step-flash.json (eager, FlashAttention-2); step-moe-compiled.json is
// Qwen3-30B-A3B's decoder (qwen3-vl-30b-a3b's) cut to 4 layers, its 128 experts as PyTorch's
// CUTLASS grouped GEMM, fused as step-compiled.json.

import { readFileSync } from 'node:fs';

import { predict } from './predict.js';

interface Measured {
  date: string;
  /** lfc's preset for it */
  model: string;
  environment: Record<string, unknown>;
  layers: number;
  seq: number;
  microbatches: number;
  attention: 'cudnn' | 'flash';
  compiled?: boolean;
  parameters: number;
  median_seconds: number;
  step_seconds: number[];
  kernel_seconds: { gemm: number; attention: number; other: number };
  peak_memory_gib: number;
}

const arg = (name: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const DATA = 'bench/data/h200';
const paths = arg('measured')?.split(',') ?? [
  `${DATA}/step-compiled.json`,
  `${DATA}/step.json`,
  `${DATA}/step-flash.json`,
  `${DATA}/step-moe-compiled.json`,
];
const hardware = arg('hardware') ?? 'h200';
const row = (name: string, measured: number, predicted: number) =>
  console.log(
    `  ${name.padEnd(22)} ${(measured * 1e3).toFixed(1).padStart(9)} ms  ${(predicted * 1e3).toFixed(1).padStart(9)} ms  ${(predicted / measured).toFixed(2).padStart(5)}`,
  );
for (const path of paths) {
  const m = JSON.parse(readFileSync(path, 'utf8')) as Measured;
  const kernel = m.attention === 'flash' ? 'flash2' : 'cudnn';
  const line = [
    m.model,
    `model.text_decoder.num_layers=${m.layers}`,
    ...['--nnodes', '1', '--nproc-per-node', '1', '--seq-length', String(m.seq)],
    ...['--micro-batch-size', '1', '--global-batch-size', String(m.microbatches), '--bf16'],
  ];
  const p = predict(line, hardware, kernel);
  const shares = new Map(p.shares);
  console.log(
    `${path}: ${m.environment.name}, torch ${m.environment.torch}, ${m.date}; ${m.model}'s decoder, ${m.layers} layers, ${m.microbatches} microbatches of ${m.seq} tokens, attention ${m.attention}, ${m.compiled ? 'RoPE, SwiGLU and loss fused by torch.compile' : 'eager'}`,
  );
  console.log(`lfc compile ${line.join(' ')} --hardware ${hardware} --attention-kernel ${kernel}`);
  console.log('                          measured      lfc       lfc / measured');
  row('step', m.median_seconds, p.step);
  row('GEMM kernels', m.kernel_seconds.gemm, shares.get('GEMM')!);
  row('attention kernels', m.kernel_seconds.attention, shares.get('attention')!);
  row('other kernels', m.kernel_seconds.other, shares.get('other kernels')!);
  const busy = m.kernel_seconds.gemm + m.kernel_seconds.attention + m.kernel_seconds.other;
  console.log(
    `  measured: kernels busy ${(busy * 1e3).toFixed(1)} ms of the step (steps ${m.step_seconds.map((s) => (s * 1e3).toFixed(1)).join(', ')} ms); peak memory ${m.peak_memory_gib.toFixed(1)} GiB\n`,
  );
}
