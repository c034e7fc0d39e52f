// Every collective of the plan format on 2 and 4 ranks (one process each, Gloo over TCP),
// against the same computation written out plainly: a hand-built program holds one instance of
// each op, every rank fills its inputs from its rank, and each output must equal the plain result
// exactly (small integers in f32). All-reduces of several sizes, across the shared-memory path's
// chunks and regrowth, match their plain sums with and without shared memory. A collective one
// rank never joins fails after the collective timeout, naming its op and group.
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ProgramBuilder } from '../runtime/program-builder.js';
import { StoreServer } from '../../runtime/store.js';
import { generated, type Generator } from './generated.js';
import type { WorkerSpec } from './rank-worker.js';

const H = 3; // values per row
const WORKER = fileURLToPath(new URL('./rank-worker.ts', import.meta.url));
const TSX = createRequire(import.meta.url).resolve('tsx');

type Result = {
  buffers?: Record<number, number[]>;
  communicators?: { name: string; transport: string }[];
  error?: string;
};

/** Runs every rank of the spec as a process; resolves with each rank's printed result. */
async function runRanks(
  spec: WorkerSpec,
  world: number,
  env: NodeJS.ProcessEnv = process.env,
): Promise<Result[]> {
  const file = join(mkdtempSync(join(tmpdir(), 'lfc-coll-')), 'spec.json');
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
        child.on('exit', () =>
          resolve(
            out ? (JSON.parse(out.trim().split('\n').pop()!) as Result) : { error: 'killed' },
          ),
        );
      }),
  );
  // idle ranks (the timeout test) end once the others are done
  const idle = spec.idle ?? [];
  await Promise.all(results.filter((_, r) => !idle.includes(r)));
  for (const r of idle) children[r].kill('SIGKILL');
  return Promise.all(results);
}

function range<T>(n: number, f: (i: number) => T): T[] {
  return Array.from({ length: n }, (_, i) => f(i));
}
const rowsOf = (S: number, f: (k: number, h: number) => number) =>
  range(S * H, (i) => f(Math.floor(i / H), i % H));

/** Rows rank r sends rank j in all_to_all_v. */
const a2aCount = (r: number, j: number) => (r + 2 * j) % 3;
/** Rows of rank r in gather_v / scatter_v (its microbatch's S). */
const vRows = (r: number) => r + 1;

