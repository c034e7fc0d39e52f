// Option parsers shared by the commands: every bad value is a UserError naming the flag.

import { mkdtempSync, rmdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { InvalidArgumentError } from 'commander';
import { UserError } from '../compiler/errors.js';
import { statOf } from '../compiler/files.js';

/** a count flag's largest value: every count lfc takes fits an int32 */
const MAX_COUNT = 2 ** 31 - 1;

export function positiveInt(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (!/^\s*\d+\s*$/.test(v) || !Number.isInteger(n) || n < 1) {
      throw new InvalidArgumentError(`${flag} must be a positive integer, got '${v}'`);
    }
    if (n > MAX_COUNT) throw new InvalidArgumentError(`${flag} ${v.trim()} is past ${MAX_COUNT}`);
    return n;
  };
}

export function imageSize(v: string): [number, number] {
  const m = /^(\d+)(?:x(\d+))?$/.exec(v.trim());
  if (!m) throw new InvalidArgumentError(`--image-size must be HxW or N pixels, got '${v}'`);
  const h = Number(m[1]);
  const w = m[2] ? Number(m[2]) : h;
  if (h < 1 || w < 1) throw new InvalidArgumentError(`--image-size must be positive, got '${v}'`);
  return [h, w];
}

export function positiveNumber(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || n <= 0) {
      throw new InvalidArgumentError(`${flag} must be a positive number, got '${v}'`);
    }
    return n;
  };
}

export function nonNegativeInt(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (!/^\s*\d+\s*$/.test(v) || !Number.isInteger(n) || n < 0) {
      throw new InvalidArgumentError(`${flag} must be a non-negative integer, got '${v}'`);
    }
    return n;
  };
}

export function nonNegativeNumber(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || n < 0) {
      throw new InvalidArgumentError(`${flag} must be a non-negative number, got '${v}'`);
    }
    return n;
  };
}

export function atLeastOne(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || n < 1)
      throw new InvalidArgumentError(`${flag} must be a number ≥ 1, got '${v}'`);
    return n;
  };
}

/**
 * Refuses, before any work is done, an output path that cannot be written: a directory flag
 * naming a file, a file flag naming a directory, a path under a file, or one whose directory
 * takes no new entries (read-only, not the user's, or /proc). Without it the operating system
 * refused it after the work (a run's --trace after its last step) with exit 1. Outputs are
 * written beside their path and renamed into it, so the directory that must take entries is the
 * path's own parent, or the nearest existing directory above a path not there yet.
 */
export function checkOutputPath(flag: string, path: string, kind: 'dir' | 'file'): void {
  if (path.trim() === '') throw new UserError(`${flag} needs a path, got '${path}'`);
  const at = statOf(path);
  if (at) {
    if (kind === 'dir' && !at.isDirectory())
      throw new UserError(`${flag} ${path}: a file is there, not a directory`);
    if (kind === 'file' && at.isDirectory())
      throw new UserError(`${flag} ${path}: a directory is there; give a file`);
    takesEntries(flag, path, dirname(path));
    return;
  }
  for (let up = dirname(path); ; up = dirname(up)) {
    const st = statOf(up);
    if (st) {
      if (!st.isDirectory())
        throw new UserError(`${flag} ${path}: ${up} is a file, not a directory`);
      takesEntries(flag, path, up);
      return;
    }
    if (dirname(up) === up) return;
  }
}

/** refuses a directory in which an entry cannot be made, by making one and removing it */
function takesEntries(flag: string, path: string, dir: string): void {
  let probe: string;
  try {
    probe = mkdtempSync(join(dir, '.lfc-probe-'));
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? String(e);
    throw new UserError(`${flag} ${path}: cannot write in ${dir} (${code})`);
  }
  rmdirSync(probe);
}
