// What the property tests of test/fuzz share: the run counts and seed, the structural mutations of
// JSON values and of bytes, and the property itself (a loader accepts, or throws a UserError whose
// message is one line; the CLI exits 0, or 2 with one line on stderr and no stack).
//
//   FUZZ_RUNS=N     every property runs N times (a campaign; npm test uses each test's own count)
//   FUZZ_SEED=S     the seed (default fixed, so npm test is reproducible); a failure prints the
//                   seed and path to replay it with fast-check
import fc from 'fast-check';
import { expect } from 'vitest';
import { UserError } from '../../compiler/errors.js';

const SEED = Number(process.env.FUZZ_SEED ?? 20261201);

/** lfc compile's flags for the small tiny-vlm plan the file properties edit (fast to run). */
export const SMALL_PLAN = [
  'tiny-vlm',
  '--seq-length',
  '32',
  '--micro-batch-size',
  '1',
  '--global-batch-size',
  '2',
] as const;

/** fast-check's parameters: the test's run count, or FUZZ_RUNS. */
export function runs(numRuns: number): fc.Parameters<unknown> {
  return { numRuns: Number(process.env.FUZZ_RUNS ?? numRuns), seed: SEED };
}

/** A vitest time limit for a property of `numRuns` runs of at most `msPerRun` each. */
export function limitMs(numRuns: number, msPerRun: number): number {
  return Math.max(60_000, Number(process.env.FUZZ_RUNS ?? numRuns) * msPerRun);
}

/** The most one input may take: past it, a loader counts as hanging. */
const HANG_MS = 10_000;

/**
 * Runs a loader on one input: it returns, or throws a UserError (DataError, SafetensorsError are
 * UserErrors) whose message is one non-empty line. Anything else (TypeError, RangeError, …) fails
 * the property with the error's stack.
 */
export function expectAcceptOrUserError(load: () => unknown): 'accepted' | 'rejected' {
  const start = Date.now();
  try {
    load();
    return 'accepted';
  } catch (e) {
    checkRejection(e);
    return 'rejected';
  } finally {
    expect(Date.now() - start, 'one input took too long (a hang?)').toBeLessThan(HANG_MS);
  }
}

/** The async form of expectAcceptOrUserError. */
export async function expectAcceptOrUserErrorAsync(
  load: () => Promise<unknown>,
): Promise<'accepted' | 'rejected'> {
  const start = Date.now();
  try {
    await load();
    return 'accepted';
  } catch (e) {
    checkRejection(e);
    return 'rejected';
  } finally {
    expect(Date.now() - start, 'one input took too long (a hang?)').toBeLessThan(HANG_MS);
  }
}

function checkRejection(e: unknown): void {
  if (!(e instanceof UserError)) {
    const err = e as Error;
    throw new Error(`not a UserError: ${err?.name}: ${err?.stack ?? String(e)}`);
  }
  expect(e.message, 'a rejection names its cause').not.toBe('');
  expect(e.message, 'a rejection is one line').not.toMatch(/[\n\r]/);
}

/** The CLI's answer to a bad input: exit 0, or 2 with one line on stderr, never a stack. */
export function expectCliOutcome(r: { code: number; out: string; err: string }): void {
  if (r.code === 0) return;
  expect(r.err, 'no internal error').not.toMatch(/internal error|\n\s+at /);
  expect(r.code, `exit code 2 for a user error; stderr: ${r.err}`).toBe(2);
  expect(r.err.trimEnd().split('\n'), `one line on stderr: ${r.err}`).toHaveLength(1);
  expect(r.err).toMatch(/^lfc: /);
}

// ---- structural mutation of JSON values ------------------------------------------------------

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type Path = (string | number)[];

/** Values that loaders get wrong: wrong types, extremes, NaN and infinities (as JSON allows). */
export const weirdValue: fc.Arbitrary<Json> = fc.oneof(
  fc.constantFrom<Json>(
    null,
    true,
    false,
    0,
    -1,
    1,
    0.5,
    -0.5,
    2 ** 31,
    2 ** 32 + 1,
    2 ** 53 + 2,
    -(2 ** 53),
    1e308,
    -1e308,
    1e-300,
    '',
    'NaN',
    'x\ny',
    '__proto__',
    [],
    {},
    [[]],
    [-1],
    [1e308],
    [0, 0],
    { a: 1 },
  ),
  fc.integer({ min: -1000, max: 1000 }),
  fc.double(),
  fc.string({ maxLength: 8 }),
  fc.array(fc.integer({ min: -2, max: 70 }), { maxLength: 4 }),
);