function collectiveSpec(P: number, store: string) {
  // send/recv go round a ring; even ranks send first and odd ranks receive first, so no pair
  // waits for the other (a send completes when its receive is posted)
  const programs: Record<string, ReturnType<ProgramBuilder['build']>> = {};
  let ids: Record<string, number> = {};
  for (const parity of ['even', 'odd'] as const) {
    const b = new ProgramBuilder(parity);
    const g = { group: 'dp', group_size: P };
    const tokens = b.input('tokens', 'i32', ['S']);
    const arX = b.param('ar.x', [5, H], { trainable: false }).buffer;
    const arY = b.arena('ar.y', 'f32', [5, H]);
    const arInPlace = b.arena('ar.inplace', 'f32', [4]);
    const agX = b.param('ag.x', [2, H], { trainable: false }).buffer;
    const agY = b.arena('ag.y', 'f32', [2 * P, H]);
    const rsX = b.param('rs.x', [2 * P, H], { trainable: false }).buffer;
    const rsY = b.arena('rs.y', 'f32', [2, H]);
    const bcX = b.param('bc.x', [4], { trainable: false }).buffer;
    const bcY = b.arena('bc.y', 'f32', [4]);
    const a2aX = b.param('a2a.x', [8, H], { trainable: false }).buffer;
    const a2aSend = b.param('a2a.send', [P], { dtype: 'i32', trainable: false }).buffer;
    const a2aY = b.arena('a2a.y', 'f32', [8 * P, H]);
    const a2aRecv = b.arena('a2a.recv', 'i32', [P]);
    const gvX = b.arena('gv.x', 'f32', ['S', H], 0);
    const gvY = b.arena('gv.y', 'f32', [8 * P, H]);
    const svX = b.param('sv.x', [8 * P, H], { trainable: false }).buffer;
    const svY = b.arena('sv.y', 'f32', ['S', H], 0);
    const p2pX = b.param('p2p.x', [4], { trainable: false }).buffer;
    const p2pY = b.arena('p2p.y', 'f32', [4]);
    b.instr('comm', 'all_reduce', [arX], [arY], g);
    b.instr('comm', 'all_reduce', [arInPlace], [arInPlace], g);
    b.instr('comm', 'all_gather', [agX], [agY], g);
    b.instr('comm', 'reduce_scatter', [rsX], [rsY], g);
    b.instr('comm', 'broadcast', [bcX], [bcY], { ...g, root: P - 1 });
    b.instr('comm', 'all_to_all_v', [a2aX, a2aSend], [a2aY, a2aRecv], {
      ...g,
      out_rows: [`${8 * P}`],
    });
    b.instr('comm', 'gather_v', [gvX], [gvY], { ...g, root: 0, out_rows: [`${8 * P}`] });
    b.instr('comm', 'scatter_v', [svX], [svY], { ...g, root: 0, out_rows: ['S'] });
    const send = () => b.instr('comm', 'send', [p2pX], [], { group: 'dp', peer: -1, tag: 7 });
    const recv = () =>
      b.instr('comm', 'recv', [], [p2pY], {
        group: 'dp',
        peer: -1,
        tag: 7,
        dtype: 'f32',
        shape: ['4'],
      });
    if (parity === 'even') {
      send();
      recv();
    } else {
      recv();
      send();
    }
    programs[parity] = b.build();
    ids = { tokens, arX, arY, arInPlace, agX, agY, rsX, rsY, bcX, bcY, a2aX, a2aSend, a2aY };
    Object.assign(ids, { a2aRecv, gvX, gvY, svX, svY, p2pX, p2pY });
  }
  const spec = (rank: number) => {
    const f = (id: number) => String(id);
    // peers of the ring, per rank: written into that rank's program copy below
    return {
      tokens: vRows(rank),
      fill: {
        [f(ids.arX)]: range(5 * H, (i) => rank * 100 + i),
        [f(ids.arInPlace)]: range(4, () => rank + 1),
        [f(ids.agX)]: range(2 * H, (i) => rank * 10 + i),
        [f(ids.rsX)]: range(2 * P * H, (i) => rank * 1000 + i),
        [f(ids.bcX)]: range(4, (i) => rank * 10 + i),
        [f(ids.a2aX)]: rowsOf(8, (k, h) => rank * 1000 + k * 10 + h),
        [f(ids.a2aSend)]: range(P, (j) => a2aCount(rank, j)),
        [f(ids.gvX)]: rowsOf(vRows(rank), (k, h) => rank * 100 + k * 10 + h),
        [f(ids.svX)]: rowsOf(8 * P, (k, h) => k * 10 + h),
        [f(ids.p2pX)]: range(4, (i) => rank * 10 + i),
      },
    };
  };
  // every rank gets a program of its own parity with its ring peers (group ranks)
  const rankPrograms: string[] = [];
  const perRank: Record<string, ReturnType<ProgramBuilder['build']>> = {};
  for (let r = 0; r < P; r++) {
    const base = programs[r % 2 === 0 ? 'even' : 'odd'];
    const id = `r${r}`;
    perRank[id] = {
      ...base,
      id,
      instructions: base.instructions.map((ins) =>
        ins.op === 'send'
          ? { ...ins, attrs: { ...ins.attrs, peer: (r + 1) % P } }
          : ins.op === 'recv'
            ? { ...ins, attrs: { ...ins.attrs, peer: (r + P - 1) % P } }
            : ins,
      ),
    };
    rankPrograms.push(id);
  }
  const workerSpec: WorkerSpec = {
    programs: perRank,
    rankPrograms,
    comm: {
      worldSize: P,
      store,
      prefix: `coll-${P}`,
      groups: [{ name: 'dp[0]', ranks: range(P, (r) => r) }],
      rankGroups: { dp: range(P, () => 0) },
      contexts: [{ group: 0, stream: 'comm' }],
      timeoutMs: 20_000,
    },
    ranks: range(P, spec),
    read: [
      ids.arY,
      ids.arInPlace,
      ids.agY,
      ids.rsY,
      ids.bcY,
      ids.a2aY,
      ids.a2aRecv,
      ids.gvY,
      ids.svY,
      ids.p2pY,
    ],
  };
  return { spec: workerSpec, ids };
}

