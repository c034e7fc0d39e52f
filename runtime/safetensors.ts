// The safetensors format, read and written here (no dependency): 8-byte little-endian header
// length, a JSON header { name: { dtype, shape, data_offsets: [begin, end] }, __metadata__? },
// then the raw little-endian bytes. Readers check every offset, so a truncated or foreign file
// is refused with a message that names it.

import { UserError } from '../compiler/errors.js';
import {
  closeSync,
  fsyncSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  writeSync,
} from 'node:fs';

export type SafeDType = 'F32' | 'F64' | 'I32' | 'I64' | 'U8' | 'BF16' | 'F16';

const BYTES: Record<SafeDType, number> = { F32: 4, F64: 8, I32: 4, I64: 8, U8: 1, BF16: 2, F16: 2 };

export type TypedArray =
  Float32Array | Float64Array | Int32Array | BigInt64Array | Uint8Array | Uint16Array;

export interface Tensor {
  readonly dtype: SafeDType;
  readonly shape: readonly number[];
  readonly data: TypedArray;
}

/** A malformed, truncated or unreadable file: always the user's input, so a UserError. */
export class SafetensorsError extends UserError {}

function view(dtype: SafeDType, buf: Buffer, begin: number, end: number): TypedArray {
  // copy into an aligned buffer: the data section need not be aligned for the element type
  const bytes = new Uint8Array(end - begin);
  bytes.set(buf.subarray(begin, end));
  const ab = bytes.buffer;
  switch (dtype) {
    case 'F32':
      return new Float32Array(ab);
    case 'F64':
      return new Float64Array(ab);
    case 'I32':
      return new Int32Array(ab);
    case 'I64':
      return new BigInt64Array(ab);
    case 'U8':
      return bytes;
    case 'BF16':
    case 'F16':
      return new Uint16Array(ab);
  }
}

export interface SafetensorsFile {
  readonly tensors: Map<string, Tensor>;
  readonly metadata: Record<string, string>;
}

export function parseSafetensors(buf: Buffer, path = '<buffer>'): SafetensorsFile {
  const bad = (why: string) =>
    new SafetensorsError(`${path}: not a valid safetensors file: ${why}`);
  if (buf.length < 8) throw bad(`${buf.length} bytes, shorter than the 8-byte header length`);
  const n = Number(buf.readBigUInt64LE(0));
  if (n > buf.length - 8)
    throw bad(`header of ${n} bytes but only ${buf.length - 8} follow (truncated?)`);
  let header: Record<string, unknown>;
  try {
    header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8')) as Record<string, unknown>;
  } catch {
    throw bad('the header is not JSON');
  }
  const dataStart = 8 + n;
  const tensors = new Map<string, Tensor>();
  let metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(header)) {
    if (name === '__metadata__') {
      metadata = raw as Record<string, string>;
      continue;
    }
    const e = raw as { dtype?: string; shape?: number[]; data_offsets?: [number, number] };
    if (!e || typeof e.dtype !== 'string' || !(e.dtype in BYTES))
      throw bad(`tensor ${name} has dtype ${String(e?.dtype)}`);
    if (!Array.isArray(e.shape) || !e.shape.every((d) => Number.isInteger(d) && d >= 0))
      throw bad(`tensor ${name} has a bad shape`);
    const [b, end] = e.data_offsets ?? [-1, -1];
    const count = e.shape.reduce((a, d) => a * d, 1);
    const dtype = e.dtype as SafeDType;
    if (!(Number.isInteger(b) && Number.isInteger(end) && b >= 0 && end >= b))
      throw bad(`tensor ${name} has bad offsets`);
    if (end - b !== count * BYTES[dtype])
      throw bad(`tensor ${name}: ${end - b} bytes for ${count} ${dtype} values`);
    if (dataStart + end > buf.length)
      throw bad(`tensor ${name} ends past the end of the file (truncated?)`);
    tensors.set(name, {
      dtype,
      shape: e.shape,
      data: view(dtype, buf, dataStart + b, dataStart + end),
    });
  }
  return { tensors, metadata };
}

export function readSafetensors(path: string): SafetensorsFile {
  let buf: Buffer;
  try {
    buf = readFileSync(path);
  } catch (e) {
    throw new SafetensorsError(
      `cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`,
    );
  }
  return parseSafetensors(buf, path);
}

export function serializeSafetensors(
  tensors: ReadonlyMap<string, Tensor>,
  metadata: Record<string, string> = {},
): Buffer {
  const names = [...tensors.keys()].sort();
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  let offset = 0;
  for (const name of names) {
    const t = tensors.get(name)!;
    const bytes = t.data.byteLength;
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8');
  const pad = (8 - (json.length % 8)) % 8;
  json = Buffer.concat([json, Buffer.alloc(pad, 0x20)]);
  const out = Buffer.alloc(8 + json.length + offset);
  out.writeBigUInt64LE(BigInt(json.length), 0);
  json.copy(out, 8);
  let at = 8 + json.length;
  for (const name of names) {
    const d = tensors.get(name)!.data;
    Buffer.from(d.buffer, d.byteOffset, d.byteLength).copy(out, at);
    at += d.byteLength;
  }
  return out;
}

/** Writes atomically: a temporary file in the same directory, fsync, rename. */
export function writeSafetensors(
  path: string,
  tensors: ReadonlyMap<string, Tensor>,
  metadata: Record<string, string> = {},
): void {
  writeFileAtomic(path, serializeSafetensors(tensors, metadata));
}

/**
 * Writes a file whole or not at all: a temporary file in the same directory, written to the end,
 * fsync, rename. A write may take fewer bytes than asked (a disk filling up takes what fits), so
 * it loops until the next write takes none and throws ENOSPC; the temporary file is then removed
 * and whatever `path` held before is still there.
 */
export function writeFileAtomic(path: string, data: Buffer | string): void {
  const bytes = typeof data === 'string' ? Buffer.from(data) : data;
  const tmp = `${path}.tmp-${process.pid}`;
  const fd = openSync(tmp, 'w');
  try {
    try {
      for (let at = 0; at < bytes.length;) {
        const n = writeSync(fd, bytes, at, Math.min(bytes.length - at, 1 << 30));
        if (n === 0) throw new Error(`${tmp}: the file system took no more bytes`);
        at += n;
      }
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
}
