// The safetensors format, read and written here (no dependency): 8-byte little-endian header
// length, a JSON header { name: { dtype, shape, data_offsets: [begin, end] }, __metadata__? },
// then the raw little-endian bytes. Readers check every offset, so a truncated or foreign file
// is refused with a message that names it.

import { cannotRead, oneLine, UserError } from '../compiler/errors.js';
import {
  closeSync,
  fstatSync,
  fsyncSync,
  openSync,
  readFileSync,
  readSync,
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

/**
 * A tensor's elements: a copy, or with `shared` the file's own bytes where they are aligned for
 * the element type (a copy where not: the data section need not be aligned). Shared arrays are
 * views into one ArrayBuffer, for readers that only read them (never transfer their buffer).
 */
function view(
  dtype: SafeDType,
  buf: Buffer,
  begin: number,
  end: number,
  shared: boolean,
): TypedArray {
  let ab = buf.buffer;
  let at = buf.byteOffset + begin;
  if (!shared || at % BYTES[dtype] !== 0) {
    const bytes = new Uint8Array(end - begin);
    bytes.set(buf.subarray(begin, end));
    ab = bytes.buffer;
    at = 0;
  }
  const n = (end - begin) / BYTES[dtype];
  switch (dtype) {
    case 'F32':
      return new Float32Array(ab, at, n);
    case 'F64':
      return new Float64Array(ab, at, n);
    case 'I32':
      return new Int32Array(ab, at, n);
    case 'I64':
      return new BigInt64Array(ab, at, n);
    case 'U8':
      return new Uint8Array(ab, at, n);
    case 'BF16':
    case 'F16':
      return new Uint16Array(ab, at, n);
  }
}

export interface SafetensorsFile {
  readonly tensors: Map<string, Tensor>;
  readonly metadata: Record<string, string>;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function parseSafetensors(buf: Buffer, path = '<buffer>', shared = false): SafetensorsFile {
  const bad = (why: string) =>
    new SafetensorsError(`${path}: not a valid safetensors file: ${oneLine(why)}`);
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
  if (!isObject(header)) throw bad('the header is not a JSON object');
  const dataStart = 8 + n;
  const tensors = new Map<string, Tensor>();
  let metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(header)) {
    if (name === '__metadata__') {
      if (!isObject(raw)) throw bad('__metadata__ is not a JSON object');
      metadata = raw as Record<string, string>;
      continue;
    }
    const e = raw as { dtype?: string; shape?: number[]; data_offsets?: unknown };
    if (!e || typeof e.dtype !== 'string' || !Object.hasOwn(BYTES, e.dtype))
      throw bad(`tensor ${name} has dtype ${String(e?.dtype)}`);
    if (!Array.isArray(e.shape) || !e.shape.every((d) => Number.isInteger(d) && d >= 0))
      throw bad(`tensor ${name} has a bad shape`);
    const [b, end] = Array.isArray(e.data_offsets) ? (e.data_offsets as number[]) : [-1, -1];
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
      data: view(dtype, buf, dataStart + b, dataStart + end, shared),
    });
  }
  return { tensors, metadata };
}

