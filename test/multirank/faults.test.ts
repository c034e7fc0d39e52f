// A rank that dies ends the run: kill -9 of one rank of a launched 2-rank run makes the launcher
// exit non-zero within 30 s, naming the rank, with no rank process left behind. Ctrl-C (SIGINT)
// to a launcher process ends every rank within 10 s. The launcher's error quotes a failed rank's
// message, not the last frame of its stack trace.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import { lastMessage } from '../../runtime/launch.js';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-faults-'));
const plan = join(dir, 'dp2');

beforeAll(async () => {
  const r = await cli('compile', 'tiny-vlm', '--nproc-per-node', '2', '-o', plan);
  expect(r.err).toBe('');
}, 60_000);

/** Child processes of this process that are ranks of a launch: rank → pid. */
function rankProcesses(): Map<number, number> {
  let pids: number[];
  try {
    pids = execFileSync('pgrep', ['-P', String(process.pid)], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .map(Number);
  } catch {
    return new Map(); // pgrep: none
  }
  const ranks = new Map<number, number>();
  for (const pid of pids) {
    try {
      const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
      const rank = env.find((e) => e.startsWith('RANK='));
      if (env.includes('LFC_LAUNCHED=1') && rank) ranks.set(Number(rank.slice(5)), pid);
    } catch {
      // gone meanwhile
    }
  }
  return ranks;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('faults', () => {
  it('kill -9 of a rank: the launcher exits non-zero naming it within 30 s, no rank left', async () => {
    const metrics = join(dir, 'metrics.jsonl');
    const run = cli('run', plan, '--steps', '100000', '--metrics', metrics, '--quiet');
    let ended: string | undefined;
    void run.then((r) => (ended = r.err || `exit ${r.code}`));
    // wait until the ranks train
    const t0 = Date.now();
    while (!(existsSync(metrics) && readFileSync(metrics, 'utf8').length > 0)) {
      if (ended !== undefined) throw new Error(`the run ended before training: ${ended}`);
      if (Date.now() - t0 > 60_000) throw new Error('the ranks did not start training');
      await sleep(100);
    }
    const ranks = rankProcesses();
    expect([...ranks.keys()].sort()).toEqual([0, 1]);
    process.kill(ranks.get(1)!, 'SIGKILL');
    const killedAt = Date.now();
    const r = await run;
    expect(Date.now() - killedAt).toBeLessThan(30_000);
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/rank 1 was killed by SIGKILL/);
    expect(r.err.trim().split('\n')).toHaveLength(1);
    expect(rankProcesses().size).toBe(0);
    for (const pid of ranks.values()) expect(() => process.kill(pid, 0)).toThrow();
  }, 120_000);

  it('Ctrl-C to the launcher: it and every rank are gone within 10 s', async () => {
    const metrics = join(dir, 'metrics-int.jsonl');
    const launcher = spawn(
      process.execPath,
      [join(projectRoot(), 'bin/lfc.js'), 'run', plan, '--steps', '100000', '--metrics', metrics],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let err = '';
    launcher.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number | null>((resolve) => launcher.on('exit', (c) => resolve(c)));
    const t0 = Date.now();
    while (!(existsSync(metrics) && readFileSync(metrics, 'utf8').length > 0)) {
      if (Date.now() - t0 > 60_000) throw new Error(`the ranks did not start training: ${err}`);
      await sleep(100);
    }
    // the ranks: children of the launcher process
    const pids = execFileSync('pgrep', ['-P', String(launcher.pid)], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .map(Number);
    expect(pids.length).toBeGreaterThanOrEqual(2);
    launcher.kill('SIGINT');
    const sentAt = Date.now();
    const code = await exited;
    expect(code).not.toBe(0);
    expect(err).toMatch(/interrupted/);
    for (const pid of pids) {
      while (Date.now() - sentAt < 10_000) {
        try {
          process.kill(pid, 0);
        } catch {
          break; // gone
        }
        await sleep(100);
      }
      expect(() => process.kill(pid, 0)).toThrow();
    }
    expect(Date.now() - sentAt).toBeLessThan(10_000);
  }, 120_000);
});

describe("a failed rank's message", () => {
  it('is the line above a stack trace, without the lfc prefix', () => {
    const out = [
      'step 1/4',
      'lfc: internal error: Error: ENOSPC: no space left on device, write',
      '    at writeSync (node:fs:939:3)',
      '    at async <anonymous> (/work/runtime/rank-main.ts:41:3)',
      '',
    ].join('\n');
    expect(lastMessage(out)).toBe('internal error: Error: ENOSPC: no space left on device, write');
    expect(lastMessage('lfc: error: --load x: not a checkpoint\n')).toBe(
      '--load x: not a checkpoint',
    );
    expect(lastMessage('\n   \n')).toBeUndefined();
  });
});
