// Where the project's own files are, from source (tests) or from dist/ (the built CLI).

import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

let root: string | undefined;

export function projectRoot(): string {
  if (root) return root;
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) || !existsSync(join(dir, 'configs'))) {
    const up = dirname(dir);
    if (up === dir)
      throw new Error('cannot find the lfc project root (package.json beside configs/)');
    dir = up;
  }
  root = dir;
  return dir;
}

export function configsDir(...parts: string[]): string {
  return join(projectRoot(), 'configs', ...parts);
}
