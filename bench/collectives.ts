// Bus bandwidth of lfc's collectives (the Gloo backend of the native runtime) against OpenMPI,
// on 2 and 4 local ranks, 1–64 MiB: all_reduce, all_to_all_v (equal blocks), gather_v (equal
// blocks to rank 0), reduce_scatter (in place, as the distributed optimizer's buckets; OpenMPI's
// MPI_Reduce_scatter_block), and reduce_scatter's time over all_reduce's for a buffer of the same
// size, beside that ratio's floor on this machine: the same two phases with the same kernels on
// threads, with no barrier, store or rank process between them (native collectiveFloor).
//
//   npx tsx bench/collectives.ts [--ranks 2,4] [--sizes 1,4,16,64] [--repeats 12] [--one-cpu]
//
// --one-cpu runs every lfc rank on CPU 0 (taskset) with the barriers polling 50 µs before they
// sleep (LFC_COMM_SPIN_US=50, as on 2 ranks of 2 CPUs): the placement the scheduler sometimes
// gives two ranks, which the barrier's yield is for (runtime-native/src/comm/shm.cc spinTime).
// OpenMPI runs as usual, so its columns are only a reference there.
//
// Each rank process runs one program holding REPEATS rounds of every (op, size) once; the time of
// one instance is the slowest rank's, the figure the median over the repeats. OpenMPI runs the
// same schedule in a small C program (compiled here with mpicc, run with mpirun); the setup
// installs libopenmpi-dev and openmpi-bin (scripts/setup.mjs, 'bench collectives'). Bus bandwidth as in nccl-tests, for S bytes
// (all_reduce, reduce_scatter: the buffer; all_to_all_v: what one rank sends; gather_v: what the
// root receives): all_reduce S/t · 2(P−1)/P, the others S/t · (P−1)/P.
//
// lfc's collectives run through shared memory between ranks of one machine (runtime-native
// src/comm/shm.h); the "tcp" columns are the same program with LFC_COMM_SHM=0, Gloo over loopback
// TCP as between machines.

import { execFileSync, spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  PLAN_VERSION,
  PROGRAM_FORMAT,
  type PlanBuffer,
  type PlanInstruction,
  type ProgramFile,
} from '../compiler/plan/format.js';
import { loadNative } from '../runtime/native.js';
import { StoreServer } from '../runtime/store.js';
import type { BenchSpec } from './collectives-rank.js';
import { benchDir } from './temp-dir.js';
import { setupOrExit } from '../scripts/setup.mjs';

// the Debian packages and the native runtime this bench needs (scripts/setup.mjs)
setupOrExit('bench collectives');

const OPS = ['all_reduce', 'all_to_all_v', 'gather_v', 'reduce_scatter'] as const;
type Op = (typeof OPS)[number];
const MiB = 2 ** 20;
const ROW_FLOATS = 256; // rows of 1 KiB

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
}
const RANKS = flag('--ranks', '2,4').split(',').map(Number);
const SIZES_MIB = flag('--sizes', '1,4,16,64').split(',').map(Number);
const REPEATS = Number(flag('--repeats', '12'));
const ONE_CPU = process.argv.includes('--one-cpu');

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const busFactor = (op: Op, P: number) => (op === 'all_reduce' ? (2 * (P - 1)) / P : (P - 1) / P);

