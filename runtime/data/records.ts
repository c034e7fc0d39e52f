// The record both dataset formats hold, one JSON object per sample (a JSONL line, a WebDataset
// sample's .json member), and its conversion to a RawSample. The fields read:
//   conversations  [{from: human|gpt|system|user|assistant, value: string}]  (LLaVA, ShareGPT)
//   messages       [{role: the same names, content: string}]  (instead of conversations)
//   image          a string, or images: [string]; or neither (a text-only sample)
// Other fields (id, …) are ignored. What an image string names is the reader's business (a path
// beside the JSONL file, a member of the sample's tar group): it passes `image` to resolve one.
// The count of `<image>` markers is not checked here: the text stage does that, with the tokenizer.

import { closeSync, openSync, readSync } from 'node:fs';
import { cannotRead } from '../../compiler/errors.js';
import { DataError, type ImageSource, type Message, type RawSample } from './sample.js';

/** A dataset opened for random access by sample index (jsonl.ts, webdataset.ts). */
export interface Dataset {
  /** the path it was opened from */
  readonly path: string;
  readonly kind: 'jsonl' | 'webdataset';
  /** the number of samples */
  readonly size: number;
  /** sample i (0 ≤ i < size); a DataError naming the file and line, or shard and member, when bad */
  sample(i: number): RawSample;
}

/** The chat role of each role name the records may use. */
const ROLES: Record<string, Message['role']> = {
  human: 'user',
  user: 'user',
  gpt: 'assistant',
  assistant: 'assistant',
  system: 'system',
};

/** What a JSON value is, for "expected …, got …" messages. */
function kindOf(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  return typeof v === 'object' ? 'an object' : `a ${typeof v}`;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The record's image strings, in order (none for a text-only sample); `where` names the record. */
export function recordImageNames(record: unknown, where: string): string[] {
  if (!isObject(record))
    throw new DataError(where, `expected a JSON object, got ${kindOf(record)}`);
  const { image, images } = record;
  if (image !== undefined && images !== undefined)
    throw new DataError(where, 'has both image and images (one of them, please)');
  if (image !== undefined) {
    if (typeof image !== 'string' || image === '')
      throw new DataError(where, `image: expected a file name, got ${kindOf(image)}`);
    return [image];
  }
  if (images === undefined) return [];
  if (!Array.isArray(images))
    throw new DataError(where, `images: expected an array of file names, got ${kindOf(images)}`);
  return images.map((name: unknown, i) => {
    if (typeof name !== 'string' || name === '')
      throw new DataError(where, `images[${i}]: expected a file name, got ${kindOf(name)}`);
    return name;
  });
}

/** The record with its image strings replaced by `names` (same count), the rest as it was. */
export function withImageNames(record: Record<string, unknown>, names: string[]): object {
  if (record.image !== undefined) return { ...record, image: names[0] };
  if (record.images !== undefined) return { ...record, images: names };
  return record;
}

/** The record's turns, validated, in chat roles. */
function recordMessages(record: Record<string, unknown>, where: string): Message[] {
  const hasConversations = record.conversations !== undefined;
  if (hasConversations && record.messages !== undefined)
    throw new DataError(where, 'has both conversations and messages (one of them, please)');
  const field = hasConversations ? 'conversations' : 'messages';
  const [roleKey, textKey] = hasConversations ? ['from', 'value'] : ['role', 'content'];
  const turns = record[field];
  if (turns === undefined) throw new DataError(where, 'has no conversations (nor messages)');
  if (!Array.isArray(turns))
    throw new DataError(where, `${field}: expected an array, got ${kindOf(turns)}`);
  if (turns.length === 0) throw new DataError(where, `${field} is empty`);
  return turns.map((turn: unknown, i): Message => {
    const at = `${field}[${i}]`;
    if (!isObject(turn))
      throw new DataError(where, `${at}: expected an object, got ${kindOf(turn)}`);
    const name = turn[roleKey];
    const text = turn[textKey];
    if (typeof name !== 'string')
      throw new DataError(where, `${at}.${roleKey}: expected a string, got ${kindOf(name)}`);
    if (typeof text !== 'string')
      throw new DataError(where, `${at}.${textKey}: expected a string, got ${kindOf(text)}`);
    const role = Object.hasOwn(ROLES, name) ? ROLES[name] : undefined;
    if (role === undefined) {
      const accepted = Object.keys(ROLES).join(', ');
      throw new DataError(
        where,
        `${at}.${roleKey}: unknown role '${name}' (accepted: ${accepted})`,
      );
    }
    return { role, content: text };
  });
}

/**
 * A parsed record as a RawSample. `where` names the sample (`file.jsonl:LINE`, `shard.tar:KEY`),
 * `recordWhere` the place errors in the record point to (the same line; the `.json` member);
 * `image(name)` makes the ImageSource of one image string (it may throw a DataError).
 */
export function recordToSample(
  record: unknown,
  where: string,
  recordWhere: string,
  image: (name: string) => ImageSource,
): RawSample {
  const names = recordImageNames(record, recordWhere);
  const messages = recordMessages(record as Record<string, unknown>, recordWhere);
  return { where, messages, images: names.map(image) };
}

// What both readers do with their files.

/** Bytes [start, start + length) of a file, or a DataError when the file is shorter now. */
export function readRange(path: string, start: number, length: number, where: string): Buffer {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch (e) {
    throw new DataError(where, cannotRead(path, e));
  }
  try {
    return readAt(fd, path, start, length, where);
  } finally {
    closeSync(fd);
  }
}

function readAt(fd: number, path: string, start: number, length: number, where: string): Buffer {
  const bytes = Buffer.allocUnsafe(length);
  let done = 0;
  while (done < length) {
    const n = readSync(fd, bytes, done, length - done, start + done);
    if (n === 0) throw new DataError(where, `${path} is shorter than when it was opened`);
    done += n;
  }
  return bytes;
}

/** A file kept open: its byte ranges read without an open and a close each (about 10 µs). */
export interface OpenFile {
  readonly fd: number;
  /** bytes [start, start + length), or a DataError when the file is shorter now */
  read(start: number, length: number, where: string): Buffer;
}

// the descriptor is closed when its OpenFile is collected
const descriptors = new FinalizationRegistry<number>((fd) => {
  try {
    closeSync(fd);
  } catch {
    // closed already
  }
});

/** The file, opened once for reading (it throws what openSync throws). */
export function openFile(path: string): OpenFile {
  const fd = openSync(path, 'r');
  const file: OpenFile = {
    fd,
    read: (start, length, where) => readAt(fd, path, start, length, where),
  };
  descriptors.register(file, fd);
  return file;
}

/** A one-line reason a file cannot be read. */
export function readFailure(e: unknown): string {
  const code = (e as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return 'no such file';
  if (code === 'EISDIR') return 'is a directory';
  if (code === 'EACCES') return 'permission denied';
  return `cannot be read (${code ?? (e as Error).message})`;
}

/** The parser's message, on one line. */
export function jsonProblem(e: unknown): string {
  return `not JSON: ${(e as Error).message.split('\n')[0].replace(/\r/g, '')}`;
}
