// Property tests of the safetensors readers (runtime/safetensors.ts) and the batch-file loader
// on top of them (runtime/batch.ts readBatchFile, `lfc run --batch`): a valid batch file's
// header edited structurally (fields dropped, given wrong types, extreme numbers) and its bytes
// flipped, truncated or cut; each is read, or refused with a one-line UserError naming the file.
import fc from 'fast-check';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { readBatchFile, writeBatchFile, type Microbatch } from '../../runtime/batch.js';
import { parseSafetensors, readSafetensorsHeader } from '../../runtime/safetensors.js';
import {
  byteEdits,
  expectAcceptOrUserError,
  jsonEdits,
  limitMs,
  mutateBytes,
  mutateJson,
  runs,
} from './fuzz.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-fuzz-st-'));

/** Two microbatches of the contract, one with an image, one with patches and grids. */
function batch(): Microbatch[] {
  const S = 8;
  const text = (v: number) => Int32Array.from({ length: S }, (_, i) => (i < 4 ? 1 : v + i));
  return [
    {
      tokens: text(30),
      labels: text(31),
      lossMask: new Uint8Array(S).fill(1),
      positions: Int32Array.from({ length: S }, (_, i) => i),
      segments: new Int32Array(S),
      images: [{ height: 8, width: 8, pixels: new Float32Array(3 * 64).fill(0.5) }],
    },
    {
      tokens: text(40),
      labels: text(41),
      lossMask: new Uint8Array(S).fill(1),
      positions: Int32Array.from({ length: 3 * S }, (_, i) => i % S),
      segments: new Int32Array(S),
      images: [],
      pixelValues: new Float32Array(4 * 48).fill(0.25),
      grids: Int32Array.of(1, 2, 2),
      windowSegments: new Int32Array(4),
      imageTokenId: 1,
      captionMask: new Uint8Array(S),
    },
  ];
}

const basePath = join(dir, 'batch.safetensors');
writeBatchFile(basePath, batch());
const file = readFileSync(basePath);
const base = parseSafetensors(file, basePath);
const headerLength = Number(file.readBigUInt64LE(0));
const header = JSON.parse(file.subarray(8, 8 + headerLength).toString('utf8')) as unknown;
const data = file.subarray(8 + headerLength);

/** A safetensors file of this header (any JSON text) and data section. */
function withHeader(text: string, bytes: Uint8Array = data): Buffer {
  const json = Buffer.from(text, 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([len, json, bytes]);
}

/** Every reader of the file: parse in memory, the header alone from disk, the batch loader. */
function readAll(bytes: Buffer, name: string): void {
  const path = join(dir, name);
  writeFileSync(path, bytes);
  expectAcceptOrUserError(() => parseSafetensors(bytes, path));
  expectAcceptOrUserError(() => readSafetensorsHeader(path));
  expectAcceptOrUserError(() => readBatchFile(path));
}

describe('safetensors and batch files under mutation', () => {
  it('the valid file reads back', () => {
    expect(base.tensors.size).toBeGreaterThan(10);
    expect(readBatchFile(basePath)).toHaveLength(2);
  });

  it(
    'header fields dropped, retyped, given extreme values',
    () => {
      fc.assert(
        fc.property(jsonEdits(3), (edits) => {
          readAll(withHeader(JSON.stringify(mutateJson(header, edits))), 'header.safetensors');
        }),
        runs(300),
      );
    },
    limitMs(300, 50),
  );

  it(
    'any JSON value as the header',
    () => {
      fc.assert(
        fc.property(fc.jsonValue({ maxDepth: 3 }), (v) => {
          readAll(withHeader(JSON.stringify(v) ?? 'null'), 'json.safetensors');
        }),
        runs(200),
      );
    },
    limitMs(200, 50),
  );

  it(
    'bytes flipped, set, inserted, deleted, truncated',
    () => {
      fc.assert(
        fc.property(byteEdits(4), (edits) => {
          readAll(mutateBytes(file, edits), 'bytes.safetensors');
        }),
        runs(300),
      );
    },
    limitMs(300, 50),
  );

  it('regressions', () => {
    // a header of null, or a tensor whose data_offsets is a number, was a TypeError
    for (const text of [
      'null',
      '{"mb0.tokens": {"dtype": "I32", "shape": [1], "data_offsets": 4}}',
      '{"mb0.tokens": null}',
      '{"__metadata__": 5}',
    ])
      readAll(withHeader(text, new Uint8Array(4)), 'regression.safetensors');
  });
});