/** The plain computation of every output, for rank r of P. */
function expected(P: number, r: number, ids: Record<string, number>, fills: WorkerSpec['ranks']) {
  const fill = (rank: number, id: number) => fills[rank].fill[String(id)];
  const sum = (id: number) =>
    fill(0, id).map((_, i) => range(P, (k) => fill(k, id)[i]).reduce((a, b) => a + b, 0));
  const a2aRows = (from: number, to: number) => {
    const start = range(to, (j) => a2aCount(from, j)).reduce((a, b) => a + b, 0);
    return fill(from, ids.a2aX).slice(start * H, (start + a2aCount(from, to)) * H);
  };
  const svStart = range(r, vRows).reduce((a, b) => a + b, 0);
  return {
    [ids.arY]: sum(ids.arX),
    [ids.arInPlace]: sum(ids.arInPlace),
    [ids.agY]: range(P, (k) => fill(k, ids.agX)).flat(),
    [ids.rsY]: sum(ids.rsX).slice(r * 2 * H, (r + 1) * 2 * H),
    [ids.bcY]: fill(P - 1, ids.bcX),
    [ids.a2aY]: range(P, (from) => a2aRows(from, r)).flat(),
    [ids.a2aRecv]: range(P, (from) => a2aCount(from, r)),
    [ids.gvY]: r === 0 ? range(P, (k) => fill(k, ids.gvX)).flat() : [],
    [ids.svY]: fill(0, ids.svX).slice(svStart * H, (svStart + vRows(r)) * H),
    [ids.p2pY]: fill((r + P - 1) % P, ids.p2pX),
  };
}

