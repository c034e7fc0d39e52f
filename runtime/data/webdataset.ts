// A WebDataset: tar shards whose members are grouped into samples by key, the member path up to
// the first '.' of its basename (`dir/s7.json`, `dir/s7.0.png`: key `dir/s7`, suffixes `json`,
// `0.png`); a sample is a run of consecutive members with one key. Its `.json` member is a record
// as a JSONL line holds it (records.ts), and its image strings name members of the same sample: the
// whole member name, its basename, or the suffix after `<key>.`.
//
// Opening makes one sequential pass over every shard with tar-stream's extract, keeping for each
// member the byte offset and size of its data (not the data); sample(i) and an image's read() then
// read those bytes by offset, synchronously. Samples are numbered across the shards in order. The
// pass streams every byte of the shards: measured 0.7-0.9 GB/s from the page cache (10 shards,
// 10k samples of a 24 KB image each, 265 MB in 0.3-0.4 s).
// Shards: one .tar file; a folder's .tar files sorted by name; or, in a Megatron-Energon dataset
// folder, the shards its .nv-meta/.info.json (or .info.yaml) lists in shard_counts, in that order
// and with those sample counts checked (its split.yaml, which picks shards per split, is not read).

import { createReadStream, createWriteStream, existsSync, readdirSync, statSync } from 'node:fs';
import { basename, extname, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { makeDirs } from '../../compiler/files.js';
import tar from 'tar-stream';
import YAML from 'yaml';
import { cannotRead, parseFile, UserError } from '../../compiler/errors.js';
import { openJsonl } from './jsonl.js';
import {
  jsonProblem,
  readRange,
  recordImageNames,
  recordToSample,
  withImageNames,
  type Dataset,
} from './records.js';
import { DataError, type ImageSource, type RawSample } from './sample.js';

export interface WebDataset extends Dataset {
  readonly kind: 'webdataset';
  /** the shard files, in sample order */
  readonly shards: readonly string[];
}

/** A tar member's data: where it lies in the shard. */
interface Member {
  readonly name: string;
  /** the name after `<key>.` ('' when the basename has no '.') */
  readonly suffix: string;
  readonly offsetBytes: number;
  readonly sizeBytes: number;
}

interface TarSample {
  readonly shard: string;
  readonly key: string;
  readonly members: Member[];
}

/** A tar header is one block. */
const TAR_BLOCK_BYTES = 512;

/** A member name split into its sample key and its suffix. */
function splitKey(name: string): { key: string; suffix: string } {
  const dot = name.indexOf('.', name.lastIndexOf('/') + 1);
  return dot < 0
    ? { key: name, suffix: '' }
    : { key: name.slice(0, dot), suffix: name.slice(dot + 1) };
}

/** The file members of a shard, in order, with their data's offsets (one pass, data not kept). */
async function indexShard(shard: string): Promise<Member[]> {
  const members: Member[] = [];
  const extract = tar.extract();
  extract.on('entry', (header, stream, next) => {
    if (header.type === 'file' || header.type === 'contiguous-file') {
      // tar-stream's `offset` is that of the member's own header block (after any pax or GNU
      // long-name records); its data starts in the next block.
      const offsetBytes = stream.offset + TAR_BLOCK_BYTES;
      members.push({
        name: header.name,
        suffix: splitKey(header.name).suffix,
        offsetBytes,
        sizeBytes: header.size,
      });
    }
    stream.on('end', () => next());
    stream.resume();
  });
  try {
    await pipeline(createReadStream(shard, { highWaterMark: 1 << 20 }), extract);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).syscall !== undefined)
      throw new UserError(cannotRead(shard, e));
    throw new UserError(`${shard}: not a tar file (${(e as Error).message.split('\n')[0]})`);
  }
  return members;
}

/** Consecutive members with one key, as samples. */
function groupSamples(shard: string, members: Member[]): TarSample[] {
  const samples: TarSample[] = [];
  let last: TarSample | undefined;
  for (const m of members) {
    const { key } = splitKey(m.name);
    if (last?.key !== key) samples.push((last = { shard, key, members: [] }));
    last.members.push(m);
  }
  return samples;
}

