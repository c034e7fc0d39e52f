// A Hugging Face model directory, read as a stream: `model.safetensors`, or
// `model.safetensors.index.json` and the shards it names. Opening reads the index and each shard's
// header (never a shard's data); readView then reads the elements of one parameter's piece with
// positioned reads of exactly its bytes: contiguous row ranges as they are, a column slice row by
// row, runs that touch coalesced into one read of at most WINDOW_BYTES. Nothing holds more than a
// window and the caller's piece. Every problem is a UserError that names the file (and the tensor).

import { closeSync, existsSync, openSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { parseFile, UserError } from '../../compiler/errors.js';
import { roundToBf16 } from '../bf16.js';
import { readRange, readSafetensorsHeader, type HeaderEntry } from '../safetensors.js';
import type { LfcView } from './names.js';

export const INDEX_FILE = 'model.safetensors.index.json';
export const SINGLE_FILE = 'model.safetensors';

/** The dtypes lfc converts from (to f32 or bf16). */
export const READABLE_DTYPES = ['BF16', 'F16', 'F32'] as const;
type Readable = (typeof READABLE_DTYPES)[number];
const ELEMENT_BYTES: Record<Readable, number> = { BF16: 2, F16: 2, F32: 4 };

/**
 * the most one read takes. Runs of a piece that touch are one read; runs apart are read apart (a
 * column slice, row by row): reading whole rows instead and dropping the rest was measured slower
 * (bench/hf-load: 1.65× the share's bytes, in 1.7k reads instead of 202k).
 */
export const WINDOW_BYTES = 8 << 20;

export interface HfTensorEntry extends HeaderEntry {
  /** the shard holding it */
  readonly file: string;
}

/** A piece's destination: f32 values, or bf16 bits (a bf16 plan's own buffer). */
export type PieceBuffer = Float32Array | { readonly bf16: Uint16Array };

/** Statistics of a directory's reads so far. */
export interface ReadStats {
  reads: number;
  bytes: number;
}

export class HfCheckpointDir {
  /** where a missing tensor is looked for: the index, or the one file */
  readonly listing: string;
  readonly stats: ReadStats = { reads: 0, bytes: 0 };
  private readonly fds = new Map<string, number>();
  private window = new Uint8Array(0);

  private constructor(
    readonly dir: string,
    readonly tensors: ReadonlyMap<string, HfTensorEntry>,
    listing: string,
  ) {
    this.listing = listing;
  }

  /** Opens a model directory: its index (or single file) and every shard's header. */
  static open(dir: string): HfCheckpointDir {
    if (!existsSync(dir) || !statSync(dir).isDirectory())
      throw new UserError(`${dir}: not a directory (want a Hugging Face model directory)`);
    const index = join(dir, INDEX_FILE);
    const single = join(dir, SINGLE_FILE);
    const tensors = new Map<string, HfTensorEntry>();
    if (existsSync(index)) {
      for (const [file, names] of shardsOfIndex(index)) {
        const path = join(dir, file);
        if (!existsSync(path))
          throw new UserError(`${index}: names shard ${file}, which does not exist in ${dir}`);
        const header = readSafetensorsHeader(path);
        for (const name of names) {
          const entry = header.entries.get(name);
          if (!entry)
            throw new UserError(`${index}: maps tensor ${name} to ${file}, whose header lacks it`);
          tensors.set(name, { ...entry, file: path });
        }
      }
      return new HfCheckpointDir(dir, tensors, index);
    }
    if (existsSync(single)) {
      for (const [name, entry] of readSafetensorsHeader(single).entries)
        tensors.set(name, { ...entry, file: single });
      return new HfCheckpointDir(dir, tensors, single);
    }
    throw new UserError(
      `${dir}: has neither ${SINGLE_FILE} nor ${INDEX_FILE} (not a Hugging Face model directory?)`,
    );
  }

  /** The tensor, readable and of this shape; otherwise a UserError naming file and tensor. */
  entry(name: string, shape: readonly number[], what: string): HfTensorEntry {
    const t = this.tensors.get(name);
    if (!t) throw new UserError(`${this.listing}: no tensor ${name} (${what})`);
    if (!(READABLE_DTYPES as readonly string[]).includes(t.dtype))
      throw new UserError(
        `${t.file}: tensor ${name} is ${t.dtype}; lfc reads ${READABLE_DTYPES.join(', ')}`,
      );
    if (t.shape.join() !== shape.join())
      throw new UserError(
        `${t.file}: tensor ${name} is ${t.dtype}[${t.shape.join(', ')}], this model wants [${shape.join(', ')}] (${what})`,
      );
    return t;
  }

  /**
   * Reads the piece of a parameter (its view into a tensor; per dim, the global indices it holds)
   * into `into`, row-major over the piece's shape, converting from the tensor's dtype.
   */
  readView(view: LfcView, index: readonly (readonly number[])[], into: PieceBuffer): void {
    const t = this.tensors.get(view.hf)!;
    const dtype = t.dtype as Readable;
    const eb = ELEMENT_BYTES[dtype];
    const fd = this.fd(t.file);
    let pending: Run[] = [];
    let windowStart = 0;
    let windowEnd = 0;
    const flush = () => {
      if (!pending.length) return;
      const bytes = windowEnd - windowStart;
      if (this.window.byteLength < bytes) this.window = new Uint8Array(Math.max(bytes, 1 << 16));
      readRange(fd, windowStart, bytes, t.file, this.window);
      this.stats.reads++;
      this.stats.bytes += bytes;
      for (const r of pending)
        convert(dtype, this.window.buffer, r.file - windowStart, r.count, into, r.dst, r.dstStride);
      pending = [];
    };
    for (const run of runsOf(view, index)) {
      // one run: `count` consecutive elements of the tensor → every dstStride-th of the piece
      for (let done = 0; done < run.count;) {
        const count = Math.min(run.count - done, Math.floor(WINDOW_BYTES / eb));
        const file = t.start + (run.element + done) * eb;
        const end = file + count * eb;
        if (pending.length && (file !== windowEnd || end - windowStart > WINDOW_BYTES)) flush();
        if (!pending.length) windowStart = file;
        windowEnd = end;
        pending.push({
          file,
          count,
          dst: run.dst + done * run.dstStride,
          dstStride: run.dstStride,
        });
        done += count;
      }
    }
    flush();
  }

  close(): void {
    for (const fd of this.fds.values()) closeSync(fd);
    this.fds.clear();
  }

  private fd(file: string): number {
    let fd = this.fds.get(file);
    if (fd === undefined) {
      fd = openSync(file, 'r');
      this.fds.set(file, fd);
    }
    return fd;
  }
}

/** The index's shards and the tensors it maps to each; a malformed index is a UserError. */
function shardsOfIndex(index: string): Map<string, string[]> {
  const json: unknown = parseFile(index, 'JSON', (text) => JSON.parse(text) as unknown);
  const map = (json as { weight_map?: unknown } | null)?.weight_map;
  if (typeof map !== 'object' || map === null || Array.isArray(map))
    throw new UserError(`${index}: no weight_map object (not a safetensors index?)`);
  const shards = new Map<string, string[]>();
  for (const [name, file] of Object.entries(map as Record<string, unknown>)) {
    if (typeof file !== 'string' || file.includes('/') || file.includes('\\') || file === '')
      throw new UserError(
        `${index}: tensor ${name} maps to ${JSON.stringify(file)}, not a file name`,
      );
    const list = shards.get(file) ?? [];
    list.push(name);
    shards.set(file, list);
  }
  return shards;
}

/** `count` consecutive elements of a tensor, from `element`, and where they go in the piece. */
interface Run {
  readonly file: number;
  readonly count: number;
  readonly dst: number;
  readonly dstStride: number;
}

/**
 * The runs of consecutive tensor elements a piece covers, in the piece's order. The dim whose
 * stride is 1 is the inner one: along it a piece's consecutive indices are consecutive elements
 * (a row range of a row-major tensor, or one row's column slice); every other dim steps between
 * runs. A view with no stride-1 dim reads element by element.
 */
export function* runsOf(
  view: LfcView,
  index: readonly (readonly number[])[],
): Generator<{ element: number; count: number; dst: number; dstStride: number }> {
  const rank = index.length;
  const local = index.map((l) => l.length);
  if (local.some((n) => n === 0)) return;
  const localStrides = local.map((_, d) => local.slice(d + 1).reduce((a, b) => a * b, 1));
  const inner = rank === 0 ? -1 : view.strides.indexOf(1);
  // runs along the inner dim: [first global index, first local index, length]
  const spans: [number, number, number][] = [];
  if (inner >= 0) {
    const l = index[inner];
    for (let j = 0; j < l.length;) {
      let k = j + 1;
      while (k < l.length && l[k] === l[k - 1] + 1) k++;
      spans.push([l[j], j, k - j]);
      j = k;
    }
  }
  const outer = Array.from({ length: rank }, (_, d) => d).filter((d) => d !== inner);
  const at = new Array<number>(rank).fill(0);
  while (true) {
    let element = view.offset;
    let dst = 0;
    for (const d of outer) {
      element += index[d][at[d]] * view.strides[d];
      dst += at[d] * localStrides[d];
    }
    if (inner < 0) yield { element, count: 1, dst, dstStride: 1 };
    else
      for (const [g, j, n] of spans)
        yield {
          element: element + g,
          count: n,
          dst: dst + j * localStrides[inner],
          dstStride: localStrides[inner],
        };
    // the next combination of the outer dims, the last one fastest
    let d = outer.length - 1;
    while (d >= 0 && ++at[outer[d]] === local[outer[d]]) at[outer[d--]] = 0;
    if (d < 0) return;
  }
}

// ---- element conversion -------------------------------------------------------------------------

/** IEEE half → f32 (exact) */
export function halfToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/**
 * `count` elements of `dtype` at byte `at` of `src` into `into` from element `dst`, every
 * `stride`-th: to f32 exactly, to bf16 rounded to nearest even (bf16 to bf16: a copy).
 */
function convert(
  dtype: Readable,
  src: ArrayBufferLike,
  at: number,
  count: number,
  into: PieceBuffer,
  dst: number,
  stride: number,
): void {
  if (into instanceof Float32Array) {
    if (dtype === 'F32') {
      const s = new Float32Array(src, at, count);
      if (stride === 1) into.set(s, dst);
      else for (let i = 0; i < count; i++) into[dst + i * stride] = s[i];
      return;
    }
    const s = new Uint16Array(src, at, count);
    if (dtype === 'BF16') {
      const bits = new Uint32Array(into.buffer, into.byteOffset, into.length);
      for (let i = 0; i < count; i++) bits[dst + i * stride] = s[i] << 16;
    } else for (let i = 0; i < count; i++) into[dst + i * stride] = halfToF32(s[i]);
    return;
  }
  const out = into.bf16;
  if (dtype === 'BF16') {
    const s = new Uint16Array(src, at, count);
    if (stride === 1) out.set(s, dst);
    else for (let i = 0; i < count; i++) out[dst + i * stride] = s[i];
    return;
  }
  if (dtype === 'F32') {
    const s = new Float32Array(src, at, count);
    for (let i = 0; i < count; i++) out[dst + i * stride] = roundToBf16(s[i]);
    return;
  }
  const s = new Uint16Array(src, at, count);
  for (let i = 0; i < count; i++) out[dst + i * stride] = roundToBf16(halfToF32(s[i]));
}
