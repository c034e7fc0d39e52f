// Reading a plan directory, with every problem a UserError that names the file.

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../compiler/errors.js';
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

export interface LoadedPlan {
  readonly dir: string;
  readonly plan: PlanFile;
  /** program text by id, handed to the native runtime as is */
  readonly programTexts: ReadonlyMap<string, string>;
  readonly programs: ReadonlyMap<string, ProgramFile>;
}

export function readPlan(dir: string): LoadedPlan {
  if (!existsSync(dir))
    throw new UserError(`${dir}: no such plan directory (make one with lfc compile -o ${dir})`);
  const planPath = join(dir, 'plan.json');
  const plan = readJson(planPath, 'plan.json (is this an lfc plan directory?)') as PlanFile;
  if (plan?.format !== PLAN_FORMAT)
    throw new UserError(`${planPath}: not an lfc plan (format ${JSON.stringify(plan?.format)})`);
  if (plan.version !== PLAN_VERSION) {
    throw new UserError(
      `${planPath}: plan schema version ${plan.version}; this lfc runs version ${PLAN_VERSION} (recompile it)`,
    );
  }
  for (const k of ['training', 'params', 'rankPrograms', 'symbols'] as const) {
    if (!plan[k]) throw new UserError(`${planPath}: malformed plan: '${k}' is missing`);
  }
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