/** One program: every op at every size, REPEATS times; buffers of all sizes share the arena. */
function benchProgram(P: number): { spec: Omit<BenchSpec, 'comm'>; order: [Op, number][] } {
  const maxBytes = Math.max(...SIZES_MIB) * MiB;
  // past the all-to-all's counts at 2 · maxBytes, on a page of its own
  const RS_AT = 2 * maxBytes + 4096;
  const buffers: PlanBuffer[] = [];
  const params: number[] = [];
  const buffer = (
    name: string,
    region: 'arena' | 'param',
    dtype: string,
    shape: number[],
    offset: number,
  ) => {
    const bytes = shape.reduce((a, b) => a * b, 1) * 4;
    buffers.push({
      id: buffers.length,
      name,
      region,
      space: 'device',
      dtype,
      shape: shape.map(String),
      offset,
      bytes,
      microbatch: -1,
    });
    return buffers.length - 1;
  };
  const instructions: PlanInstruction[] = [];
  const order: [Op, number][] = [];
  const counts: Record<string, number[]>[] = Array.from({ length: P }, () => ({}));
  const g = { group: 'dp', group_size: P };
  const add = (
    op: Op,
    size: number,
    inputs: number[],
    outputs: number[],
    attrs: Record<string, unknown>,
  ) => {
    const instruction: PlanInstruction = {
      stream: 'comm',
      op,
      inputs,
      outputs,
      attrs,
      wait: [],
      record: [],
      microbatch: -1,
      phase: 'backward',
      scope: `bench.${op}.${size}MiB`,
    };
    round.push([instruction, [op, size]]);
  };
  // one round holds every (op, size) once; the program runs REPEATS rounds, so that a burst of
  // load on a shared machine falls on every op alike (the ratios below compare ops)
  const round: [PlanInstruction, [Op, number]][] = [];
  for (const size of SIZES_MIB) {
    const bytes = size * MiB;
    const rows = bytes / (ROW_FLOATS * 4);
    const x = buffer(`ar.${size}`, 'arena', 'f32', [bytes / 4], 0);
    add('all_reduce', size, [x], [x], g);
    const a2aIn = buffer(`a2a.in.${size}`, 'arena', 'f32', [rows, ROW_FLOATS], 0);
    const a2aOut = buffer(`a2a.out.${size}`, 'arena', 'f32', [rows, ROW_FLOATS], maxBytes);
    const send = buffer(`a2a.send.${size}`, 'param', 'i32', [P], params.length * 64);
    params.push(send);
    const recv = buffer(`a2a.recv.${size}`, 'arena', 'i32', [P], 2 * maxBytes);
    for (const c of counts) c[String(send)] = Array(P).fill(rows / P);
    add('all_to_all_v', size, [a2aIn, send], [a2aOut, recv], { ...g, out_rows: [String(rows)] });
    const gvIn = buffer(`gv.in.${size}`, 'arena', 'f32', [rows / P, ROW_FLOATS], 0);
    const gvOut = buffer(`gv.out.${size}`, 'arena', 'f32', [rows, ROW_FLOATS], maxBytes);
    add('gather_v', size, [gvIn], [gvOut], { ...g, root: 0, out_rows: [String(rows)] });
    // its own buffer, of the same size: on x it would follow the round before's reduce-scatter
    // of x, and start from the cache it left (see the ratio below)
    const xr = buffer(`rs.${size}`, 'arena', 'f32', [bytes / 4], RS_AT);
    add('reduce_scatter', size, [xr], [xr], g);
  }
  for (let k = 0; k < REPEATS; k++)
    for (const [instruction, key] of round) {
      instructions.push(instruction);
      order.push(key);
    }
  const program: ProgramFile = {
    format: PROGRAM_FORMAT,
    version: PLAN_VERSION,
    id: 'bench',
    regions: {
      arena: 3 * maxBytes + 4096,
      param: params.length * 64,
      grad: 0,
      optim: 0,
      data: 0,
      scalar: 0,
      host: 0,
      scratch: 0,
    },
    // f32 collectives with one output, and reduce_scatter, take no scratch (compiler/plan/scratch.ts)
    scratchBytes: { compute: 0, comm: 0, copy: 0, grad: 0 },
    arenaLowerBoundBytes: 0,
    buffers,
    params: [],
    inputs: [],
    scalars: {},
    outputs: [],
    events: 0,
    instructions,
  };
  return { spec: { program, counts }, order };
}

