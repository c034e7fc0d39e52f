// lfc calibrate: a hardware profile of this machine for the simulated step (compiler/sim), fitted
// to the CPU runtime's own timings (compiler/sim/calibrate.ts says how): kernels from one-rank
// steps of tiny-vlm-moe at two sequence lengths, the link from the collectives of a two-rank
// tensor-parallel step. `lfc compile … --hardware FILE` then predicts what `lfc run` measures.
//
// `--probe DIR` calibrates a GPU instead, from what bench/gpu_probe.py measured on it (run there
// with PyTorch): the kernel figures of --hardware's profile fitted to the measurements.

import type { Command } from 'commander';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { compile, writePlan, type CompileOptions } from '../compiler/pipeline.js';
import type { ProgramFile } from '../compiler/plan/format.js';
import {
  fitCompute,
  fitLink,
  median,
  profileYaml,
  type KernelSample,
  type TransferSample,
} from '../compiler/sim/calibrate.js';
import { collectiveSteps, instructionWork } from '../compiler/sim/cost.js';
import { listHardware, loadHardware, type HardwareProfile } from '../compiler/sim/hardware.js';
import { fitProbe, loadProbe, priceProbe, summarize } from '../compiler/sim/probe.js';
import { UserError } from '../compiler/errors.js';
import { train } from '../runtime/train.js';
import { mergeTrace, type TraceEvent } from '../runtime/trace.js';
import { writeFileAtomic } from '../runtime/safetensors.js';
import type { CliIO } from './io.js';
import { checkOutputPath, positiveInt } from './options.js';
import { launchTraining, trainOptions } from './run.js';

const MODEL = 'tiny-vlm-moe';
const SEQ_LENGTHS = [128, 512];

interface CalibrateFlags {
  output?: string;
  steps: number;
  threads?: number;
  probe?: string;
  hardware: string;
}

/**
 * A GPU profile: `base`'s, with the kernel figures a probe determines fitted to it
 * (compiler/sim/probe.ts fitProbe); its links, memory and tile structure stay `base`'s.
 */
function calibrateFromProbe(dir: string, base: string, output: string | undefined, io: CliIO) {
  const hw = loadHardware(base);
  if (!hw.efficiency)
    throw new UserError(
      `--hardware ${base}: a CPU profile; --probe fits a GPU's (start from one of ${listHardware().join(', ')})`,
    );
  const probe = loadProbe(dir);
  const env = probe.environment;
  const sms = typeof env.sms === 'number' ? env.sms : undefined;
  const gib = typeof env.memory_gib === 'number' ? env.memory_gib : undefined;
  if (
    (sms !== undefined && sms !== hw.efficiency.sms) ||
    (gib !== undefined && Math.abs(gib - hw.memoryGiB) > 0.1 * hw.memoryGiB)
  )
    io.err(
      `lfc calibrate: warning: the probe's GPU (${String(env.name)}: ${sms} SMs, ${gib?.toFixed(1)} GiB) is not ${hw.name}'s (${hw.efficiency.sms} SMs, ${hw.memoryGiB} GiB): its memory bandwidth and tiles are ${hw.name}'s, so the fitted efficiencies absorb the difference; start from the profile of the GPU measured\n`,
    );
  io.err(`lfc calibrate: fitting ${hw.name}'s kernel figures to ${dir}…\n`);
  const fitted = fitProbe(probe, hw);
  const about = [
    `${hw.name}'s profile (${hw.path}) with its kernel figures fitted by lfc calibrate --probe on`,
    `${new Date().toISOString().slice(0, 10)} to ${dir}: ${String(env.name ?? env.device)}, torch ${String(env.torch)}, measured ${probe.date}`,
    'by bench/gpu_probe.py (compute: launch, matmul and memory efficiency; efficiency.gemm: k_half,',
    "split_k; efficiency.attention: the flash2 and cudnn kernels); the rest is the base profile's",
  ].join('\n');
  const { path: _path, ...rest } = fitted;
  const yaml = profileYaml(
    {
      ...rest,
      name: `${hw.name}-probe`,
      description: `${hw.description}; kernels fitted to ${dir}`,
    },
    about,
  );
  const c = fitted.compute;
  if (output) {
    writeFileAtomic(output, yaml);
    const before = summarize(priceProbe(probe, hw));
    const after = summarize(priceProbe(probe, fitted));
    io.out(
      `profile: ${output} (matmul efficiency ${c.matmulEfficiency.toFixed(3)}, half at ${c.matmulHalfGflop.toFixed(3)} GFLOP; memory efficiency ${c.memoryEfficiency.toFixed(3)}; launch ${c.launchUs.toFixed(2)} us)\n` +
        'predicted / measured, median by family, before → after:\n' +
        after
          .map((s) => {
            const b = before.find((x) => x.family === s.family);
            return `  ${s.family.padEnd(28)} ${b ? b.median.toFixed(2) : '—'} → ${s.median.toFixed(2)} (${s.within}/${s.cases} within 15%)\n`;
          })
          .join(''),
    );
  } else io.out(yaml);
}

