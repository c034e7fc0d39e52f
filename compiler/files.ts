// File-system helpers the layers above share.

import { mkdirSync, statSync, type Stats } from 'node:fs';
import { dirname, resolve } from 'node:path';

/**
 * Makes a directory and the missing ones above it, as `mkdirSync(path, { recursive: true })`, one
 * level at a time. Node 20's recursive mkdir never returns where a directory refuses new entries
 * with ENOENT (`/proc/self/x/y`: it makes the parent, which exists, and tries the child again);
 * here such a refusal is thrown as the system error it is (one line, exit 1: compiler/errors.ts).
 */
export function makeDirs(path: string): void {
  const missing: string[] = [];
  for (let at = resolve(path); ;) {
    if (isDirectory(at)) break;
    missing.push(at);
    const up = dirname(at);
    if (up === at) break;
    at = up;
  }
  for (const dir of missing.reverse()) {
    try {
      mkdirSync(dir);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST' || !isDirectory(dir)) throw e;
    }
  }
}

const isDirectory = (path: string) => statOf(path)?.isDirectory() ?? false;

/** the path's stat, or undefined where nothing is (a path under a file included) */
export function statOf(path: string): Stats | undefined {
  try {
    return statSync(path, { throwIfNoEntry: false });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOTDIR') return undefined;
    throw e;
  }
}
