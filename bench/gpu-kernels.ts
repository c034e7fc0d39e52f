// bench/gpu-kernels: lfc's cost model (compiler/sim/cost.ts) against one GPU's measured kernels.
//
// bench/gpu_probe.py measures, on a real GPU, the kernel families a hardware profile prices: GEMMs
// by shape (a linear layer's forward and its two backward products), grouped expert GEMMs by rows
// per expert (one stream, four streams as Transformer Engine runs them, and PyTorch's CUTLASS
// _grouped_mm), flash attention by segment length and head dim (PyTorch's flash and cuDNN
// backends), memory-bound kernels by bytes, and a tiny kernel. This bench prices each measured case
// with the profile (the kernelSeconds the simulator charges an instruction) and prints, per family,
// the median of predicted / measured, its range and how many cases lie within ±15%; then each
// family's worst cases. Under 1: the profile predicts the kernel faster than it ran.
//
// `--fit` also prints the figures fitted to the probe (compiler/sim/probe.ts fitProbe) and the
// same table under them: what configs/hardware/h200.yaml's measured figures come from.
//
//   npx tsx bench/gpu-kernels.ts [--probe bench/data/h200] [--hardware h200] [--fit] [--all]
//
// bench/data/h200: one H200 SXM, 2026-12-04 (torch 2.11, CUDA 13.0, cuDNN 9.19): eager.json (every
// family, launched from Python), graphs.json (the same timed as CUDA-graph replays, the GPU alone),
// grouped-eager.json (the grouped GEMMs' three ways, launched from Python).

import { fitProbe, loadProbe, priceProbe, summarize, type Probe } from '../compiler/sim/probe.js';
import { loadHardware, type HardwareProfile } from '../compiler/sim/hardware.js';

function table(probe: Probe, hw: HardwareProfile, all: boolean, worst: boolean) {
  const cases = priceProbe(probe, hw);
  console.log(`predicted / measured on ${hw.name} (< 1: the profile is faster than the GPU was)`);
  console.log('  family                        cases  median    min    max  within ±15%');
  for (const s of summarize(cases))
    console.log(
      `  ${s.family.padEnd(29)} ${String(s.cases).padStart(5)}  ${s.median.toFixed(2).padStart(5)}  ${s.min.toFixed(2).padStart(5)}  ${s.max.toFixed(2).padStart(5)}  ${String(s.within).padStart(4)}/${s.cases}`,
    );
  if (!worst) return;
  for (const f of new Set(cases.map((c) => c.family))) {
    const cs = cases
      .filter((c) => c.family === f)
      .sort(
        (a, b) =>
          Math.abs(Math.log(b.predicted / b.measured)) -
          Math.abs(Math.log(a.predicted / a.measured)),
      );
    console.log(`\n${f}${all ? '' : ' (worst 3)'}`);
    for (const c of all ? cs : cs.slice(0, 3))
      console.log(
        `  ${c.label.padEnd(40)} measured ${(c.measured * 1e6).toFixed(1).padStart(8)} µs  predicted ${(c.predicted * 1e6).toFixed(1).padStart(8)} µs  ratio ${(c.predicted / c.measured).toFixed(2)}`,
      );
  }
}

function main() {
  const arg = (name: string, def: string) => {
    const i = process.argv.indexOf(`--${name}`);
    return i > 0 ? process.argv[i + 1] : def;
  };
  const dir = arg('probe', 'bench/data/h200');
  const probe = loadProbe(dir);
  const hw = loadHardware(arg('hardware', 'h200'));
  const all = process.argv.includes('--all');
  const env = probe.environment;
  console.log(
    `probe ${dir}: ${env.name ?? env.device}, torch ${env.torch}, ${probe.date}; ${Object.entries(
      probe.sources,
    )
      .map(([f, s]) => `${f} from ${s}`)
      .join(', ')}`,
  );
  if (probe.ceilings)
    console.log(
      `ceilings: copy ${probe.ceilings.copy_gbps.toFixed(0)} GB/s (read + write), bf16 GEMM ${probe.ceilings.gemm_square}³ ${probe.ceilings.gemm_tflops.toFixed(0)} TFLOP/s; profile ${hw.name}: memory ${(hw.compute.memoryGbps * hw.compute.memoryEfficiency).toFixed(0)} GB/s, GEMM ${(hw.compute.matmulTflops * hw.compute.matmulEfficiency).toFixed(0)} TFLOP/s at best\n`,
    );
  table(probe, hw, all, !process.argv.includes('--fit'));
  if (!process.argv.includes('--fit')) return;
  const t0 = performance.now();
  const fitted = fitProbe(probe, hw);
  const c = fitted.compute;
  console.log(`\nfitted (${((performance.now() - t0) / 1000).toFixed(1)} s):`);
  console.log(
    `  compute: launch_us ${c.launchUs.toFixed(2)}, matmul_efficiency ${c.matmulEfficiency.toFixed(3)}, matmul_half_gflop ${c.matmulHalfGflop.toFixed(3)}, memory_efficiency ${c.memoryEfficiency.toFixed(3)}`,
  );
  if (fitted.efficiency)
    console.log(
      `  gemm: k_half ${fitted.efficiency.gemmKHalf}, split_k ${fitted.efficiency.gemmSplitK}`,
    );
  for (const [k, f] of Object.entries(fitted.efficiency?.attentionKernels ?? {}))
    console.log(
      `  attention ${k}: forward ${f.forward.toFixed(3)}, backward ${f.backward.toFixed(3)}, half_segment ${f.halfSegment.toFixed(0)}, head_dim_multiple ${f.headDimMultiple}`,
    );
  console.log('');
  table(probe, fitted, all, true);
}

main();
