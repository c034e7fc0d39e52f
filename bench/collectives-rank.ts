// One rank of bench/collectives.ts: runs one program holding every timed collective (each op at
// each size, once a round, REPEATS rounds on the comm stream) twice and prints the per-instruction
// times of the second run.
//   node --import tsx bench/collectives-rank.ts SPEC.json RANK

import { readFileSync } from 'node:fs';
import type { ProgramFile } from '../compiler/plan/format.js';
import { loadNative, type NativeCommConfig } from '../runtime/native.js';

export interface BenchSpec {
  readonly program: ProgramFile;
  readonly comm: Omit<NativeCommConfig, 'rank'>;
  /** per rank: i32 buffers to fill (send counts) */
  readonly counts: Readonly<Record<string, readonly number[]>>[];
}

const [specPath, rankText] = process.argv.slice(2);
const spec = JSON.parse(readFileSync(specPath, 'utf8')) as BenchSpec;
const rank = Number(rankText);
const rt = new (loadNative().Runtime)(JSON.stringify(spec.program), {
  collectives: true,
  timing: true,
});
await rt.connect({ ...spec.comm, rank });
for (const [id, values] of Object.entries(spec.counts[rank])) {
  const b = spec.program.buffers[Number(id)];
  new Int32Array(rt.region('param'), b.offset, values.length).set(values);
}
// a warm-up step first: training runs every instruction each step, and the first run of an
// all-reduce builds its algorithm state (Gloo's halving-doubling binds its buffer, a collective
// handshake of its own); the figures are the second step's
await rt.step({ lr: 0, step: 1 });
const r = await rt.step({ lr: 0, step: 2 });
process.stdout.write(JSON.stringify(r.perInstruction!.map((t) => t.end - t.start)) + '\n');