/** Every path to a value inside `v` (the root is []). */
function paths(v: Json, at: Path = [], out: Path[] = []): Path[] {
  out.push(at);
  if (Array.isArray(v)) v.forEach((x, i) => paths(x, [...at, i], out));
  else if (v !== null && typeof v === 'object')
    for (const [k, x] of Object.entries(v)) paths(x, [...at, k], out);
  return out;
}

/** One edit: at the `pick`-th path (modulo their count), what to do, and a value if it needs one. */
export interface JsonEdit {
  pick: number;
  kind: 'replace' | 'delete' | 'duplicate' | 'add-key' | 'wrap';
  value: Json;
}

export const jsonEdit: fc.Arbitrary<JsonEdit> = fc.record({
  pick: fc.nat(),
  kind: fc.constantFrom('replace', 'replace', 'delete', 'delete', 'duplicate', 'add-key', 'wrap'),
  value: weirdValue,
});

export const jsonEdits = (max = 3): fc.Arbitrary<JsonEdit[]> =>
  fc.array(jsonEdit, { minLength: 1, maxLength: max });

/**
 * `base` with the edits applied, each at one of its paths (leaves and containers alike): a field
 * replaced by a weird value or deleted, an array element duplicated, an unknown key added, a
 * value wrapped in a list. `only` keeps the edits to paths under it.
 */
export function mutateJson(base: unknown, edits: readonly JsonEdit[], only: Path = []): Json {
  let root = structuredClone(base) as Json;
  for (const edit of edits) {
    const all = paths(root).filter(
      (p) => p.length >= only.length && only.every((k, i) => p[i] === k),
    );
    if (!all.length) continue;
    const path = all[edit.pick % all.length];
    if (path.length === 0) {
      root = edit.kind === 'wrap' ? [root] : edit.value;
      continue;
    }
    const parent = path.slice(0, -1).reduce<Json>((n, k) => (n as never)[k], root) as
      Json[] | Record<string, Json>;
    const key = path[path.length - 1];
    const old = (parent as never)[key] as Json;
    if (Array.isArray(parent)) {
      const i = key as number;
      if (edit.kind === 'delete') parent.splice(i, 1);
      else if (edit.kind === 'duplicate') parent.splice(i, 0, structuredClone(old));
      else if (edit.kind === 'wrap') parent[i] = [old];
      else parent[i] = edit.value;
    } else {
      const k = key as string;
      if (edit.kind === 'delete') delete parent[k];
      else if (edit.kind === 'add-key') parent[`${k}_extra`] = edit.value;
      else if (edit.kind === 'wrap') parent[k] = [old];
      else parent[k] = edit.value;
    }
  }
  return root;
}

// ---- byte mutations --------------------------------------------------------------------------

export interface ByteEdit {
  kind: 'flip' | 'set' | 'truncate' | 'insert' | 'delete';
  at: number; // a fraction of the length, in 1/2^16
  byte: number;
}

export const byteEdits = (max = 4): fc.Arbitrary<ByteEdit[]> =>
  fc.array(
    fc.record({
      kind: fc.constantFrom('flip', 'flip', 'set', 'truncate', 'insert', 'delete'),
      at: fc.nat({ max: 0xffff }),
      byte: fc.nat({ max: 255 }),
    }),
    { minLength: 1, maxLength: max },
  );

/** Bit flips, byte sets, truncation, insertion and deletion, at positions spread over the bytes. */
export function mutateBytes(base: Uint8Array, edits: readonly ByteEdit[]): Buffer {
  let b = Buffer.from(base);
  for (const e of edits) {
    const i = Math.floor((e.at / 0x10000) * b.length);
    if (e.kind === 'flip' && b.length) b[i] ^= 1 << (e.byte & 7);
    else if (e.kind === 'set' && b.length) b[i] = e.byte;
    else if (e.kind === 'truncate') b = b.subarray(0, i);
    else if (e.kind === 'insert')
      b = Buffer.concat([b.subarray(0, i), Buffer.alloc(1 + (e.byte % 16), e.byte), b.subarray(i)]);
    else if (e.kind === 'delete')
      b = Buffer.concat([b.subarray(0, i), b.subarray(i + 1 + (e.byte % 16))]);
  }
  return b;
}
