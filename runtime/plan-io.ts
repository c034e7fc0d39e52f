// Reading a plan directory, with every problem a UserError that names the file.

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { oneLine, UserError } from '../compiler/errors.js';
import { shapeProblem, type Shape } from './json-shape.js';
import { checkModelParts } from '../compiler/frontend/config.js';
import {
  PLAN_FORMAT,
  PLAN_VERSION,
  PROGRAM_FORMAT,
  type PlanFile,
  type ProgramFile,
} from '../compiler/plan/format.js';

function readJson(path: string, what: string): unknown {
  if (!existsSync(path)) throw new UserError(`${path}: no ${what} here`);
  try {
    return JSON.parse(readFileSync(path, 'utf8'));
  } catch (e) {
    throw new UserError(`${path}: malformed ${what}: ${(e as Error).message.split('\n')[0]}`);
  }
}

// ---- the shape of plan.json, as the runtime reads it ---------------------------------------------
// A plan is lfc compile's output, but a file a user can edit: every field the runtime reads is
// checked for its type here, so a damaged plan is a one-line error naming the field, never a
// TypeError later. The model config is checked by the compiler's own validation (loadModelConfig
// reads it again from the plan: runtime/train.ts). The programs are checked by the native runtime
// when it loads them (runtime-native/src/core/program.cc).

const OPTIMIZER: Shape = {
  lr: 'number',
  beta1: 'number',
  beta2: 'number',
  eps: 'number',
  weightDecay: 'number',
  clipNorm: 'number',
};

const PLAN_SHAPE: Shape = {
  model: { name: 'string', config: 'object' },
  training: {
    seqLength: 'positive',
    microBatchSize: 'positive',
    globalBatchSize: 'positive',
    numMicrobatches: 'positive',
    maxVisualTokens: 'count',
    precision: { optional: { compute: 'string', grad: 'string' } },
    optimizer: OPTIMIZER,
  },
  topology: {
    worldSize: 'positive',
    nnodes: 'positive',
    nprocPerNode: 'positive',
    sizes: { record: 'positive' },
    pipelineLayers: { optional: { list: 'count' } },
  },
  groups: { list: { name: 'string', ranks: { list: 'count' } } },
  rankGroups: { record: { list: 'integer' } },
  dataParallel: { size: 'positive', rankIndex: { list: 'count' } },
  symbols: { list: { name: 'string', bound: 'count', expected: { optional: 'count' } } },
  params: {
    list: {
      name: 'string',
      dtype: 'string',
      shape: { list: 'count' },
      init: 'string',
      trainable: 'boolean',
      weightDecay: 'number',
    },
  },
  rankPrograms: { list: 'string' },
};

export interface LoadedPlan {
  readonly dir: string;
  readonly plan: PlanFile;
  /** program text by id, handed to the native runtime as is */
  readonly programTexts: ReadonlyMap<string, string>;
  readonly programs: ReadonlyMap<string, ProgramFile>;
}

/** plan.json of a plan directory, checked (PLAN_SHAPE); its programs are not read. */
export function readPlanFile(dir: string): PlanFile {
  if (!existsSync(dir))
    throw new UserError(`${dir}: no such plan directory (make one with lfc compile -o ${dir})`);
  const planPath = join(dir, 'plan.json');
  const plan = readJson(planPath, 'plan.json (is this an lfc plan directory?)') as PlanFile;
  if (plan?.format !== PLAN_FORMAT)
    throw new UserError(
      `${planPath}: not an lfc plan (format ${oneLine(JSON.stringify(plan?.format) ?? 'none')})`,
    );
  if (plan.version !== PLAN_VERSION) {
    throw new UserError(
      `${planPath}: plan schema version ${oneLine(JSON.stringify(plan.version) ?? 'none')}; this lfc runs version ${PLAN_VERSION} (recompile it)`,
    );
  }
  const problem = shapeProblem(plan, PLAN_SHAPE);
  if (problem) throw new UserError(`${planPath}: malformed plan: ${problem}`);
  checkModelParts(plan.model.config, `${planPath}: model.config`);
  const world = plan.topology.worldSize;
  if (plan.rankPrograms.length !== world)
    throw new UserError(
      `${planPath}: malformed plan: ${plan.rankPrograms.length} rankPrograms for a world of ${world}`,
    );
  if (plan.dataParallel.rankIndex.length !== world)
    throw new UserError(`${planPath}: malformed plan: dataParallel.rankIndex is not one per rank`);
  for (const [kind, groups] of Object.entries(plan.rankGroups))
    if (groups.length !== world || groups.some((g) => g >= plan.groups.length))
      throw new UserError(
        `${planPath}: malformed plan: rankGroups.${kind} is not one group index (< ${plan.groups.length}) per rank`,
      );
  const mismatch = trainingProblem(plan);
  if (mismatch) throw new UserError(`${planPath}: malformed plan: ${mismatch}`);
  return plan;
}

/**
 * What makes `training` disagree with the sizes the programs' buffers were planned at (the
 * symbols S and Nv) or with itself: the runtime makes each step's data from `training`, so a
 * sequence longer than S reached the native loader as an internal error, and a shorter one, or
 * fewer microbatches, trained another step than the plan's without a word.
 */
function trainingProblem(plan: PlanFile): string | undefined {
  const t = plan.training;
  const bound = (name: string) => plan.symbols.find((s) => s.name === name)?.bound;
  const S = bound('S');
  const Nv = bound('Nv');
  if (S === undefined || Nv === undefined)
    return `symbols must declare S and Nv (the microbatch's tokens and visual tokens)`;
  if (t.seqLength * t.microBatchSize !== S)
    return `training.seqLength ${t.seqLength} × microBatchSize ${t.microBatchSize} is not the ${S} tokens of symbol S`;
  if (t.maxVisualTokens !== Nv)
    return `training.maxVisualTokens ${t.maxVisualTokens} is not the ${Nv} of symbol Nv`;
  const dp = plan.dataParallel.size;
  if (t.numMicrobatches * t.microBatchSize * dp !== t.globalBatchSize)
    return `training.numMicrobatches ${t.numMicrobatches} × microBatchSize ${t.microBatchSize} × data-parallel ${dp} is not globalBatchSize ${t.globalBatchSize}`;
  return undefined;
}

export function readPlan(dir: string): LoadedPlan {
  const plan = readPlanFile(dir);
  const programTexts = new Map<string, string>();
  const programs = new Map<string, ProgramFile>();
  for (const id of new Set(plan.rankPrograms)) {
    const path = join(dir, 'programs', `${id}.json`);
    if (!existsSync(path))
      throw new UserError(`${path}: program ${id} named by plan.json is missing`);
    const text = readFileSync(path, 'utf8');
    let p: ProgramFile;
    try {
      p = JSON.parse(text) as ProgramFile;
    } catch (e) {
      throw new UserError(`${path}: malformed program: ${(e as Error).message.split('\n')[0]}`);
    }
    if (p?.format !== PROGRAM_FORMAT)
      throw new UserError(`${path}: not an lfc program (format ${JSON.stringify(p?.format)})`);
    if (p.version !== PLAN_VERSION) {
      throw new UserError(
        `${path}: program schema version ${p.version}; this lfc runs version ${PLAN_VERSION} (recompile it)`,
      );
    }
    programTexts.set(id, text);
    programs.set(id, p);
  }
  return { dir, plan, programTexts, programs };
}
