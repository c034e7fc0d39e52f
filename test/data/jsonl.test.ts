// The JSONL reader (runtime/data/jsonl.ts) and the record conversion (records.ts): samples read
// by index in any order, lines named by their physical number with blank lines skipped, image
// paths beside the file, and each bad input refused with one line naming the file and line.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { UserError } from '../../compiler/errors.js';
import { openDataset } from '../../runtime/data/datasets.js';
import { openJsonl } from '../../runtime/data/jsonl.js';
import { DataError, type RawSample } from '../../runtime/data/sample.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-jsonl-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function file(name: string, content: string | Buffer): string {
  const path = join(dir, name);
  mkdirSync(join(path, '..'), { recursive: true });
  writeFileSync(path, content);
  return path;
}

/** Distinct bytes standing for an encoded image (the reader never decodes them). */
const imageBytes = (n: number): Buffer =>
  Buffer.from(Array.from({ length: 40 + n }, (_, i) => (i * 7 + n) % 256));

/** The error `f` throws, checked to be one line. */
function errorOf(f: () => unknown): Error {
  try {
    f();
  } catch (e) {
    expect((e as Error).message).not.toContain('\n');
    return e as Error;
  }
  throw new Error('expected an error');
}

const plain = (s: RawSample) => ({
  where: s.where,
  messages: s.messages,
  images: s.images.map((i) => i.where),
});

describe('a JSONL dataset', () => {
  const absolute = file('elsewhere/abs.png', imageBytes(3));
  file('ds/img/a.png', imageBytes(1));
  file('ds/img/b.jpg', imageBytes(2));
  const lines = [
    // line 1, after a byte order mark: LLaVA, one image
    JSON.stringify({
      id: 'x',
      image: 'img/a.png',
      conversations: [
        { from: 'human', value: '<image>\nWhat is it?' },
        { from: 'gpt', value: 'A square.' },
      ],
    }),
    '', // line 2
    '   \t', // line 3
    // line 4: two images in the order given, an absolute path; CRLF ending
    JSON.stringify({
      images: ['img/b.jpg', absolute],
      conversations: [
        { from: 'system', value: 'Be brief.' },
        { from: 'human', value: '<image><image> Same?' },
        { from: 'gpt', value: 'No.' },
      ],
    }) + '\r',
    // line 5: messages, text only
    JSON.stringify({
      messages: [
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello' },
      ],
    }),
    '', // line 6
  ];
  const path = file(
    'ds/train.jsonl',
    Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(lines.join('\n') + '\n')]),
  );
  const ds = openJsonl(path);

  const expected = [
    {
      where: `${path}:1`,
      messages: [
        { role: 'user', content: '<image>\nWhat is it?' },
        { role: 'assistant', content: 'A square.' },
      ],
      images: [`${path}:1: image ${join(dir, 'ds/img/a.png')}`],
    },
    {
      where: `${path}:4`,
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: '<image><image> Same?' },
        { role: 'assistant', content: 'No.' },
      ],
      images: [`${path}:4: image ${join(dir, 'ds/img/b.jpg')}`, `${path}:4: image ${absolute}`],
    },
    {
      where: `${path}:5`,
      messages: [
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello' },
      ],
      images: [],
    },
  ];

  it('counts the non-blank lines and names samples by physical line', () => {
    expect([ds.kind, ds.size]).toEqual(['jsonl', 3]);
  });

  it('reads samples by index in any order, the same each time', () => {
    for (const i of [2, 0, 1, 1, 2, 0]) expect(plain(ds.sample(i))).toEqual(expected[i]);
  });

  it('resolves image paths beside the file (absolute ones as written) and reads their bytes', () => {
    expect(ds.sample(0).images[0].read()).toEqual(imageBytes(1));
    expect(ds.sample(1).images.map((i) => i.read())).toEqual([imageBytes(2), imageBytes(3)]);
  });

  it('is what openDataset opens for a .jsonl path', async () => {
    const same = await openDataset(path);
    expect([same.kind, same.size, plain(same.sample(1))]).toEqual(['jsonl', 3, expected[1]]);
  });

  it('finds lines and blank lines that straddle its read chunks (8 MiB)', () => {
    const chunkBytes = 8 << 20;
    const record = (n: number) =>
      JSON.stringify({ conversations: [{ from: 'human', value: `n${n}` }] });
    // records up to a little before the chunk's end, then `tail` from there to past it
    const across = (name: string, tail: (spaces: string) => string[]) => {
      const parts: string[] = [];
      let bytes = 0;
      for (let n = 0; bytes < chunkBytes - 3000; n++) {
        parts.push(record(n) + ' '.repeat(n % 300));
        bytes += Buffer.byteLength(parts.at(-1)!) + 1;
      }
      const count = parts.length;
      parts.push(...tail(' '.repeat(chunkBytes - bytes + 100)));
      return { count, ds: openJsonl(file(name, parts.join('\n'))) }; // no final newline
    };
    // a blank line across the chunk end, then a record
    const a = across('blank-across.jsonl', (spaces) => [spaces, record(-1)]);
    expect(a.ds.size).toBe(a.count + 1);
    expect(a.ds.sample(a.count).where).toBe(`${join(dir, 'blank-across.jsonl')}:${a.count + 2}`);
    expect(a.ds.sample(a.count).messages[0].content).toBe('n-1');
    // a record whose first non-space byte is in the next chunk
    const b = across('record-across.jsonl', (spaces) => [spaces + record(-1)]);
    expect(b.ds.size).toBe(b.count + 1);
    expect(b.ds.sample(b.count).where).toBe(`${join(dir, 'record-across.jsonl')}:${b.count + 1}`);
    expect(b.ds.sample(b.count).messages[0].content).toBe('n-1');
    expect(b.ds.sample(b.count - 1).messages[0].content).toBe(`n${b.count - 1}`);
    expect(b.ds.sample(1234).where).toMatch(/:1235$/);
    // a record whose line goes on into the next chunk with spaces only
    const c = across('spaces-across.jsonl', (spaces) => [record(-1) + spaces, '']);
    expect(c.ds.size).toBe(c.count + 1);
    expect(c.ds.sample(c.count).messages[0].content).toBe('n-1');
  });
});

