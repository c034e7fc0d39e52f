// One rank of a hand-built multi-rank test (collectives.test.ts), as its own process:
//   node --import tsx rank-worker.ts SPEC.json RANK
// It loads its program, connects to the others through the spec's store, fills its buffers, runs
// the steps and prints {"buffers": {id: values}} (each read buffer at the rows it holds) or
// {"error": message, "stepStartMs", "failedMs"} on stdout (when the steps began and the error came,
// ms since the epoch; with `retryAfterFailure`, also the error of one more step, "retryError").

import { readFileSync } from 'node:fs';
import { loadNative } from '../../runtime/native.js';
import type { NativeCommConfig, NativeRuntime } from '../../runtime/native.js';
import type { ProgramFile } from '../../compiler/plan/format.js';
import { f32ToBf16 } from '../../runtime/bf16.js';
import { generated, type Generator } from './generated.js';

export interface WorkerSpec {
  readonly programs: Readonly<Record<string, ProgramFile>>;
  readonly rankPrograms: readonly string[];
  readonly comm: Omit<NativeCommConfig, 'rank'>;
  /** per rank: tokens of microbatch 0 (sets S), values to write before the step */
  readonly ranks: readonly {
    readonly tokens?: number;
    readonly fill: Readonly<Record<string, readonly number[]>>;
    /** buffers too large to list: value i is (i·mul + add) mod `mod` − `mod`/2 (see generated) */
    readonly generate?: Readonly<Record<string, Generator>>;
  }[];
  /** buffers to print after the steps */
  readonly read: readonly number[];
  readonly steps?: number;
  /** ranks that connect and then stop stepping (a collective timeout test) */
  readonly idle?: readonly number[];
  /** steps the idle ranks run before they stop (0) */
  readonly idleAfterSteps?: number;
  /** the idle ranks exit (code 3) instead of waiting, once their steps are done */
  readonly idleExits?: boolean;
  /** print the read buffers as base64 of their bytes instead of number lists */
  readonly binary?: boolean;
  /** after a failed step, try one more on the same runtime (collective-faults.test.ts) */
  readonly retryAfterFailure?: boolean;
  /** after a failed step, stay this long before printing and exiting: the peers' failures then
   * cannot come from this process's end */
  readonly holdAfterFailureMs?: number;
}

const [specPath, rankText] = process.argv.slice(2);
const spec = JSON.parse(readFileSync(specPath, 'utf8')) as WorkerSpec;
const rank = Number(rankText);
const program = spec.programs[spec.rankPrograms[rank]];
const native = loadNative();

let stepStartMs: number | undefined;
let rt: NativeRuntime | undefined;
try {
  rt = new native.Runtime(JSON.stringify(program), { collectives: true });
  await rt.connect({ ...spec.comm, rank });
  const mine = spec.ranks[rank];
  if (mine.tokens !== undefined) {
    const S = mine.tokens;
    rt.setMicrobatch(0, {
      tokens: new Int32Array(S).fill(2),
      labels: new Int32Array(S),
      lossMask: new Uint8Array(S),
      positions: new Int32Array(S),
      segments: new Int32Array(S),
      images: [],
    });
  }
  const fills = Object.entries(mine.fill).concat(
    Object.entries(mine.generate ?? {}).map(([id, g]) => [id, generated(g)]),
  );
  for (const [id, values] of fills) {
    const b = program.buffers[Number(id)];
    const region = rt.region(b.region as 'param');
    if (b.dtype === 'bf16')
      f32ToBf16(Float32Array.from(values), new Uint16Array(region, b.offset, values.length));
    else if (b.dtype === 'i32') new Int32Array(region, b.offset, values.length).set(values);
    else new Float32Array(region, b.offset, values.length).set(values);
  }
  const idle = spec.idle?.includes(rank);
  const steps = idle ? (spec.idleAfterSteps ?? 0) : (spec.steps ?? 1);
  stepStartMs = Date.now();
  for (let t = 1; t <= steps; t++) await rt.step({ lr: 0, step: t });
  if (idle && spec.idleExits) process.exit(3);
  if (idle) await new Promise((r) => setTimeout(r, 60_000));
  const buffers: Record<number, number[] | string> = {};
  for (const id of spec.read) {
    const bytes = rt.readBuffer(id);
    buffers[id] = spec.binary
      ? Buffer.from(bytes).toString('base64')
      : [
          ...(program.buffers[id].dtype === 'i32'
            ? new Int32Array(bytes)
            : new Float32Array(bytes)),
        ];
  }
  const communicators = rt.info().communicators;
  process.stdout.write(JSON.stringify({ buffers, communicators }) + '\n');
} catch (e) {
  const failedMs = Date.now();
  let retryError: string | undefined;
  if (spec.retryAfterFailure && rt && stepStartMs !== undefined)
    retryError = await rt.step({ lr: 0, step: 2 }).then(
      () => 'the step after a failure ran',
      (r: Error) => r.message,
    );
  await new Promise((r) => setTimeout(r, spec.holdAfterFailureMs ?? 0));
  process.stdout.write(
    JSON.stringify({ error: (e as Error).message, stepStartMs, failedMs, retryError }) + '\n',
  );
}
