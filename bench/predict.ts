// bench/predict: one compile line compiled and simulated as `lfc compile` would (without the
// verifier: the figures do not depend on it), with the busiest rank's step split by kind (GEMMs,
// attention, other kernels, exposed communication, idle). Shared by bench/published.ts and
// bench/gpu-step.ts.

import { parseCompileArgs } from '../cli/compile.js';
import { compile } from '../compiler/pipeline.js';
import { expectedSizes, instructionWork } from '../compiler/sim/cost.js';
import { loadHardware, type HardwareProfile } from '../compiler/sim/hardware.js';
import { forecastStep } from '../compiler/sim/report.js';
import { OP_TABLE, type OpKind } from '../ir/ops.js';

export interface Predicted {
  step: number;
  perGpu: number;
  /** the busiest rank's step: [family, seconds] */
  shares: [string, number][];
  /** tokens/s per GPU of the same plan on another profile */
  perGpuOn: (hw: HardwareProfile) => number;
}

/** Compiles and simulates one point; the busiest rank's step by family. */
export function predict(
  args: string[],
  hardware: string,
  attention: string,
  dataProfile = 'text',
): Predicted {
  const hw = loadHardware(hardware, attention);
  const { options } = parseCompileArgs([
    ...args,
    ...['--hardware', hardware, '--attention-kernel', attention, '--data-profile', dataProfile],
  ]);
  const r = compile({ ...options, skipVerify: true });
  const programs = new Map(r.programs.map((p) => [p.id, p]));
  const { forecast, simulation } = forecastStep(r.modelForwardFlops, r.plan, programs, hw);
  const busiest = simulation.ranks.reduce((a, b) => (b.computeBusy > a.computeBusy ? b : a));
  const program = programs.get(busiest.program)!;
  const sizes = expectedSizes(r.plan, programs.values());
  const work = instructionWork(program, sizes, hw.compute.dtypeBytes, hw.compute.gradDtypeBytes);
  const kernels = new Map<string, number>([
    ['GEMM', 0],
    ['attention', 0],
    ['other kernels', 0],
  ]);
  program.instructions.forEach((x, i) => {
    // what the simulator counts as the compute stream's busy time: every op but a collective
    if (x.stream !== 'compute' || OP_TABLE[x.op as OpKind].category === 'collective') return;
    const family =
      work[i].matmul?.kind === 'attention'
        ? 'attention'
        : work[i].matmul
          ? 'GEMM'
          : 'other kernels';
    kernels.set(family, kernels.get(family)! + busiest.end[i] - busiest.start[i]);
  });
  const step = forecast.stepSeconds;
  const world = r.plan.topology.worldSize;
  const idle = step - busiest.computeBusy - busiest.exposedComm;
  // the report's share of the step its host holds the busiest rank's compute stream back
  const host =
    step *
    forecast.programs.find((p) => p.rank === busiest.rank && p.program === busiest.program)!
      .hostWait;
  return {
    step,
    perGpu: forecast.tokensPerSecond / world,
    perGpuOn: (h) =>
      forecastStep(r.modelForwardFlops, r.plan, programs, h).forecast.tokensPerSecond / world,
    shares: [
      ...kernels,
      ['exposed communication', busiest.exposedComm],
      // idle: pipeline bubbles, waits on peers and, apart, waits for the framework's host
      ['idle', idle - host],
      ['waiting for the host', host],
    ],
  };
}
