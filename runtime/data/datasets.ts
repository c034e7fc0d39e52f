// Opens a dataset by what its path is: a `.jsonl` file (jsonl.ts), or a `.tar` shard or a folder
// of them (webdataset.ts). Anything else is refused saying what is accepted.

import { readdirSync, statSync } from 'node:fs';
import { cannotRead, UserError } from '../../compiler/errors.js';
import { openJsonl } from './jsonl.js';
import type { Dataset } from './records.js';
import { openWebDataset } from './webdataset.js';

export type { Dataset } from './records.js';

const ACCEPTED = 'a .jsonl file, a .tar shard, or a folder of .tar shards';

export async function openDataset(path: string): Promise<Dataset> {
  let isDirectory: boolean;
  try {
    isDirectory = statSync(path).isDirectory();
  } catch (e) {
    throw new UserError(cannotRead(path, e));
  }
  if (!isDirectory) {
    if (path.endsWith('.jsonl')) return openJsonl(path);
    if (path.endsWith('.tar')) return openWebDataset(path);
    throw new UserError(`${path}: not a dataset (expected ${ACCEPTED})`);
  }
  const names = readdirSync(path);
  if (names.includes('.nv-meta') || names.some((n) => n.endsWith('.tar')))
    return openWebDataset(path);
  throw new UserError(
    `${path}: a folder without .tar shards is not a dataset (expected ${ACCEPTED})`,
  );
}
