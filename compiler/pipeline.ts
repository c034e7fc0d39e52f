// The compiler pipeline: the ordered list of passes, and compile() that runs them and emits the
// plan. Each pass is a pure function of its input; with `dumpAfter` the IR after that pass is
// printed. The verifier runs after every graph pass.
//
//   1 build      forward graph of one microbatch from the model config
//   2 autodiff   backward (dgrad/wgrad split), gradient accumulation, clipping + AdamW
//   3 emit       one program per rank: schedule (forward then backward per microbatch, then the
//                optimizer step), streams, buffers, memory plan
//   4 verify     the emitted plan: memory reuse checker, then the plan verifier over all ranks
//                (compiler/verify: collectives, send/recv, events, a symbolic run to the end)

import { mkdirSync, renameSync, rmSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { Graph } from '../ir/graph.js';
import { printGraph } from '../ir/printer.js';
import { assertValid } from '../ir/verify.js';
import {
  autodiff,
  DEFAULT_OPTIMIZER,
  weightDecayOf,
  type OptimizerSettings,
} from '../passes/autodiff.js';
import { UserError } from './errors.js';
import { buildForwardGraph } from './frontend/build.js';
import { loadModelConfig, type ModelConfig } from './frontend/config.js';
import { countParams } from './inspect.js';
import { resolveSizes, type ParallelSizes } from './parallel/sizes.js';
import { validateParallel } from './parallel/validate.js';
import { buildTopology, GROUP_KINDS } from './parallel/topology.js';
import { checkMemoryReuse } from './plan/check-memory.js';
import { assertPlanValid } from './verify/plan-verifier.js';
import { emitProgram } from './plan/emit.js';
import { PLAN_FORMAT, PLAN_VERSION, type PlanFile, type ProgramFile } from './plan/format.js';

export interface PassInfo {
  readonly name: string;
  readonly summary: string;
}

export const PASSES: readonly PassInfo[] = [
  { name: 'build', summary: 'forward graph of one microbatch from the model config' },
  { name: 'autodiff', summary: 'backward graph, gradient accumulation, clipping and AdamW' },
];

export interface CompileOptions {
  readonly model: string;
  readonly overrides?: readonly string[];
  readonly seqLength?: number;
  readonly microBatchSize?: number;
  readonly globalBatchSize?: number;
  readonly maxVisualTokens?: number;
  readonly nnodes?: number;
  readonly nprocPerNode?: number;
  /** parallel sizes beyond the cluster shape (tp, pp, vpp, ep, etp, cp); default 1 each */
  readonly parallel?: Partial<Omit<ParallelSizes, 'nnodes' | 'nprocPerNode'>>;
  readonly sequenceParallel?: boolean;
  readonly microbatchGroupSize?: number;
  readonly decoderFirstPipelineNumLayers?: number;
  readonly decoderLastPipelineNumLayers?: number;
  readonly optimizer?: Partial<OptimizerSettings>;
  /** print the IR after this pass */
  readonly dumpAfter?: string;
  readonly onDump?: (text: string) => void;
}

export interface CompileResult {
  readonly config: ModelConfig;
  readonly graph: Graph;
  readonly plan: PlanFile;
  readonly programs: readonly ProgramFile[];
  readonly stats: Record<string, Record<string, number>>;
}

export function compile(o: CompileOptions): CompileResult {
  if (o.dumpAfter !== undefined && !PASSES.some((p) => p.name === o.dumpAfter)) {
    throw new UserError(
      `--dump-after ${o.dumpAfter}: no such pass; passes: ${PASSES.map((p) => p.name).join(', ')}`,
    );
  }
  const cfg = loadModelConfig(o.model, o.overrides ?? []);
  const seqLength = o.seqLength ?? cfg.training.seq_length;
  const mbs = o.microBatchSize ?? 1;
  const sizes: ParallelSizes = {
    nnodes: o.nnodes ?? 1,
    nprocPerNode: o.nprocPerNode ?? 1,
    tp: o.parallel?.tp ?? 1,
    pp: o.parallel?.pp ?? 1,
    vpp: o.parallel?.vpp ?? 1,
    ep: o.parallel?.ep ?? 1,
    etp: o.parallel?.etp,
    cp: o.parallel?.cp ?? 1,
  };
  const { world, dp } = resolveSizes(sizes);
  const gbs = o.globalBatchSize ?? mbs * Math.max(1, Math.floor(dp));
  // every layout rule, each with its own message (compiler/parallel/validate.ts)
  validateParallel({
    sizes,
    config: cfg,
    seqLength,
    microBatchSize: mbs,
    globalBatchSize: gbs,
    microbatchGroupSize: o.microbatchGroupSize,
    decoderFirstPipelineNumLayers: o.decoderFirstPipelineNumLayers,
    decoderLastPipelineNumLayers: o.decoderLastPipelineNumLayers,
    sequenceParallel: o.sequenceParallel,
  });
  const splitting = sizes.tp > 1 || sizes.pp > 1 || sizes.ep > 1;
  if (splitting) {
    throw new UserError(
      `the layout is valid (${world} ranks, dp ${dp}), but the passes that split a step over ranks (tensor, pipeline, expert) are not built yet; only data parallelism is`,
    );
  }
  const topology = buildTopology(sizes);
  const ranks = Array.from({ length: world }, (_, r) => r);
  const numMicrobatches = gbs / (mbs * dp);
  const optimizer = { ...DEFAULT_OPTIMIZER, ...o.optimizer };
  const dump = (pass: string, g: Graph) => {
    if (o.dumpAfter === pass) o.onDump?.(printGraph(g));
  };

  const forward = buildForwardGraph(cfg, {
    seqLength,
    microBatchSize: mbs,
    maxVisualTokens: o.maxVisualTokens,
    numMicrobatches,
  });
  assertValid(forward, 'after pass build');
  dump('build', forward);
  const { graph, stats: adStats } = autodiff(forward, optimizer);
  assertValid(graph, 'after pass autodiff (passes run: build, autodiff)');
  dump('autodiff', graph);

  const program = emitProgram(graph, { numMicrobatches, id: 'p0', dataParallel: { size: dp } });
  const clobbered = checkMemoryReuse(program);
  if (clobbered.length) {
    const c = clobbered[0];
    throw new Error(
      `memory plan: instruction ${c.instruction} reads ${c.buffer} after ${c.clobberedBy} reused its bytes`,
    );
  }
  const counts = countParams(forward, cfg);
  const plan: PlanFile = {
    format: PLAN_FORMAT,
    version: PLAN_VERSION,
    createdBy: 'lfc 0.1.0',
    model: { name: cfg.name, config: cfg.model, paramsTotal: counts.total.total },
    training: {
      seqLength,
      microBatchSize: mbs,
      globalBatchSize: gbs,
      numMicrobatches,
      maxVisualTokens: forward.symbols.find((s) => s.name === 'Nv')!.bound,
      optimizer,
    },
    topology: {
      worldSize: world,
      nnodes: sizes.nnodes,
      nprocPerNode: sizes.nprocPerNode,
      sizes: { tp: sizes.tp, pp: sizes.pp, vpp: sizes.vpp, dp, ep: sizes.ep, cp: sizes.cp },
    },
    groups: topology.groups.map((g) => ({ name: g.names[0], ranks: g.ranks })),
    rankGroups: Object.fromEntries(
      GROUP_KINDS.filter((k) => k !== 'embd').map((k) => [
        k,
        ranks.map((r) => topology.groupOf(k, r)!.id),
      ]),
    ),
    dataParallel: { size: dp, rankIndex: ranks.map((r) => topology.coords(r).dp) },
    symbols: forward.symbols,
    params: forward.params.map((p) => ({
      name: p.name,
      dtype: p.type.dtype,
      shape: p.type.shape as number[],
      init: p.init,
      trainable: p.trainable,
      module: p.module,
      weightDecay: p.trainable ? weightDecayOf(p, optimizer) : 0,
    })),
    rankPrograms: ranks.map(() => 'p0'),
  };
  // the plan verifier: collectives match per group, sends meet receives, every cross-stream
  // read is ordered by an event, and all ranks together finish the step
  const verifyStart = performance.now();
  assertPlanValid(plan, new Map([[program.id, program]]));
  const verifyMs = performance.now() - verifyStart;
  return {
    config: cfg,
    graph,
    plan,
    programs: [program],
    stats: {
      autodiff: { ...adStats },
      emit: {
        instructions: program.instructions.length,
        buffers: program.buffers.length,
        arenaBytes: program.regions.arena,
        arenaLowerBoundBytes: program.arenaLowerBoundBytes,
      },
      verify: { ms: verifyMs },
    },
  };
}

/**
 * Writes a plan directory atomically: into a temporary sibling, then renamed over DIR. An
 * existing DIR is replaced only when it holds an lfc plan (nothing else is ever deleted).
 */
export function writePlan(dir: string, plan: PlanFile, programs: readonly ProgramFile[]): void {
  if (existsSync(dir)) {
    const entries = readdirSync(dir);
    if (entries.length && !entries.includes('plan.json')) {
      throw new UserError(`${dir} exists and is not an lfc plan directory; choose another -o`);
    }
  }
  const tmp = join(dirname(dir), `.${basename(dir)}.tmp-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(join(tmp, 'programs'), { recursive: true });
  writeFileSync(join(tmp, 'plan.json'), JSON.stringify(plan, null, 1) + '\n');
  for (const p of programs)
    writeFileSync(join(tmp, 'programs', `${p.id}.json`), JSON.stringify(p) + '\n');
  if (existsSync(dir)) {
    const old = `${tmp}-old`;
    renameSync(dir, old);
    renameSync(tmp, dir);
    rmSync(old, { recursive: true, force: true });
  } else {
    mkdirSync(dirname(dir), { recursive: true });
    renameSync(tmp, dir);
  }
}
