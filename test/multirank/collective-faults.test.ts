// A failure inside a two-phase collective fails every rank within 5 s, through the communicators
// (and the store), never the collective timeout (60 s here): a rank whose receive bound is
// exceeded inside all_to_all_v, a gather_v root whose row count is wrong, and a peer killed
// between the two phases, each forced by the runtime's test-only LFC_TEST_FAULT, on shared memory
// and over TCP. Every rank's error names the rank that failed and its check; the same runtime
// then refuses another step with a clear error. `lfc run` exits non-zero naming the rank and the
// check, under lfc's launcher and with ranks started as torchrun starts them (no launcher).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import { cli } from '../helpers.js';
import { ProgramBuilder } from '../runtime/program-builder.js';
import type { WorkerSpec } from './rank-worker.js';
import { range, runRanks, type Result } from './run-ranks.js';

const H = 3; // values per row
const P = 2;
const BOUND_MS = 5_000;
/** how long a worker lives on after its step failed */
const HOLD_MS = 1_000;

const dir = mkdtempSync(join(tmpdir(), 'lfc-collective-faults-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** One all_to_all_v, or one gather_v to root 0, over both ranks. */
function spec(op: 'all_to_all_v' | 'gather_v', prefix: string): WorkerSpec {
  const b = new ProgramBuilder('p');
  const g = { group: 'dp', group_size: P };
  b.input('tokens', 'i32', ['S']);
  const fill: Record<string, number[]> = {};
  if (op === 'all_to_all_v') {
    const x = b.param('a2a.x', [4, H], { trainable: false }).buffer;
    const send = b.param('a2a.send', [P], { dtype: 'i32', trainable: false }).buffer;
    const y = b.arena('a2a.y', 'f32', [4 * P, H]);
    const recv = b.arena('a2a.recv', 'i32', [P]);
    b.instr('comm', 'all_to_all_v', [x, send], [y, recv], { ...g, out_rows: [`${4 * P}`] });
    fill[String(send)] = [2, 2];
  } else {
    const x = b.arena('gv.x', 'f32', ['S', H], 0);
    const y = b.arena('gv.y', 'f32', [8 * P, H]);
    b.instr('comm', 'gather_v', [x], [y], { ...g, root: 0, out_rows: [`${8 * P}`] });
  }
  const store = mkdtempSync(join(dir, 'rdzv-'));
  return {
    programs: { p: b.build() },
    rankPrograms: range(P, () => 'p'),
    comm: {
      worldSize: P,
      store: `file:${store}`,
      prefix,
      groups: [{ name: 'dp[0]', ranks: range(P, (r) => r) }],
      rankGroups: { dp: range(P, () => 0) },
      contexts: [{ group: 0, stream: 'comm' }],
      // the old behaviour (peers wait for the timeout) would take this long
      timeoutMs: 60_000,
    },
    ranks: range(P, (r) => ({ tokens: r + 2, fill })),
    read: [],
    retryAfterFailure: true,
    holdAfterFailureMs: HOLD_MS,
  };
}

/** How long after the last rank began its step the last rank failed. */
function spreadMs(results: readonly Result[]): number {
  const failed = results.filter((r) => r.failedMs !== undefined);
  return (
    Math.max(...failed.map((r) => r.failedMs!)) - Math.max(...failed.map((r) => r.stepStartMs!))
  );
}

const cases = [
  {
    fault: 'all_to_all_v_bound:rank=1',
    op: 'all_to_all_v',
    cause: /rank 1 failed in all_to_all_v: receive bound exceeded: /,
  },
  {
    fault: 'gather_v_rows:rank=0',
    op: 'gather_v',
    cause: /rank 0 failed in gather_v: row count wrong: /,
  },
  {
    fault: 'kill_between_phases:rank=1',
    op: 'all_to_all_v',
    cause: /rank 1 (\(process \d+\) exited|closed its connection)/,
  },
] as const;

describe('a failure inside a two-phase collective', () => {
  it.each(
    cases.flatMap((c) => (['shared memory', 'tcp'] as const).map((t) => ({ ...c, transport: t }))),
  )(
    '$fault fails every rank within 5 s, naming it ($transport)',
    async ({ fault, op, cause, transport }) => {
      const env = {
        ...process.env,
        LFC_COMM_SHM: transport === 'tcp' ? '0' : '1',
        LFC_TEST_FAULT: fault,
      };
      const results = await runRanks(spec(op, `${fault}-${transport}`), P, env);
      const killed = fault.startsWith('kill') ? 1 : -1;
      results.forEach((res, r) => {
        if (r === killed) return expect(res.error).toBe('killed');
        expect(res.error).toMatch(new RegExp(`^step failed at instruction 0 \\(${op}`));
        // the failing rank states its check; its peers name the rank and the check
        expect(res.error).toMatch(fault.includes(`rank=${r}`) ? /(bound exceeded|wrong): / : cause);
        // one line, no stack
        expect(res.error).not.toMatch(/\n/);
        // the runtime refuses to step again
        expect(res.retryError).toMatch(
          /^step: the communicators are broken by an earlier failure \(rank \d .*\); start a new run$/,
        );
      });
      expect(spreadMs(results)).toBeLessThan(BOUND_MS);
      // every rank failed while the failing one still ran: through the communicators, not its end
      if (killed < 0) {
        const origin = results[Number(fault.slice(-1))];
        for (const res of results) expect(res.failedMs!).toBeLessThan(origin.failedMs! + HOLD_MS);
      }
    },
    30_000,
  );
});

// The failing rank's compute stream is blocked in an all_reduce that its peer reaches only after
// the all_to_all_v (an event): the abort wakes it, so the step ends at once rather than after
// the executor's 5 s wait for threads blocked in collectives.
describe("a failure wakes the failing rank's other streams", () => {
  it.each(['shared memory', 'tcp'] as const)(
    'an all_reduce blocked on the compute stream ends with the step (%s)',
    async (transport) => {
      const g = { group: 'dp', group_size: P };
      let sendCounts = -1; // the buffer, the same in both programs
      const programs = Object.fromEntries(
        range(P, (r) => {
          const b = new ProgramBuilder(`r${r}`);
          b.input('tokens', 'i32', ['S']);
          const x = b.param('a2a.x', [4, H], { trainable: false }).buffer;
          const send = b.param('a2a.send', [P], { dtype: 'i32', trainable: false }).buffer;
          const y = b.arena('a2a.y', 'f32', [4 * P, H]);
          const recv = b.arena('a2a.recv', 'i32', [P]);
          sendCounts = send;
          const sum = b.arena('ar.x', 'f32', [4]);
          const after = b.event();
          b.instr(
            'comm',
            'all_to_all_v',
            [x, send],
            [y, recv],
            { ...g, out_rows: [`${4 * P}`] },
            { record: [after] },
          );
          // rank 0 joins the all_reduce after its all_to_all_v, rank 1 at once
          b.instr('compute', 'all_reduce', [sum], [sum], g, { wait: r === 0 ? [after] : [] });
          return [`r${r}`, b.build()];
        }),
      );
      const base = spec('all_to_all_v', `wake-${transport}`);
      const s: WorkerSpec = {
        ...base,
        programs,
        rankPrograms: range(P, (r) => `r${r}`),
        comm: {
          ...base.comm,
          contexts: [
            { group: 0, stream: 'comm' },
            { group: 0, stream: 'compute' },
          ],
        },
        ranks: range(P, (r) => ({ tokens: r + 2, fill: { [String(sendCounts)]: [2, 2] } })),
      };
      const env = {
        ...process.env,
        LFC_COMM_SHM: transport === 'tcp' ? '0' : '1',
        LFC_TEST_FAULT: 'all_to_all_v_bound:rank=1',
      };
      const results = await runRanks(s, P, env);
      for (const res of results) {
        expect(res.error).toMatch(/receive bound exceeded: /);
        expect(res.error).not.toMatch(/left behind/);
        expect(res.failedMs! - res.stepStartMs!).toBeLessThan(2_000);
      }
    },
    30_000,
  );
});

describe('lfc run: a failed collective ends the run', () => {
  // an all_to_all_v per MoE layer (ep 2), a gather_v to rank 0 (full hetero DP over pp 2)
  const moe = join(dir, 'moe-ep2');
  const full = join(dir, 'full-pp2');
  const LFC = join(projectRoot(), 'bin/lfc.js');
  beforeAll(async () => {
    for (const [plan, flags] of [
      [moe, ['tiny-vlm-moe', '--ep', '2']],
      [full, ['tiny-vlm', '--pp', '2', '--enable-full-hetero-dp']],
    ] as const) {
      const r = await cli('compile', ...flags, '--nproc-per-node', '2', '-o', plan);
      expect(r.err).toBe('');
    }
  }, 60_000);

  /** `lfc args…` in a process of its own: its exit code, output and when it ended */
  function lfc(args: string[], env: Record<string, string>) {
    return new Promise<{ code: number | null; out: string; endMs: number }>((resolve) => {
      const child = spawn(process.execPath, [LFC, ...args], {
        env: { ...process.env, LFC_COLLECTIVE_TIMEOUT: '60', ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      child.on('close', (code) => resolve({ code, out, endMs: Date.now() }));
    });
  }

  // whichever rank exits first, the launcher's one line names the failing rank and its check
  it.each([
    ['all_to_all_v_bound:rank=1', moe, /rank 1 failed in all_to_all_v: receive bound exceeded: /],
    ['gather_v_rows:rank=0', full, /rank 0 failed in gather_v: row count wrong: /],
  ] as const)(
    "under lfc's launcher, %s: exits non-zero naming the rank and the check",
    async (fault, plan, cause) => {
      const t0 = Date.now();
      const r = await lfc(['run', plan, '--nproc-per-node', '2', '--steps', '3'], {
        LFC_TEST_FAULT: fault,
      });
      expect(r.code).toBe(1);
      // one line of error, no stack (besides setup's notes, should the build be stale)
      const errors = r.out.split('\n').filter((l) => l.startsWith('lfc: '));
      expect(errors, r.out).toHaveLength(1);
      expect(r.out).not.toMatch(/^\s+at /m);
      const origin = fault.slice(-1);
      const own = /: (receive bound exceeded|row count wrong): /;
      // the failing rank's own line states its check; a peer's names the rank too
      const line = new RegExp(
        `^lfc: error: rank (\\d) exited with code 1; its last message: step 1: `,
      );
      const who = line.exec(errors[0])?.[1];
      expect(who).toBeDefined();
      expect(errors[0]).toMatch(who === origin ? own : cause);
      // starting the ranks included, far below the collective timeout
      expect(r.endMs - t0).toBeLessThan(30_000);
    },
    60_000,
  );

  // no launcher: rank 0 hosts the store, and the failure reaches the other rank through the
  // communicators and the store alone
  let torchrunCase = 0;
  it.each(
    (
      [
        [
          'all_to_all_v_bound:rank=1',
          moe,
          /rank 1 failed in all_to_all_v: receive bound exceeded: /,
        ],
        ['gather_v_rows:rank=0', full, /rank 0 failed in gather_v: row count wrong: /],
        [
          'kill_between_phases:rank=1',
          moe,
          /rank 1 (\(process \d+\) exited|closed its connection)/,
        ],
      ] as const
    ).flatMap(([fault, plan, cause]) =>
      (['shared memory', 'tcp'] as const).map((transport) => ({ fault, plan, cause, transport })),
    ),
  )(
    'ranks started as torchrun starts them, $fault ($transport): every rank exits non-zero within 5 s',
    async ({ fault, plan, cause, transport }) => {
      // a free-enough port per case (cluster.test.ts's rule)
      const port = String(20000 + ((process.pid * 7 + 300 + 101 * ++torchrunCase) % 20000));
      const rank = (r: number) =>
        lfc(['run', plan, '--steps', '3'], {
          RANK: String(r),
          WORLD_SIZE: '2',
          LOCAL_RANK: String(r),
          MASTER_ADDR: '127.0.0.1',
          MASTER_PORT: port,
          LFC_COMM_SHM: transport === 'tcp' ? '0' : '1',
          LFC_TEST_FAULT: fault,
        });
      const ranks = await Promise.all([rank(0), rank(1)]);
      const origin = Number(fault.slice(-1));
      ranks.forEach((r, k) => {
        expect(r.code).not.toBe(0);
        if (fault.startsWith('kill') && k === origin) return expect(r.code).toBeNull();
        expect(r.out).toMatch(/^lfc: error: step 1: step failed at instruction \d+ /m);
        expect(r.out).toMatch(
          k === origin ? /: (receive bound exceeded|row count wrong): / : cause,
        );
      });
      expect(Math.abs(ranks[0].endMs - ranks[1].endMs)).toBeLessThan(BOUND_MS);
    },
    60_000,
  );
});