/** A file's tensors, each a copy; `shared`: views of the file's bytes (see view). */
export function readSafetensors(path: string, shared = false): SafetensorsFile {
  let buf: Buffer;
  try {
    buf = readFileSync(path);
  } catch (e) {
    throw new SafetensorsError(cannotRead(path, e));
  }
  return parseSafetensors(buf, path, shared);
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

// ---- streaming: headers, positioned reads, tensor-by-tensor writes -----------------------------
// A checkpoint of a large model does not fit in memory whole: these read a file's header alone and
// then any byte range of it (readRange), and write a file header first, then tensor by tensor in
// chunks (SafetensorsWriter). Nothing here holds more than the caller's chunk.

/** Bytes per element of the dtypes a safetensors header may name (lfc converts only some). */
export const DTYPE_BYTES: Readonly<Record<string, number>> = {
  ...BYTES,
  F8_E4M3: 1,
  F8_E5M2: 1,
  I8: 1,
  BOOL: 1,
  I16: 2,
  U16: 2,
  U32: 4,
  U64: 8,
};

/** One tensor of a header: where its bytes lie in the file. */
export interface HeaderEntry {
  /** as the header names it: possibly a dtype lfc does not convert */
  readonly dtype: string;
  readonly shape: readonly number[];
  /** byte offset of its first byte in the file, and its length in bytes */
  readonly start: number;
  readonly bytes: number;
}

export interface SafetensorsHeader {
  readonly path: string;
  readonly entries: ReadonlyMap<string, HeaderEntry>;
  readonly metadata: Record<string, string>;
  readonly fileBytes: number;
}

/** a header larger than this is not a safetensors file (the format's own limit is 100 MB) */
const MAX_HEADER_BYTES = 100_000_000;

/**
 * The header of a safetensors file, read without its data (two positioned reads). Every tensor
 * must lie inside the file: a header that promises more bytes than the file has (a truncated
 * download or copy) is refused naming the file and the tensor.
 */
export function readSafetensorsHeader(path: string): SafetensorsHeader {
  const bad = (why: string) =>
    new SafetensorsError(`${path}: not a valid safetensors file: ${oneLine(why)}`);
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch (e) {
    throw new SafetensorsError(cannotRead(path, e));
  }
  try {
    const fileBytes = fstatSync(fd).size;
    if (fileBytes < 8) throw bad(`${fileBytes} bytes, shorter than the 8-byte header length`);
    const head = readRange(fd, 0, 8, path);
    const n = Number(Buffer.from(head.buffer, head.byteOffset, 8).readBigUInt64LE(0));
    if (n > MAX_HEADER_BYTES) throw bad(`a header of ${n} bytes`);
    if (n > fileBytes - 8)
      throw bad(`header of ${n} bytes but only ${fileBytes - 8} follow (truncated?)`);
    let header: Record<string, unknown>;
    try {
      const text = Buffer.from(readRange(fd, 8, n, path)).toString('utf8');
      header = JSON.parse(text) as Record<string, unknown>;
    } catch (e) {
      if (e instanceof SafetensorsError) throw e;
      throw bad('the header is not JSON');
    }
    if (typeof header !== 'object' || header === null || Array.isArray(header))
      throw bad('the header is not a JSON object');
    const dataStart = 8 + n;
    const entries = new Map<string, HeaderEntry>();
    let metadata: Record<string, string> = {};
    for (const [name, raw] of Object.entries(header)) {
      if (name === '__metadata__') {
        metadata = (raw ?? {}) as Record<string, string>;
        continue;
      }
      const e = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
      if (!e || typeof e.dtype !== 'string') throw bad(`tensor ${name} has no dtype`);
      const shape = e.shape;
      if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0))
        throw bad(`tensor ${name} has a bad shape`);
      const offsets = e.data_offsets;
      const [b, end] = Array.isArray(offsets) ? (offsets as number[]) : [-1, -1];
      if (!(Number.isInteger(b) && Number.isInteger(end) && b >= 0 && end >= b))
        throw bad(`tensor ${name} has bad offsets`);
      const size = Object.hasOwn(DTYPE_BYTES, e.dtype) ? DTYPE_BYTES[e.dtype] : undefined;
      const count = (shape as number[]).reduce((a, d) => a * d, 1);
      if (size !== undefined && end - b !== count * size)
        throw bad(`tensor ${name}: ${end - b} bytes for ${count} ${e.dtype} values`);
      if (dataStart + end > fileBytes)
        throw bad(
          `tensor ${name} ends at byte ${dataStart + end}, past the file's ${fileBytes} bytes (truncated?)`,
        );
      entries.set(name, { dtype: e.dtype, shape, start: dataStart + b, bytes: end - b });
    }
    return { path, entries, metadata, fileBytes };
  } finally {
    closeSync(fd);
  }
}