/** The shards of a path, in order, and the sample count each should have when a manifest says. */
function listShards(path: string): { shards: string[]; info?: string; counts?: number[] } {
  let isDirectory: boolean;
  try {
    isDirectory = statSync(path).isDirectory();
  } catch (e) {
    throw new UserError(cannotRead(path, e));
  }
  if (!isDirectory) return { shards: [path] };
  // Energon writes .info.json (.info.yaml before); YAML reads both
  const info = ['.info.json', '.info.yaml']
    .map((name) => join(path, '.nv-meta', name))
    .find((p) => existsSync(p));
  if (info !== undefined) {
    const json = parseFile(info, 'YAML', (t) => YAML.parse(t) as unknown) as {
      shard_counts?: unknown;
    } | null;
    const counts = json?.shard_counts;
    if (typeof counts !== 'object' || counts === null || Object.keys(counts).length === 0)
      throw new UserError(`${info}: shard_counts must map shard files to sample counts`);
    const entries = Object.entries(counts as Record<string, unknown>);
    for (const [name, n] of entries)
      if (!Number.isInteger(n) || (n as number) < 0)
        throw new UserError(`${info}: shard_counts[${name}] is ${JSON.stringify(n)}, not a count`);
    return {
      shards: entries.map(([name]) => join(path, name)),
      info,
      counts: entries.map(([, n]) => n as number),
    };
  }
  const names = readdirSync(path, { withFileTypes: true })
    .filter((e) => e.isFile() && e.name.endsWith('.tar'))
    .map((e) => e.name)
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  if (names.length === 0) throw new UserError(`${path}: no .tar shards in this folder`);
  return { shards: names.map((name) => join(path, name)) };
}

/** A sample's member named by an image string: the whole name, the basename, or the suffix. */
function findMember(sample: TarSample, name: string): Member | undefined {
  return (
    sample.members.find((m) => m.name === name) ??
    sample.members.find((m) => basename(m.name) === name) ??
    sample.members.find((m) => m.suffix === name)
  );
}

/** Opens one .tar shard or a folder of them; a shard that is not a tar is a UserError naming it. */
export async function openWebDataset(path: string): Promise<WebDataset> {
  const { shards, info, counts } = listShards(path);
  const samples: TarSample[] = [];
  for (const [s, shard] of shards.entries()) {
    const found = groupSamples(shard, await indexShard(shard));
    if (counts !== undefined && found.length !== counts[s])
      throw new UserError(`${shard}: ${found.length} samples, but ${info} says ${counts[s]}`);
    for (const sample of found) samples.push(sample);
  }
  if (samples.length === 0) throw new UserError(`${path}: no samples (the shards are empty)`);

  const image = (sample: TarSample, jsonWhere: string, name: string): ImageSource => {
    const m = findMember(sample, name);
    if (m === undefined) {
      const names = sample.members.map((x) => x.name).join(', ');
      throw new DataError(
        jsonWhere,
        `image '${name}' is no member of the sample (it has ${names})`,
      );
    }
    const where = `${sample.shard}:${m.name}`;
    return { where, read: () => readRange(sample.shard, m.offsetBytes, m.sizeBytes, where) };
  };
  return {
    path,
    kind: 'webdataset',
    size: samples.length,
    shards,
    sample(i: number): RawSample {
      if (!Number.isInteger(i) || i < 0 || i >= samples.length)
        throw new RangeError(`${path}: sample ${i} out of range (${samples.length} samples)`);
      const sample = samples[i];
      const where = `${sample.shard}:${sample.key}`;
      const json = sample.members.find((m) => m.suffix === 'json');
      if (json === undefined) {
        const names = sample.members.map((x) => x.name).join(', ');
        throw new DataError(where, `no .json member (the sample has ${names})`);
      }
      const jsonWhere = `${sample.shard}:${json.name}`;
      const text = readRange(sample.shard, json.offsetBytes, json.sizeBytes, jsonWhere);
      let record: unknown;
      try {
        record = JSON.parse(text.toString('utf8')) as unknown;
      } catch (e) {
        throw new DataError(jsonWhere, jsonProblem(e));
      }
      return recordToSample(record, where, jsonWhere, (name) => image(sample, jsonWhere, name));
    },
  };
}