describe('a JSONL dataset refuses, in one line naming the file and line,', () => {
  const turns = [{ from: 'human', value: 'Hi' }];
  const lines = [
    JSON.stringify({ conversations: turns }),
    '{"conversations": [{"from": "human", "value": "Hi"}',
    JSON.stringify({ conversations: [{ from: 'bot', value: 'Hi' }] }),
    JSON.stringify({ image: 5, conversations: turns }),
    JSON.stringify({ images: ['a.png', 3], conversations: turns }),
    JSON.stringify({ conversations: 'Hi' }),
    JSON.stringify({ conversations: [] }),
    JSON.stringify({ conversations: [{ from: 'human', value: 7 }] }),
    JSON.stringify({ image: 'nothing-here.png', conversations: turns }),
    JSON.stringify([turns]),
    JSON.stringify({ image: 'a.png', images: ['a.png'], conversations: turns }),
    JSON.stringify({ messages: [{ from: 'human', value: 'Hi' }] }),
  ];
  const path = file('bad/bad.jsonl', lines.join('\n'));
  const ds = openJsonl(path);
  const refusal = (i: number): string => {
    const e = errorOf(() => ds.sample(i));
    expect(e).toBeInstanceOf(DataError);
    expect((e as DataError).where).toBe(`${path}:${i + 1}`);
    return e.message;
  };

  it('a line that is not JSON', () => {
    expect(refusal(1)).toMatch(new RegExp(`^${path}:2: not JSON: .+`));
  });

  it('an unknown role, naming it', () => {
    expect(refusal(2)).toBe(
      `${path}:3: conversations[0].from: unknown role 'bot' (accepted: human, user, gpt, assistant, system)`,
    );
  });

  it('image fields of the wrong type', () => {
    expect(refusal(3)).toBe(`${path}:4: image: expected a file name, got a number`);
    expect(refusal(4)).toBe(`${path}:5: images[1]: expected a file name, got a number`);
    expect(refusal(10)).toBe(`${path}:11: has both image and images (one of them, please)`);
  });

  it('conversations that are not a non-empty array of turns with string fields', () => {
    expect(refusal(5)).toBe(`${path}:6: conversations: expected an array, got a string`);
    expect(refusal(6)).toBe(`${path}:7: conversations is empty`);
    expect(refusal(7)).toBe(`${path}:8: conversations[0].value: expected a string, got a number`);
    expect(refusal(9)).toBe(`${path}:10: expected a JSON object, got an array`);
    expect(refusal(11)).toBe(`${path}:12: messages[0].role: expected a string, got nothing`);
  });

  it('a missing image file, when it is read', () => {
    const image = ds.sample(8).images[0];
    const e = errorOf(() => image.read());
    expect(e).toBeInstanceOf(DataError);
    expect(e.message).toBe(`${path}:9: image ${join(dir, 'bad/nothing-here.png')}: no such file`);
    expect(ds.sample(0).messages).toEqual([{ role: 'user', content: 'Hi' }]);
  });

  it('and a missing, empty or unsupported file is a plain UserError naming it', async () => {
    const missing = join(dir, 'none.jsonl');
    const e = errorOf(() => openJsonl(missing));
    expect([e instanceof UserError, e instanceof DataError, e.message]).toEqual([
      true,
      false,
      `cannot read ${missing}: ENOENT`,
    ]);
    const empty = file('empty.jsonl', '\n  \n');
    expect(() => openJsonl(empty)).toThrow(`${empty}: no records (the file has no non-blank line)`);
    const csv = file('data.csv', 'a,b\n');
    await expect(openDataset(csv)).rejects.toThrow(
      `${csv}: not a dataset (expected a .jsonl file, a .tar shard, or a folder of .tar shards)`,
    );
  });
});
