// Every collective of the plan format on 2 and 4 ranks (one process each, Gloo over TCP),
// against the same computation written out plainly: a hand-built program holds one instance of
// each op, every rank fills its inputs from its rank, and each output must equal the plain result
// exactly (small integers in f32), through shared memory and over Gloo's TCP. Large collectives,
// over many of the shared-memory transport's rounds, match their plain results too. A collective one
// rank never joins fails after the collective timeout, naming its op and group.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ProgramBuilder } from '../runtime/program-builder.js';
import { StoreServer } from '../../runtime/store.js';
import { generated, type Generator } from './generated.js';
import type { WorkerSpec } from './rank-worker.js';
import { range, runRanks } from './run-ranks.js';

const H = 3; // values per row

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
    // all_gather_v / reduce_scatter_v: rank r holds vRows(r) rows, every rank the counts of all
    const vCounts = b.param('v.counts', [P], { dtype: 'i32', trainable: false }).buffer;
    const agvX = b.arena('agv.x', 'f32', ['S', H], 0);
    const agvY = b.arena('agv.y', 'f32', [8 * P, H]);
    const rsvX = b.param('rsv.x', [8 * P, H], { trainable: false }).buffer;
    const rsvY = b.arena('rsv.y', 'f32', ['S', H], 0);
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
    b.instr('comm', 'all_gather_v', [agvX, vCounts], [agvY], { ...g, out_rows: [`${8 * P}`] });
    b.instr('comm', 'reduce_scatter_v', [rsvX, vCounts], [rsvY], { ...g, out_rows: ['S'] });
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
    Object.assign(ids, { vCounts, agvX, agvY, rsvX, rsvY });
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
        [f(ids.vCounts)]: range(P, vRows),
        [f(ids.agvX)]: rowsOf(vRows(rank), (k, h) => rank * 100 + k * 10 + h),
        [f(ids.rsvX)]: rowsOf(8 * P, (k, h) => rank * 1000 + k * 10 + h),
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
      ids.agvY,
      ids.rsvY,
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
    // every rank's rows in group order (the rows it reports written)
    [ids.agvY]: range(P, (k) => fill(k, ids.agvX)).flat(),
    [ids.rsvY]: sum(ids.rsvX).slice(svStart * H, (svStart + vRows(r)) * H),
    [ids.p2pY]: fill((r + P - 1) % P, ids.p2pX),
  };
}

