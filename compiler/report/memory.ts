// Each program's planned memory per rank, from its regions: what `lfc compile`'s report tabulates
// and `lfc viz` draws.

import { stageOfRank, type PlanFile, type ProgramFile } from '../plan/format.js';

/** One program's planned memory on each rank that runs it (bytes, from its regions). */
export interface ProgramMemory {
  readonly program: string;
  readonly ranks: number;
  /** the pipeline stages its ranks are on */
  readonly stages: readonly number[];
  readonly parameters: number;
  readonly gradients: number;
  readonly optimizer: number;
  /** the runtime-filled inputs of every microbatch slot, and the step scalars */
  readonly batch: number;
  readonly activations: number;
  /** everything above: the device memory the plan asks of each of its ranks */
  readonly device: number;
  /** offloaded activations: pinned host memory */
  readonly host: number;
}

/** Each distinct program's device and host memory per rank, the largest device total first. */
export function memoryByProgram(result: {
  readonly plan: PlanFile;
  readonly programs: readonly ProgramFile[];
}): ProgramMemory[] {
  const ranksOf = new Map<string, number[]>();
  result.plan.rankPrograms.forEach((id, rank) => {
    ranksOf.set(id, [...(ranksOf.get(id) ?? []), rank]);
  });
  return result.programs
    .map((p) => {
      const r = p.regions;
      const ranks = ranksOf.get(p.id) ?? [];
      const batch = r.data + r.scalar;
      return {
        program: p.id,
        ranks: ranks.length,
        stages: [...new Set(ranks.map((rank) => stageOfRank(result.plan, rank)))],
        parameters: r.param,
        gradients: r.grad,
        optimizer: r.optim,
        batch,
        activations: r.arena,
        device: r.param + r.grad + r.optim + batch + r.arena,
        host: r.host,
      };
    })
    .sort((a, b) => b.device - a.device || a.program.localeCompare(b.program));
}