/** ms per (op, size) on P ranks of lfc's runtime. */
async function runLfc(P: number, shm: boolean): Promise<Map<string, number>> {
  const { spec, order } = benchProgram(P);
  const server = await StoreServer.listen(0, '127.0.0.1');
  const file = join(benchDir('lfc-bench-'), 'spec.json');
  const full: BenchSpec = {
    ...spec,
    comm: {
      worldSize: P,
      store: `tcp:127.0.0.1:${server.port}`,
      prefix: 'bench',
      groups: [{ name: 'dp[0]', ranks: Array.from({ length: P }, (_, r) => r) }],
      rankGroups: { dp: Array(P).fill(0) },
      contexts: [{ group: 0, stream: 'comm' }],
    },
  };
  writeFileSync(file, JSON.stringify(full));
  const tsx = createRequire(import.meta.url).resolve('tsx');
  const worker = fileURLToPath(new URL('./collectives-rank.ts', import.meta.url));
  const perRank = await Promise.all(
    Array.from({ length: P }, (_, rank) => {
      const args = [process.execPath, '--import', tsx, worker, file, String(rank)];
      const child = spawn(
        ONE_CPU ? 'taskset' : args[0],
        ONE_CPU ? ['-c', '0', ...args] : args.slice(1),
        {
          stdio: ['ignore', 'pipe', 'inherit'],
          env: {
            ...process.env,
            LFC_COMM_SHM: shm ? '1' : '0',
            ...(ONE_CPU ? { LFC_COMM_SPIN_US: '50' } : {}),
          },
        },
      );
      let out = '';
      child.stdout.on('data', (c: Buffer) => (out += c.toString()));
      return new Promise<number[]>((resolve, reject) =>
        child.on('close', (code) =>
          code === 0
            ? resolve(JSON.parse(out) as number[])
            : reject(new Error(`rank ${rank} exited ${code}`)),
        ),
      );
    }),
  );
  await server.close();
  const times = new Map<string, number[]>();
  order.forEach(([op, size], i) => {
    const key = `${op}/${size}`;
    times.set(key, [...(times.get(key) ?? []), Math.max(...perRank.map((t) => t[i]))]);
  });
  return new Map([...times].map(([k, ts]) => [k, median(ts)]));
}

const MPI_SOURCE = String.raw`
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, P; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &P);
  int repeats = atoi(argv[1]);
  size_t maxBytes = 0;
  for (int s = 2; s < argc; s++) if ((size_t)atoi(argv[s]) << 20 > maxBytes) maxBytes = (size_t)atoi(argv[s]) << 20;
  float* a = calloc(maxBytes / 4, 4); float* b = calloc(maxBytes / 4, 4);
  int* counts = malloc(P * sizeof(int)); int* displs = malloc(P * sizeof(int));
  const char* names[4] = {"all_reduce", "all_to_all_v", "gather_v", "reduce_scatter"};
  int S = argc - 2;
  double* t = malloc((size_t)4 * S * repeats * sizeof(double)); double* tmax = malloc((size_t)4 * S * repeats * sizeof(double));
  // rounds of every (size, op) once, as lfc's program runs them
  for (int k = 0; k < repeats; k++)
    for (int s = 0; s < S; s++) {
      size_t bytes = (size_t)atoi(argv[s + 2]) << 20; int n = (int)(bytes / 4);
      for (int i = 0; i < P; i++) { counts[i] = n / P; displs[i] = i * (n / P); }
      for (int op = 0; op < 4; op++) {
        double t0 = MPI_Wtime();
        if (op == 0) MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (op == 1) MPI_Alltoallv(a, counts, displs, MPI_FLOAT, b, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
        else if (op == 2) MPI_Gatherv(a, n / P, MPI_FLOAT, b, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
        else MPI_Reduce_scatter_block(MPI_IN_PLACE, a, n / P, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t[((size_t)op * S + s) * repeats + k] = (MPI_Wtime() - t0) * 1e3;
      }
    }
  MPI_Reduce(t, tmax, 4 * S * repeats, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0)
    for (int op = 0; op < 4; op++)
      for (int s = 0; s < S; s++) {
        double* m = tmax + ((size_t)op * S + s) * repeats;
        qsort(m, repeats, sizeof(double), cmp);
        printf("%s/%d %f\n", names[op], atoi(argv[s + 2]), m[repeats / 2]);
      }
  MPI_Finalize();
  return 0;
}
`;

