// Cluster launch paths on one machine: two launchers (`--nnodes 2 --node-rank 0|1 --master-addr
// 127.0.0.1`) train together, and ranks started by hand with Slurm's variables train together;
// both give the same losses as `--nproc-per-node 2`.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-cluster-'));
const plan = join(dir, 'dp2');
const LFC = join(projectRoot(), 'bin/lfc.js');

/** runs `lfc args…` in a process of its own; resolves with its exit code and output */
function lfc(args: string[], env: Record<string, string> = {}) {
  return new Promise<{ code: number | null; out: string }>((resolve) => {
    const child = spawn(process.execPath, [LFC, ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    child.on('close', (code) => resolve({ code, out }));
  });
}

const losses = (path: string) =>
  readFileSync(path, 'utf8')
    .trim()
    .split('\n')
    .map((l) => (JSON.parse(l) as { loss: number }).loss);

/** a free-enough port per case: the test's pid spreads parallel CI runs */
const port = (k: number) => String(20000 + ((process.pid * 7 + k * 101) % 20000));

let reference: number[] = [];

beforeAll(async () => {
  expect((await cli('compile', 'tiny-vlm', '--nproc-per-node', '2', '-o', plan)).err).toBe('');
  const ref = join(dir, 'ref.jsonl');
  const r = await lfc(['run', plan, '--nproc-per-node', '2', '--steps', '3', '--metrics', ref]);
  expect(r.code, r.out).toBe(0);
  reference = losses(ref);
  expect(reference).toHaveLength(3);
}, 120_000);

describe('cluster launch paths on one machine', () => {
  it('two launchers, --nnodes 2 --node-rank 0|1 --master-addr 127.0.0.1', async () => {
    const p = port(1);
    const node = (r: number) =>
      lfc([
        'run',
        plan,
        '--nnodes',
        '2',
        '--node-rank',
        String(r),
        '--nproc-per-node',
        '1',
        '--master-addr',
        '127.0.0.1',
        '--master-port',
        p,
        '--steps',
        '3',
        '--metrics',
        join(dir, `nodes${r}.jsonl`),
      ]);
    const [a, b] = await Promise.all([node(0), node(1)]);
    expect(a.code, a.out).toBe(0);
    expect(b.code, b.out).toBe(0);
    expect(losses(join(dir, 'nodes0.jsonl'))).toEqual(reference);
  }, 120_000);

  it("ranks started by hand with Slurm's variables", async () => {
    const p = port(2);
    const rank = (r: number) =>
      lfc(['run', plan, '--steps', '3', '--metrics', join(dir, `slurm${r}.jsonl`)], {
        SLURM_PROCID: String(r),
        SLURM_NTASKS: '2',
        SLURM_LOCALID: String(r),
        MASTER_ADDR: '127.0.0.1',
        MASTER_PORT: p,
      });
    const [a, b] = await Promise.all([rank(0), rank(1)]);
    expect(a.code, a.out).toBe(0);
    expect(b.code, b.out).toBe(0);
    expect(losses(join(dir, 'slurm0.jsonl'))).toEqual(reference);
  }, 120_000);
});