/** symbols a step's data decides (visual tokens, expert rows): their sizes are not the bounds */
const DATA_SIZED = /Nv|Rx|Nk/;

/**
 * A one-step layout of MODEL written to dir/name, its first program (every rank's, in the
 * layouts measured here), and that program's work at its symbols' bounds and f32 (the runtime's).
 */
function measuredPlan(dir: string, name: string, options: Partial<CompileOptions>) {
  const result = compile({ model: MODEL, microBatchSize: 1, globalBatchSize: 2, ...options });
  const plan = join(dir, name);
  writePlan(plan, result.plan, result.programs);
  const program: ProgramFile = result.programs[0];
  const sizes = new Map(result.plan.symbols.map((s) => [s.name, s.bound]));
  const work = instructionWork(program, sizes, 4, 4);
  /** an instruction whose sizes the data decides: its work at the bounds is not what ran */
  const dataSized = (x: ProgramFile['instructions'][number]) =>
    [...x.inputs, ...x.outputs].some((id) =>
      program.buffers[id].shape.some((d) => DATA_SIZED.test(d)),
    );
  return { result, plan, program, work, dataSized };
}

/** kernel samples, and the executor's time per instruction outside any kernel (seconds) */
async function kernelSamples(
  dir: string,
  seqLength: number,
  f: CalibrateFlags,
): Promise<{ samples: KernelSample[]; gap: number }> {
  const { plan, program, work, dataSized } = measuredPlan(dir, `seq${seqLength}`, { seqLength });
  const times: number[][] = program.instructions.map(() => []);
  const inKernels: number[] = [];
  const run = await train({
    ...trainOptions(plan, { trainIters: f.steps, threads: f.threads }),
    onTiming: (step, per) => {
      if (step === 1 || !per) return;
      per.forEach((t, i) => times[i].push((t.end - t.start) / 1e3));
      inKernels.push(per.reduce((a, t) => a + (t.end - t.start), 0) / 1e3);
    },
  });
  // one stream: the step less its kernels is the executor's own time between them
  const gaps = run.steps
    .slice(1)
    .map((m, k) => (m.stepMs / 1e3 - inKernels[k]) / program.instructions.length);
  const gap = Math.max(0, median(gaps) || 0);
  const samples = program.instructions.flatMap((x, i) => {
    const w = work[i];
    if (x.stream !== 'compute' || x.op === 'reshape' || dataSized(x)) return [];
    if (w.category === 'collective' || w.category === 'memory') return [];
    return [{ flops: w.flops, bytes: w.bytes, seconds: median(times[i]) }];
  });
  return { samples, gap };
}

async function transferSamples(
  dir: string,
  f: CalibrateFlags,
  io: CliIO,
): Promise<TransferSample[]> {
  const { result, plan, program, work, dataSized } = measuredPlan(dir, 'tp2', {
    nprocPerNode: 2,
    parallel: { tp: 2 },
  });
  const trace = join(dir, 'tp2.trace.json');
  const flags = { trainIters: f.steps, threads: f.threads, quiet: true, trace };
  await launchTraining(plan, result.plan, trainOptions(plan, flags), flags, io, false, 1, 2);
  mergeTrace(trace, 2, {});
  const events = (
    JSON.parse(readFileSync(trace, 'utf8')) as {
      traceEvents: (TraceEvent & { dur: number; args: { index: number } })[];
    }
  ).traceEvents.filter((e) => e.ph === 'X');
  // both ranks run p0 (tp 2): instruction i's shorter time is its transfer
  const shortest = new Map<number, number>();
  for (const e of events) {
    const s = e.dur / 1e6;
    shortest.set(e.args.index, Math.min(shortest.get(e.args.index) ?? Infinity, s));
  }
  return program.instructions.flatMap((x, i) => {
    if (work[i].category !== 'collective' || !shortest.has(i) || dataSized(x)) return [];
    const { steps, factor } = collectiveSteps(x.op, 2);
    return [{ steps, moved: factor * work[i].bytes, seconds: shortest.get(i)! }];
  });
}