/** ms per (op, size) on P ranks of OpenMPI, or undefined when OpenMPI is not installed. */
function runMpi(P: number, exe: string | undefined): Map<string, number> | undefined {
  if (!exe) return undefined;
  const out = execFileSync(
    'mpirun',
    [
      '--allow-run-as-root',
      '--oversubscribe',
      '-np',
      String(P),
      exe,
      String(REPEATS),
      ...SIZES_MIB.map(String),
    ],
    { encoding: 'utf8', env: { ...process.env, OMPI_MCA_btl_vader_single_copy_mechanism: 'none' } },
  );
  return new Map(
    out
      .trim()
      .split('\n')
      .map((l) => l.split(' '))
      .map(([k, ms]) => [k, Number(ms)]),
  );
}

function buildMpi(): string | undefined {
  try {
    const dir = benchDir('lfc-mpi-');
    writeFileSync(join(dir, 'bench.c'), MPI_SOURCE);
    execFileSync('mpicc', ['-O2', '-o', join(dir, 'bench'), join(dir, 'bench.c')]);
    return join(dir, 'bench');
  } catch {
    process.stderr.write('mpicc failed to build the OpenMPI yardstick: lfc only\n');
    return undefined;
  }
}

const mpiExe = buildMpi();
const gbps = (op: Op, P: number, size: number, ms: number) =>
  ((size * MiB) / (ms / 1e3) / 1e9) * busFactor(op, P);
console.log(`bus bandwidth GB/s (median of ${REPEATS}; slowest rank per instance)`);
if (ONE_CPU) console.log("--one-cpu: lfc's ranks all on CPU 0, polling 50 µs; OpenMPI as usual");
console.log(
  'ranks  op             size    lfc (ms)   lfc GB/s   MPI (ms)   MPI GB/s   lfc/MPI   tcp (ms)   tcp/MPI',
);
const ratios: [number, number, string][] = [];
for (const P of RANKS) {
  const lfc = await runLfc(P, true);
  const tcp = await runLfc(P, false);
  const mpi = runMpi(P, mpiExe);
  for (const size of SIZES_MIB) {
    const over = (m: Map<string, number> | undefined) =>
      m ? (m.get(`reduce_scatter/${size}`)! / m.get(`all_reduce/${size}`)!).toFixed(3) : '-';
    ratios.push([
      P,
      size,
      `${String(P).padEnd(6)} ${`${size} MiB`.padStart(7)} ${over(lfc).padStart(10)} ${over(tcp).padStart(10)} ${over(mpi).padStart(10)}`,
    ]);
  }
  for (const op of OPS)
    for (const size of SIZES_MIB) {
      const key = `${op}/${size}`;
      const a = lfc.get(key)!;
      const b = mpi?.get(key);
      const t = tcp.get(key);
      const cells = [
        String(P).padEnd(6),
        op.padEnd(14),
        `${size} MiB`.padStart(7),
        a.toFixed(2).padStart(10),
        gbps(op, P, size, a).toFixed(2).padStart(10),
        b === undefined ? '-'.padStart(10) : b.toFixed(2).padStart(10),
        b === undefined ? '-'.padStart(10) : gbps(op, P, size, b).toFixed(2).padStart(10),
        b === undefined ? '-'.padStart(9) : (b / a).toFixed(2).padStart(9),
        t === undefined ? '-'.padStart(10) : t.toFixed(2).padStart(10),
        t === undefined || b === undefined ? '-'.padStart(9) : (b / t).toFixed(2).padStart(9),
      ];
      console.log(cells.join(' '));
    }
}
// The floor of that ratio on this machine: the two phases of the shared-memory path's direct
// all-reduce, timed alone on as many threads as ranks (native collectiveFloor): the in-place sum is
// all a reduce-scatter does, the all-reduce adds the copy of what the others summed. Where the ranks
// would oversubscribe the cores, none is printed.
const native = loadNative();
const floorOf = (P: number, size: number) => {
  if (P > availableParallelism()) return '-';
  const { sumMs, copyMs } = native.collectiveFloor(size * MiB, P, REPEATS);
  return `${(sumMs / (sumMs + copyMs)).toFixed(3)} (${sumMs.toFixed(2)} + ${copyMs.toFixed(2)} ms)`;
};
console.log(
  '\nreduce_scatter time / all_reduce time, same size; the floor: the sum / (sum + the copy)',
);
console.log('ranks     size        lfc        tcp        MPI   floor');
for (const [P, size, line] of ratios) console.log(`${line}   ${floorOf(P, size)}`);
