// The simulated step as the report states it: step time, tokens per second, model FLOPs
// utilization, and per distinct program how its step divides between compute, exposed
// communication and idle time (pipeline bubbles and waits on peers).
//
// Tokens/s counts the global batch's tokens (global batch × sequence: padding and visual positions
// included) over the step. MFU follows the FLOP convention of `lfc inspect` (docs/design.md, "FLOP
// convention"): model FLOPs are 3 × the forward matmul FLOPs of the model (unsharded: the same for
// every layout) for every microbatch of the global batch, at the sequence's tokens and the data
// profile's expected visual tokens, whatever recompute repeats; over step time × ranks × the
// profile's peak matmul rate.

import type { Graph } from '../../ir/graph.js';
import { forwardFlops } from '../inspect.js';
import type { PlanFile, ProgramFile } from '../plan/format.js';
import type { HardwareProfile } from './hardware.js';
import { simulatePlan, type ReplaySetup, type Simulation } from './simulate.js';

export interface ProgramForecast {
  readonly program: string;
  /** the rank simulated for it */
  readonly rank: number;
  /** fractions of the step */
  readonly compute: number;
  readonly exposedComm: number;
  /** exposedComm by op, largest first */
  readonly exposedByOp: readonly { readonly op: string; readonly share: number }[];
  readonly idle: number;
  /** of the idle time, what its compute stream waits for the framework's host to issue kernels
   * (hardware.ts HostSide) */
  readonly hostWait: number;
}

export interface StepForecast {
  readonly hardware: string;
  /** the attention kernel the step is priced with (a GPU profile's; --attention-kernel) */
  readonly attentionKernel?: string;
  readonly stepSeconds: number;
  readonly tokensPerStep: number;
  readonly tokensPerSecond: number;
  readonly modelFlopsPerStep: number;
  /** model FLOPs per second over world × peak */
  readonly mfu: number;
  readonly programs: readonly ProgramForecast[];
}

/** Forward matmul FLOPs of one microbatch: every module, at `sizes` (default the symbols' bounds). */
export function microbatchForwardFlops(g: Graph, sizes: Record<string, number> = {}): number {
  return forwardFlops(g, ['image_encoder', 'image_projector', 'text_decoder'], sizes);
}

/**
 * The forecast of a plan's step; `modelForwardFlops`: the model's forward FLOPs of one microbatch
 * (CompileResult.modelForwardFlops), for MFU.
 */
export function forecastStep(
  modelForwardFlops: number,
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  hw: HardwareProfile,
  setup?: ReplaySetup,
): { forecast: StepForecast; simulation: Simulation } {
  const simulation = simulatePlan(plan, programs, hw, undefined, setup);
  const t = plan.training;
  const microbatches = t.globalBatchSize / t.microBatchSize;
  const tokensPerStep = t.globalBatchSize * t.seqLength;
  const modelFlopsPerStep = 3 * modelForwardFlops * microbatches;
  const step = simulation.stepSeconds;
  const world = plan.topology.worldSize;
  const forecast: StepForecast = {
    hardware: hw.name,
    ...(hw.efficiency ? { attentionKernel: hw.efficiency.attentionKernel } : {}),
    stepSeconds: step,
    tokensPerStep,
    tokensPerSecond: tokensPerStep / step,
    modelFlopsPerStep,
    mfu: modelFlopsPerStep / (step * world * hw.compute.matmulTflops * 1e12),
    programs: simulation.ranks.map((r) => ({
      program: r.program,
      rank: r.rank,
      compute: r.computeBusy / step,
      exposedComm: r.exposedComm / step,
      exposedByOp: Object.entries(r.exposedByOp)
        .map(([op, t]) => ({ op, share: t / step }))
        .sort((a, b) => b.share - a.share),
      idle: 1 - (r.computeBusy + r.exposedComm) / step,
      hostWait: Math.min(r.hostWait, step - r.computeBusy - r.exposedComm) / step,
    })),
  };
  return { forecast, simulation };
}

/** where a step was simulated: the profile, and the attention kernel where it has one */
export const simulatedOn = (f: Pick<StepForecast, 'hardware' | 'attentionKernel'>): string =>
  `${f.hardware}${f.attentionKernel ? ` (attention: ${f.attentionKernel})` : ''}`;

/** The report's lines. */
export function describeForecast(f: StepForecast, hw: HardwareProfile): string[] {
  const pct = (x: number) => `${(100 * x).toFixed(x > 0 && x < 0.001 ? 3 : 1)}%`;
  const time =
    f.stepSeconds >= 1 ? `${f.stepSeconds.toFixed(2)} s` : `${(f.stepSeconds * 1e3).toFixed(2)} ms`;
  const rate =
    f.tokensPerSecond >= 1e6
      ? `${(f.tokensPerSecond / 1e6).toFixed(2)}M`
      : `${(f.tokensPerSecond / 1e3).toFixed(1)}k`;
  const ops = (by: ProgramForecast['exposedByOp']) => {
    const top = by.filter((x) => x.share >= 0.0005).slice(0, 3);
    return top.length ? ` (${top.map((x) => `${x.op} ${pct(x.share)}`).join(', ')})` : '';
  };
  return [
    `simulated on ${simulatedOn(f)}: step ${time}, ${rate} tokens/s, MFU ${pct(f.mfu)} (${hw.description})`,
    ...f.programs.map(
      (p) =>
        `  ${p.program} (rank ${p.rank}): compute ${pct(p.compute)}, exposed communication ${pct(p.exposedComm)}${ops(p.exposedByOp)}, idle ${pct(p.idle)}${p.hostWait >= 0.0005 ? ` (waiting for the host ${pct(p.hostWait)})` : ''}`,
    ),
  ];
}