export function addCalibrateCommand(program: Command, io: CliIO): void {
  program
    .command('calibrate')
    .description(
      "measure this machine for the simulated step: a hardware profile fitted to the CPU runtime's own kernel and collective times",
    )
    .option('-o, --output <file>', 'write the profile here (default: print it)')
    .option(
      '--steps <n>',
      'steps per measured run (the first is not counted)',
      positiveInt('--steps'),
      4,
    )
    .option('--threads <n>', 'BLAS threads (default: all cores)', positiveInt('--threads'))
    .option(
      '--probe <dir>',
      "a GPU's profile instead: fit --hardware's kernel figures to bench/gpu_probe.py's measurements in <dir>",
    )
    .option(
      '--hardware <name|file>',
      'with --probe: the profile to start from (its links, memory and kernel structure)',
      'h100',
    )
    .action(async (f: CalibrateFlags) => {
      if (f.output) checkOutputPath('-o', f.output, 'file');
      if (f.probe !== undefined) {
        calibrateFromProbe(f.probe, f.hardware, f.output, io);
        return;
      }
      const dir = mkdtempSync(join(tmpdir(), 'lfc-calibrate-'));
      try {
        const kernels: KernelSample[] = [];
        const gaps: number[] = [];
        for (const seq of SEQ_LENGTHS) {
          io.err(`lfc calibrate: kernels of ${MODEL}, one rank, sequence ${seq}…\n`);
          const { samples, gap } = await kernelSamples(dir, seq, f);
          kernels.push(...samples);
          gaps.push(gap);
        }
        io.err(`lfc calibrate: collectives of ${MODEL}, two ranks, tp 2…\n`);
        const transfers = await transferSamples(dir, f, io);
        // an instruction costs its kernel and the executor's time around it
        const fitted = fitCompute(kernels);
        const gapUs = (1e6 * gaps.reduce((a, b) => a + b, 0)) / gaps.length;
        const compute = { ...fitted, launchUs: fitted.launchUs + gapUs };
        const link = fitLink(transfers);
        const cpu = cpus()[0]?.model.trim() ?? 'unknown CPU';
        const profile: Omit<HardwareProfile, 'path'> = {
          name: 'local',
          description: `this machine: ${cpu}, ${cpus().length} cores, f32 CPU runtime`,
          // a "device" is one rank's threads: ranks beyond cores / threads share the cores
          // (the simulator's shared-core model, compiler/sim/simulate.ts)
          gpusPerNode: Math.max(1, Math.floor(cpus().length / (f.threads ?? cpus().length))),
          memoryGiB: Math.floor(totalmem() / 2 ** 30),
          // the operating system and Node: what a CPU plan cannot have of this machine's memory
          memoryReserveGiB: 2,
          runtime: 'cpu',
          compute,
          links: {
            intraNode: link,
            interNode: link,
            host: { gbps: compute.memoryGbps, latencyUs: compute.launchUs },
          },
        };
        const about = `measured by lfc calibrate on ${new Date().toISOString().slice(0, 10)} from ${kernels.length} kernels and ${transfers.length} collectives`;
        const yaml = profileYaml(profile, about);
        if (f.output) {
          writeFileAtomic(f.output, yaml);
          io.out(
            `profile: ${f.output} (matmul ${compute.matmulTflops.toFixed(3)} TFLOP/s, half at ${compute.matmulHalfGflop.toFixed(4)} GFLOP; memory ${compute.memoryGbps.toFixed(1)} GB/s; launch ${compute.launchUs.toFixed(1)} us (${gapUs.toFixed(1)} of it the executor's between kernels); link ${link.gbps.toFixed(2)} GB/s, ${link.latencyUs.toFixed(1)} us)\n`,
          );
        } else io.out(yaml);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
}