describe('collectives against their plain computation', () => {
  // direct: shared memory reads the ranks' buffers in place (LFC_COMM_DIRECT); where the kernel
  // refuses one rank the mapping of its peers' memory (forced), every rank keeps the slots
  it.each([
    [2, 'file', 'shared memory', true, ''],
    [4, 'tcp', 'shared memory', true, ''],
    [4, 'tcp', 'shared memory', false, ''],
    [4, 'tcp', 'shared memory', false, 'direct_map_refused:rank=2'],
    [4, 'tcp', 'tcp', false, ''],
  ] as const)(
    '%i ranks (%s store, %s, direct %s %s): all_reduce, all_gather, reduce_scatter, broadcast, all_to_all_v, gather_v, scatter_v, all_gather_v, reduce_scatter_v, send/recv',
    async (P, kind, transport, direct, fault) => {
      const server = kind === 'tcp' ? await StoreServer.listen(0, '127.0.0.1') : undefined;
      const store = server
        ? `tcp:127.0.0.1:${server.port}`
        : `file:${mkdtempSync(join(tmpdir(), 'lfc-rdzv-'))}`;
      try {
        const { spec, ids } = collectiveSpec(P, store);
        const env = {
          ...process.env,
          LFC_COMM_SHM: transport === 'tcp' ? '0' : '1',
          LFC_COMM_DIRECT: direct || fault ? '1' : '0',
          LFC_TEST_FAULT: fault,
        };
        const results = await runRanks(spec, P, env);
        results.forEach((res, r) => {
          expect(res.error).toBeUndefined();
          expect(res.communicators).toContainEqual({
            name: 'dp[0]/comm',
            size: P,
            transport,
            direct,
          });
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

  // Many rounds of the shared-memory transport (slots of 256 KiB): all-reduces of 20 B, 200 KB
  // (i32) and 10 MiB (40 chunks, the last not a multiple of the parts), an all_gather of 300 KB
  // blocks, a broadcast of 600 KB, an all_to_all_v of uneven blocks up to 300 KiB (lanes of 64 or
  // 85 KiB, some blocks empty), each exact against its plain result; LFC_COMM_SHM=0 runs the same
  // over Gloo's TCP, and LFC_COMM_DIRECT=1 reads every collective's buffers in place instead.
  it.each([
    [4, 'shared memory', false],
    [3, 'shared memory', false],
    [3, 'shared memory', true],
    [4, 'tcp', false],
  ] as const)(
    '%i ranks: collectives over many rounds (%s, direct %s)',
    async (P, transport, direct) => {
      const W = 256; // values per all_to_all_v row
      const M = 300; // most rows one rank sends another
      const a2aRows = (from: number, to: number) =>
        (from + 2 * to) % 5 === 4 ? 0 : ((from * 7 + to * 13 + 3) * 37) % (M + 1);
      // blocks of several lanes (≤ 85 rows), and empty ones
      const blocks = range(P, (f) => range(P, (t) => a2aRows(f, t))).flat();
      expect(Math.max(...blocks)).toBeGreaterThan(200);
      expect(blocks).toContain(0);
      const b = new ProgramBuilder('p');
      const g = { group: 'dp', group_size: P };
      const cases: { count: number; dtype: 'f32' | 'i32' }[] = [
        { count: 5, dtype: 'f32' },
        { count: 50_003, dtype: 'i32' },
        { count: 2_621_447, dtype: 'f32' },
        { count: 75_001, dtype: 'f32' }, // all_gather block
        { count: 150_001, dtype: 'f32' }, // broadcast
        { count: P * M * W, dtype: 'f32' }, // all_to_all_v rows
      ];
      const xs = cases.map(
        (c, k) => b.param(`x${k}`, [c.count], { dtype: c.dtype, trainable: false }).buffer,
      );
      const ys = [0, 1, 2].map((k) => {
        const y = b.arena(`y${k}`, cases[k].dtype, [cases[k].count]);
        b.instr('comm', 'all_reduce', [xs[k]], [y], g);
        return y;
      });
      const agY = b.arena('ag.y', 'f32', [P * cases[3].count]);
      b.instr('comm', 'all_gather', [xs[3]], [agY], g);
      const bcY = b.arena('bc.y', 'f32', [cases[4].count]);
      b.instr('comm', 'broadcast', [xs[4]], [bcY], { ...g, root: P - 1 });
      const a2aX = b.param('a2a.x', [P * M, W], { trainable: false }).buffer;
      const a2aSend = b.param('a2a.send', [P], { dtype: 'i32', trainable: false }).buffer;
      const a2aY = b.arena('a2a.y', 'f32', [P * M, W]);
      const a2aRecv = b.arena('a2a.recv', 'i32', [P]);
      b.instr('comm', 'all_to_all_v', [a2aX, a2aSend], [a2aY, a2aRecv], {
        ...g,
        out_rows: [`${P * M}`],
      });
      const gen = (r: number, k: number): Generator => ({
        count: cases[k].count,
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
          prefix: 'rounds',
          groups: [{ name: 'dp[0]', ranks: range(P, (r) => r) }],
          rankGroups: { dp: range(P, () => 0) },
          contexts: [{ group: 0, stream: 'comm' }],
          timeoutMs: 20_000,
        },
        ranks: range(P, (r) => ({
          fill: { [String(a2aSend)]: range(P, (j) => a2aRows(r, j)) },
          generate: Object.fromEntries([
            ...xs.slice(0, 5).map((id, k) => [String(id), gen(r, k)]),
            [String(a2aX), gen(r, 5)],
          ]),
        })),
        read: [...ys, agY, bcY, a2aY, a2aRecv],
        binary: true,
      };
      const env = {
        ...process.env,
        LFC_COMM_SHM: transport === 'tcp' ? '0' : '1',
        LFC_COMM_DIRECT: direct ? '1' : '0',
      };
      const results = await runRanks(spec, P, env);
      const input = range(P, (r) => cases.map((_, k) => generated(gen(r, k))));
      const sums = [0, 1, 2].map((k) => {
        const sum = new Float64Array(cases[k].count);
        for (let r = 0; r < P; r++) input[r][k].forEach((v, i) => (sum[i] += v));
        return [...sum];
      });
      results.forEach((res, r) => {
        expect(res.error).toBeUndefined();
        expect(res.communicators).toContainEqual({
          name: 'dp[0]/comm',
          size: P,
          transport,
          direct,
        });
        const read = (id: number, dtype = 'f32') => {
          const bytes = Buffer.from(res.buffers![id] as string, 'base64');
          const n = bytes.length / 4;
          return dtype === 'i32'
            ? new Int32Array(bytes.buffer, bytes.byteOffset, n)
            : new Float32Array(bytes.buffer, bytes.byteOffset, n);
        };
        const mismatches = (got: ArrayLike<number>, want: readonly number[]) => {
          let wrong = Math.abs(got.length - want.length);
          for (let i = 0; i < Math.min(got.length, want.length); i++)
            if (got[i] !== want[i]) wrong++;
          return wrong;
        };
        const sentBefore = (from: number, to: number) =>
          range(to, (j) => a2aRows(from, j)).reduce((a, c) => a + c, 0);
        const want: [string, number, ArrayLike<number>, readonly number[]][] = [
          ['all_reduce 20 B', ys[0], read(ys[0]), sums[0]],
          ['all_reduce 200 KB i32', ys[1], read(ys[1], 'i32'), sums[1]],
          ['all_reduce 10 MiB', ys[2], read(ys[2]), sums[2]],
          ['all_gather', agY, read(agY), range(P, (k) => input[k][3]).flat()],
          ['broadcast', bcY, read(bcY), input[P - 1][4]],
          [
            'all_to_all_v rows',
            a2aY,
            read(a2aY),
            range(P, (from) =>
              input[from][5].slice(
                sentBefore(from, r) * W,
                (sentBefore(from, r) + a2aRows(from, r)) * W,
              ),
            ).flat(),
          ],
          ['all_to_all_v counts', a2aRecv, read(a2aRecv, 'i32'), range(P, (f) => a2aRows(f, r))],
        ];
        for (const [what, , got, w] of want)
          expect({ rank: r, what, wrong: mismatches(got, w) }).toEqual({ rank: r, what, wrong: 0 });
      });
    },
    90_000,
  );

  /** Two ranks, one all-reduce a step; rank 1 stops after some steps (waits, or exits): rank 0's
   * error and how long it took. */
  async function oneRankStops(
    transport: 'shared memory' | 'tcp',
    o: { timeoutMs: number; idleAfterSteps: number; idleExits?: boolean },
  ): Promise<{ error?: string; ms: number }> {
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
        prefix: 'stops',
        groups: [{ name: 'dp[0]', ranks: [0, 1] }],
        rankGroups: { dp: [0, 0] },
        contexts: [{ group: 0, stream: 'comm' }],
        timeoutMs: o.timeoutMs,
      },
      ranks: [{ fill: {} }, { fill: {} }],
      read: [],
      steps: o.idleAfterSteps + 1,
      idle: [1],
      idleAfterSteps: o.idleAfterSteps,
      idleExits: o.idleExits,
    };
    const t0 = Date.now();
    const env = { ...process.env, LFC_COMM_SHM: transport === 'tcp' ? '0' : '1' };
    const [rank0] = await runRanks(spec, 2, env);
    return { error: rank0.error, ms: Date.now() - t0 };
  }
  const failedAllReduce =
    /step failed at instruction 0 \(all_reduce, scope grads\): over group dp\[0\]\/comm \(kind dp\): /;

  it.each([
    ['shared memory', 0],
    ['shared memory', 1],
    ['tcp', 0],
  ] as const)(
    'a collective one rank never joins fails after the timeout, naming its op and group (%s, after %i steps)',
    async (transport, idleAfterSteps) => {
      const r = await oneRankStops(transport, { timeoutMs: 3_000, idleAfterSteps });
      expect(r.error).toMatch(failedAllReduce);
      expect(r.error).toMatch(/timed out after 3 s/);
      expect(r.ms).toBeLessThan(15_000);
    },
    30_000,
  );

  // a member that exits fails the others at once, well before the collective timeout: shared
  // memory notices its process is gone, TCP its closed connection
  it.each(['shared memory', 'tcp'] as const)(
    'a rank that exits mid-run fails the collective it leaves at once (%s)',
    async (transport) => {
      const r = await oneRankStops(transport, {
        timeoutMs: 60_000,
        idleAfterSteps: 1,
        idleExits: true,
      });
      expect(r.error).toMatch(failedAllReduce);
      expect(r.error).toMatch(
        transport === 'shared memory'
          ? /rank 1 \(process \d+\) exited/
          : /rank 1 closed its connection/,
      );
      expect(r.ms).toBeLessThan(15_000);
    },
    30_000,
  );
});