describe('collectives against their plain computation', () => {
  it.each([
    [2, 'file'],
    [4, 'tcp'],
  ] as const)(
    '%i ranks (%s store): all_reduce, all_gather, reduce_scatter, broadcast, all_to_all_v, gather_v, scatter_v, send/recv',
    async (P, kind) => {
      const server = kind === 'tcp' ? await StoreServer.listen(0, '127.0.0.1') : undefined;
      const store = server
        ? `tcp:127.0.0.1:${server.port}`
        : `file:${mkdtempSync(join(tmpdir(), 'lfc-rdzv-'))}`;
      try {
        const { spec, ids } = collectiveSpec(P, store);
        const results = await runRanks(spec, P);
        results.forEach((res, r) => {
          expect(res.error).toBeUndefined();
          const want = expected(P, r, ids, spec.ranks);
          for (const id of spec.read)
            expect({ id, got: res.buffers![id] }).toEqual({ id, got: want[id] });
        });
      } finally {
        await server?.close();
      }
    },
    60_000,
  );

  // three all-reduces in a row, each outgrowing the shared-memory slots of the one before (16 KiB,
  // 256 KiB, then still 256 KiB: 40 chunks, the last not a multiple of the parts); LFC_COMM_SHM=0
  // keeps them on Gloo over TCP
  it.each([
    [4, 'shared memory'],
    [3, 'shared memory'],
    [4, 'tcp'],
  ] as const)(
    '%i ranks: all-reduces of 20 B to 10 MiB over %s',
    async (P, transport) => {
      const b = new ProgramBuilder('p');
      const sizes = [5, 50_003, 2_621_447];
      const dtypes = ['f32', 'i32', 'f32'] as const;
      const xs = sizes.map(
        (n, k) => b.param(`x${k}`, [n], { dtype: dtypes[k], trainable: false }).buffer,
      );
      const ys = sizes.map((n, k) => {
        const y = b.arena(`y${k}`, dtypes[k], [n]);
        b.instr('comm', 'all_reduce', [xs[k]], [y], { group: 'dp', group_size: P });
        return y;
      });
      const gen = (r: number, k: number): Generator => ({
        count: sizes[k],
        mul: 7 + 2 * r + k,
        add: 13 * r + k,
        mod: 1000,
      });
      const spec: WorkerSpec = {
        programs: { p: b.build() },
        rankPrograms: range(P, () => 'p'),
        comm: {
          worldSize: P,
          store: `file:${mkdtempSync(join(tmpdir(), 'lfc-rdzv-'))}`,
          prefix: 'sizes',
          groups: [{ name: 'dp[0]', ranks: range(P, (r) => r) }],
          rankGroups: { dp: range(P, () => 0) },
          contexts: [{ group: 0, stream: 'comm' }],
          timeoutMs: 20_000,
        },
        ranks: range(P, (r) => ({
          fill: {},
          generate: Object.fromEntries(xs.map((id, k) => [String(id), gen(r, k)])),
        })),
        read: ys,
        binary: true,
      };
      const env = { ...process.env, LFC_COMM_SHM: transport === 'tcp' ? '0' : '1' };
      const results = await runRanks(spec, P, env);
      const want = ys.map((_, k) => {
        const sum = new Float64Array(sizes[k]);
        for (let r = 0; r < P; r++) generated(gen(r, k)).forEach((v, i) => (sum[i] += v));
        return sum;
      });
      for (const res of results) {
        expect(res.error).toBeUndefined();
        expect(res.communicators).toContainEqual({ name: 'dp[0]/comm', size: P, transport });
        ys.forEach((id, k) => {
          const bytes = Buffer.from(res.buffers![id] as unknown as string, 'base64');
          const got =
            dtypes[k] === 'i32'
              ? new Int32Array(bytes.buffer, bytes.byteOffset, sizes[k])
              : new Float32Array(bytes.buffer, bytes.byteOffset, sizes[k]);
          let wrong = 0;
          for (let i = 0; i < sizes[k]; i++) if (got[i] !== want[k][i]) wrong++;
          expect({ k, wrong }).toEqual({ k, wrong: 0 });
        });
      }
    },
    60_000,
  );

  it('a rank that stops after the shared-memory all-reduce is set up times the others out', async () => {
    const b = new ProgramBuilder('p');
    const x = b.param('x', [4], { trainable: false }).buffer;
    const y = b.arena('y', 'f32', [4]);
    b.instr('comm', 'all_reduce', [x], [y], { group: 'dp', group_size: 2 }, { scope: 'grads' });
    const spec: WorkerSpec = {
      programs: { p: b.build() },
      rankPrograms: ['p', 'p'],
      comm: {
        worldSize: 2,
        store: `file:${mkdtempSync(join(tmpdir(), 'lfc-rdzv-'))}`,
        prefix: 'shm-timeout',
        groups: [{ name: 'dp[0]', ranks: [0, 1] }],
        rankGroups: { dp: [0, 0] },
        contexts: [{ group: 0, stream: 'comm' }],
        timeoutMs: 3_000,
      },
      ranks: [{ fill: {} }, { fill: {} }],
      read: [],
      steps: 2,
      idle: [1],
      idleAfterSteps: 1,
    };
    const t0 = Date.now();
    const [rank0] = await runRanks(spec, 2, { ...process.env, LFC_COMM_SHM: '1' });
    expect(rank0.error).toMatch(
      /step failed at instruction 0 \(all_reduce, scope grads\): over group dp\[0\]\/comm \(kind dp\): timed out after 3 s/,
    );
    expect(Date.now() - t0).toBeLessThan(15_000);
  }, 30_000);

  it('a collective one rank never joins fails after the timeout, naming its op and group', async () => {
    const b = new ProgramBuilder('p');
    const x = b.param('x', [4], { trainable: false }).buffer;
    const y = b.arena('y', 'f32', [4]);
    b.instr('comm', 'all_reduce', [x], [y], { group: 'dp', group_size: 2 }, { scope: 'grads' });
    const spec: WorkerSpec = {
      programs: { p: b.build() },
      rankPrograms: ['p', 'p'],
      comm: {
        worldSize: 2,
        store: `file:${mkdtempSync(join(tmpdir(), 'lfc-rdzv-'))}`,
        prefix: 'timeout',
        groups: [{ name: 'dp[0]', ranks: [0, 1] }],
        rankGroups: { dp: [0, 0] },
        contexts: [{ group: 0, stream: 'comm' }],
        timeoutMs: 3_000,
      },
      ranks: [{ fill: {} }, { fill: {} }],
      read: [],
      idle: [1],
    };
    const t0 = Date.now();
    const [rank0] = await runRanks(spec, 2);
    expect(rank0.error).toMatch(
      /step failed at instruction 0 \(all_reduce, scope grads\): over group dp\[0\]\/comm \(kind dp\): timed out after 3 s/,
    );
    expect(Date.now() - t0).toBeLessThan(15_000);
  }, 30_000);
});