/** One sample to write: its `<key>.json` member, and `<key>.<name>` for each file. */
export interface WebDatasetSample {
  readonly key: string;
  readonly json: object;
  readonly files: readonly { readonly name: string; readonly data: Buffer }[];
}

/** Members get this time, so that the same samples make the same shard bytes. */
const MEMBER_MTIME = new Date(0);

/**
 * Writes samples into shards `dir/shard-000000.tar`, … of `perShard` samples each (the last may
 * hold fewer), with tar-stream's pack; returns their paths. A key's basename has no '.', a file
 * name no '/' (either would move the member to another sample), and no file is named `json`.
 */
export async function writeWebDataset(
  dir: string,
  samples: Iterable<WebDatasetSample>,
  perShard: number,
): Promise<string[]> {
  if (!Number.isInteger(perShard) || perShard < 1)
    throw new UserError(`samples per shard must be a positive integer, not ${perShard}`);
  makeDirs(dir);
  const shards: string[] = [];
  let pack: tar.Pack | undefined;
  let written: Promise<void> | undefined;
  let inShard = 0;
  const close = async (): Promise<void> => {
    pack?.finalize();
    await written;
  };
  const add = (name: string, data: Buffer): Promise<void> =>
    new Promise((resolve, reject) =>
      pack!.entry({ name, size: data.length, mode: 0o644, mtime: MEMBER_MTIME }, data, (e) =>
        e ? reject(e) : resolve(),
      ),
    );
  try {
    for (const sample of samples) {
      const { key, suffix } = splitKey(sample.key);
      if (key === '' || suffix !== '')
        throw new UserError(`sample key '${sample.key}': its basename has a '.'`);
      for (const { name } of sample.files)
        if (name === '' || name.includes('/') || name === 'json')
          throw new UserError(`sample ${key}: file name '${name}' cannot be a member suffix`);
      if (pack === undefined || inShard === perShard) {
        await close();
        const shard = join(dir, `shard-${String(shards.length).padStart(6, '0')}.tar`);
        shards.push(shard);
        pack = tar.pack();
        written = pipeline(pack, createWriteStream(shard));
        inShard = 0;
      }
      await add(`${key}.json`, Buffer.from(JSON.stringify(sample.json)));
      for (const file of sample.files) await add(`${key}.${file.name}`, file.data);
      inShard++;
    }
  } catch (e) {
    // a bad sample: the shard being written is closed (left as written so far) before the error
    pack?.destroy();
    await written?.catch(() => undefined);
    throw e;
  }
  await close();
  return shards;
}

/**
 * Writes a WebDataset copy of a JSONL dataset: sample i has key `i` (9 digits), its line's record
 * as `<key>.json` with the image strings rewritten to the members' suffixes, and its images, read
 * in order, as `<key>.<j>.<ext>`. A bad line or an unreadable image stops it (its DataError).
 */
export async function jsonlToWebDataset(
  jsonlPath: string,
  outDir: string,
  perShard: number,
): Promise<string[]> {
  const jsonl = openJsonl(jsonlPath);
  function* samples(): Generator<WebDatasetSample> {
    for (let i = 0; i < jsonl.size; i++) {
      const record = jsonl.record(i);
      const names = recordImageNames(record, jsonl.where(i));
      const files = jsonl.sample(i).images.map((img, j) => {
        const ext = extname(names[j]).slice(1).toLowerCase();
        return { name: `${j}.${/^[a-z0-9]+$/.test(ext) ? ext : 'bin'}`, data: img.read() };
      });
      const json = withImageNames(
        record as Record<string, unknown>,
        files.map((f) => f.name),
      );
      yield { key: String(i).padStart(9, '0'), json, files };
    }
  }
  return writeWebDataset(outDir, samples(), perShard);
}
