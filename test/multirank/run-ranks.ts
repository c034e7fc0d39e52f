// Runs every rank of a hand-built multi-rank test (a WorkerSpec) as a process of its own
// (rank-worker.ts), for collectives.test.ts and reduce-scatter.test.ts.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { WorkerSpec } from './rank-worker.js';

const WORKER = fileURLToPath(new URL('./rank-worker.ts', import.meta.url));
const TSX = createRequire(import.meta.url).resolve('tsx');

export type Result = {
  /** number lists, or base64 of the bytes with the spec's `binary` */
  buffers?: Record<number, number[] | string>;
  communicators?: { name: string; transport: string; direct: boolean }[];
  error?: string;
  /** when the steps began and the error came (ms since the epoch), on a rank that failed */
  stepStartMs?: number;
  failedMs?: number;
  retryError?: string;
};

/** Runs every rank of the spec as a process; resolves with each rank's printed result. */
export async function runRanks(
  spec: WorkerSpec,
  world: number,
  env: NodeJS.ProcessEnv = process.env,
): Promise<Result[]> {
  const dir = mkdtempSync(join(tmpdir(), 'lfc-coll-'));
  const file = join(dir, 'spec.json');
  writeFileSync(file, JSON.stringify(spec));
  const children = range(world, (rank) =>
    spawn(process.execPath, ['--import', TSX, WORKER, file, String(rank)], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env,
    }),
  );
  const results = children.map(
    (child) =>
      new Promise<Result>((resolve) => {
        let out = '';
        child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
        // 'close', not 'exit': a rank's result can be megabytes, still unread at its exit
        child.on('close', (code, signal) => resolve(resultOf(out, code, signal)));
      }),
  );
  // idle ranks (the timeout test) end once the others are done
  const idle = spec.idle ?? [];
  await Promise.all(results.filter((_, r) => !idle.includes(r)));
  for (const r of idle) children[r].kill('SIGKILL');
  const all = await Promise.all(results);
  rmSync(dir, { recursive: true, force: true });
  return all;
}

/** A rank's result: its last line of output, or what went wrong when that line is not JSON. */
function resultOf(out: string, code: number | null, signal: NodeJS.Signals | null): Result {
  if (!out) return { error: 'killed' };
  const last = out.trim().split('\n').pop()!;
  try {
    return JSON.parse(last) as Result;
  } catch {
    const how = signal ? `killed by ${signal}` : `exit code ${code}`;
    return { error: `unreadable result (${how}): ${last.slice(0, 200)}` };
  }
}

export function range<T>(n: number, f: (i: number) => T): T[] {
  return Array.from({ length: n }, (_, i) => f(i));
}