/**
 * `bytes` bytes of an open file from `position`, into `into` (or a fresh aligned buffer): a
 * positioned read, repeated until complete. A file that ends first is refused as truncated.
 */
export function readRange(
  fd: number,
  position: number,
  bytes: number,
  path: string,
  into: Uint8Array = new Uint8Array(bytes),
): Uint8Array {
  for (let at = 0; at < bytes;) {
    const n = readSync(fd, into, at, bytes - at, position + at);
    if (n === 0)
      throw new SafetensorsError(
        `${path}: ends at byte ${position + at}, before the ${bytes} bytes asked from ${position} (truncated?)`,
      );
    at += n;
  }
  return into;
}

/** What a tensor of a file being written is: its name, dtype and shape. */
export interface TensorDecl {
  readonly name: string;
  readonly dtype: SafeDType;
  readonly shape: readonly number[];
}

/** The file's header for these tensors, in this order: the JSON (padded to 8) and its length. */
export function headerBytes(
  tensors: readonly TensorDecl[],
  metadata: Record<string, string> = {},
): { bytes: Buffer; dataBytes: number } {
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    const n = t.shape.reduce((a, d) => a * d, 1) * BYTES[t.dtype];
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + n] };
    offset += n;
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8');
  json = Buffer.concat([json, Buffer.alloc((8 - (json.length % 8)) % 8, 0x20)]);
  const bytes = Buffer.alloc(8 + json.length);
  bytes.writeBigUInt64LE(BigInt(json.length), 0);
  json.copy(bytes, 8);
  return { bytes, dataBytes: offset };
}

/**
 * A safetensors file written as a stream: the header first (every tensor declared up front), then
 * each tensor's bytes in order, in chunks of any size. close() checks that every declared byte came,
 * and fsyncs. The caller writes into a temporary place and renames (writes are not atomic here).
 */
export class SafetensorsWriter {
  private readonly fd: number;
  private readonly sizes: number[];
  private next = 0;
  private writtenOfNext = 0;

  constructor(
    readonly path: string,
    readonly tensors: readonly TensorDecl[],
    metadata: Record<string, string> = {},
  ) {
    this.sizes = tensors.map((t) => t.shape.reduce((a, d) => a * d, 1) * BYTES[t.dtype]);
    this.fd = openSync(path, 'w');
    try {
      this.put(headerBytes(tensors, metadata).bytes);
    } catch (e) {
      closeSync(this.fd);
      throw e;
    }
  }

  /** The next bytes of the current tensor (`name`, which must be the one due). */
  write(name: string, chunk: Uint8Array): void {
    while (this.next < this.tensors.length && this.writtenOfNext === this.sizes[this.next]) {
      this.next++;
      this.writtenOfNext = 0;
    }
    const due = this.tensors[this.next];
    if (!due || due.name !== name)
      throw new Error(`${this.path}: wrote ${name}, but ${due?.name ?? 'nothing'} is due`);
    if (this.writtenOfNext + chunk.byteLength > this.sizes[this.next])
      throw new Error(`${this.path}: ${name} given more than its ${this.sizes[this.next]} bytes`);
    this.put(chunk);
    this.writtenOfNext += chunk.byteLength;
  }

  close(): void {
    try {
      const short = this.tensors.findIndex(
        (_, i) =>
          (i > this.next && this.sizes[i] > 0) ||
          (i === this.next && this.writtenOfNext < this.sizes[i]),
      );
      if (short >= 0)
        throw new Error(`${this.path}: ${this.tensors[short].name} was not written whole`);
      fsyncSync(this.fd);
    } finally {
      closeSync(this.fd);
    }
  }

  /** Closes without the checks (a failed export removes the file). */
  abandon(): void {
    closeSync(this.fd);
  }

  private put(bytes: Uint8Array): void {
    for (let at = 0; at < bytes.byteLength;) {
      const n = writeSync(this.fd, bytes, at, Math.min(bytes.byteLength - at, 1 << 30));
      if (n === 0) throw new Error(`${this.path}: the file system took no more bytes`);
      at += n;
    }
  }
}
