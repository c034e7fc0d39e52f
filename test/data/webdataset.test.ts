// The WebDataset reader and writer (runtime/data/webdataset.ts): a JSONL dataset converted to
// shards reads back sample by sample as the JSONL does (messages and image bytes); members are
// found by their data offsets behind pax and GNU long-name headers; image strings name members
// in the three ways; bad samples are DataErrors naming shard and member, a non-tar a UserError.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tar from 'tar-stream';
import { afterAll, describe, expect, it } from 'vitest';
import { UserError } from '../../compiler/errors.js';
import { openDataset } from '../../runtime/data/datasets.js';
import { openJsonl } from '../../runtime/data/jsonl.js';
import { DataError } from '../../runtime/data/sample.js';
import {
  jsonlToWebDataset,
  openWebDataset,
  writeWebDataset,
} from '../../runtime/data/webdataset.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-webdataset-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function file(name: string, content: string | Buffer): string {
  const path = join(dir, name);
  mkdirSync(join(path, '..'), { recursive: true });
  writeFileSync(path, content);
  return path;
}

/** Distinct bytes standing for an encoded image; sizes not multiples of the 512-byte block. */
const imageBytes = (n: number): Buffer =>
  Buffer.from(Array.from({ length: 300 + 211 * n }, (_, i) => (i * 13 + n * 7) % 256));

/** A tar of these members, in order, written by tar-stream's pack (pax headers when needed). */
async function packTar(name: string, members: [string, Buffer | string][]): Promise<string> {
  const pack = tar.pack();
  for (const [member, data] of members) pack.entry({ name: member }, data);
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const chunk of pack) chunks.push(chunk as Buffer);
  return file(name, Buffer.concat(chunks));
}

/** A GNU-format header block: `typeflag` '0' a file, 'L' the long name of the next member. */
function gnuHeader(name: string, sizeBytes: number, typeflag: string): Buffer {
  const block = Buffer.alloc(512);
  block.write(name.slice(0, 100), 0, 'latin1');
  block.write('0000644\0', 100);
  block.write('0000000\0', 108);
  block.write('0000000\0', 116);
  block.write(sizeBytes.toString(8).padStart(11, '0') + '\0', 124);
  block.write('00000000000\0', 136);
  block.write(' '.repeat(8), 148);
  block.write(typeflag, 156);
  block.write('ustar  \0', 257); // GNU magic and version
  const sum = block.reduce((a, b) => a + b, 0);
  block.write(sum.toString(8).padStart(6, '0') + '\0 ', 148);
  return block;
}

/** Data padded to whole blocks. */
const blocks = (data: Buffer): Buffer =>
  Buffer.concat([data, Buffer.alloc((512 - (data.length % 512)) % 512)]);

/** A GNU tar whose member names go in ././@LongLink records, as GNU tar writes names over 100. */
function gnuTar(name: string, members: [string, Buffer][]): string {
  const parts: Buffer[] = [];
  for (const [member, data] of members) {
    const longName = Buffer.from(member + '\0');
    parts.push(gnuHeader('././@LongLink', longName.length, 'L'), blocks(longName));
    parts.push(gnuHeader(member, data.length, '0'), blocks(data));
  }
  return file(name, Buffer.concat([...parts, Buffer.alloc(1024)]));
}

/** The error `f` throws (or the promise rejects with), checked to be one line. */
async function errorOf(f: () => unknown): Promise<Error> {
  try {
    await f();
  } catch (e) {
    expect((e as Error).message).not.toContain('\n');
    return e as Error;
  }
  throw new Error('expected an error');
}

const turns = (text: string) => [
  { from: 'human', value: text },
  { from: 'gpt', value: 'ok' },
];

describe('a JSONL dataset converted to WebDataset shards', () => {
  const lines: object[] = [];
  for (let i = 0; i < 7; i++) {
    if (i % 3 === 0)
      lines.push({ id: i, image: `img/${i}.png`, conversations: turns(`<image> ${i}`) });
    else if (i % 3 === 1)
      lines.push({
        images: [`img/${i}.jpg`, `img/${i}b.PNG`],
        conversations: turns(`<image><image> ${i}`),
      });
    else lines.push({ messages: [{ role: 'user', content: `text ${i}` }] });
    file(`src/img/${i}.png`, imageBytes(i));
    file(`src/img/${i}.jpg`, imageBytes(i + 10));
    file(`src/img/${i}b.PNG`, imageBytes(i + 20));
  }
  const jsonlPath = file('src/data.jsonl', lines.map((l) => JSON.stringify(l)).join('\n\n'));
  const out = join(dir, 'shards');

  it('reads back sample by sample as the JSONL: messages, image count and bytes, order', async () => {
    const shards = await jsonlToWebDataset(jsonlPath, out, 3);
    expect(shards).toEqual(['000000', '000001', '000002'].map((n) => join(out, `shard-${n}.tar`)));
    const jsonl = openJsonl(jsonlPath);
    const wds = await openWebDataset(out);
    expect([wds.kind, wds.size, wds.shards]).toEqual(['webdataset', 7, shards]);
    for (const i of [6, 0, 3, 1, 5, 2, 4]) {
      const a = jsonl.sample(i);
      const b = wds.sample(i);
      expect(b.messages).toEqual(a.messages);
      expect(b.images.map((img) => img.read())).toEqual(a.images.map((img) => img.read()));
    }
    const s = wds.sample(4);
    expect([s.where, s.images.map((img) => img.where)]).toEqual([
      `${shards[1]}:000000004`,
      [`${shards[1]}:000000004.0.jpg`, `${shards[1]}:000000004.1.png`],
    ]);
  });

  it('keeps the record, image strings rewritten to member suffixes', async () => {
    const wds = await openWebDataset(join(out, 'shard-000000.tar'));
    expect(wds.size).toBe(3);
    const chunks: Buffer[] = [];
    const extract = tar.extract();
    const names: string[] = [];
    const done = (async () => {
      for await (const entry of extract) {
        names.push(entry.header.name);
        for await (const c of entry)
          if (entry.header.name === '000000001.json') chunks.push(c as Buffer);
      }
    })();
    extract.end(readFileSync(join(out, 'shard-000000.tar')));
    await done;
    expect(names).toEqual([
      '000000000.json',
      '000000000.0.png',
      '000000001.json',
      '000000001.0.jpg',
      '000000001.1.png',
      '000000002.json',
    ]);
    expect(JSON.parse(Buffer.concat(chunks).toString())).toEqual({
      ...lines[1],
      images: ['0.jpg', '1.png'],
    });
  });

  it('stops at a sample whose image cannot be read, with its DataError', async () => {
    const broken = file(
      'src/broken.jsonl',
      lines.map((l) => JSON.stringify(l)).join('\n') +
        '\n' +
        JSON.stringify({ image: 'img/gone.png', conversations: turns('<image>') }),
    );
    const e = await errorOf(() => jsonlToWebDataset(broken, join(dir, 'broken'), 3));
    expect(e).toBeInstanceOf(DataError);
    expect(e.message).toBe(`${broken}:8: image ${join(dir, 'src/img/gone.png')}: no such file`);
  });

  it('is what openDataset opens for a shard or a folder of them', async () => {
    expect((await openDataset(out)).size).toBe(7);
    expect((await openDataset(join(out, 'shard-000002.tar'))).size).toBe(1);
  });
});

describe('a WebDataset shard', () => {
  const json = (image: unknown) => JSON.stringify({ image, conversations: turns('<image>') });

  it('finds members behind pax headers (names over 100 bytes) and ustar prefixes', async () => {
    const long = 'k'.repeat(150); // no '/': tar-stream writes a pax header
    const deep = `${'d'.repeat(60)}/${'e'.repeat(60)}/s1`; // split into the ustar prefix
    const shard = await packTar('pax.tar', [
      [`${long}.json`, json(`${long}.0.png`)],
      [`${long}.0.png`, imageBytes(1)],
      [`${deep}.json`, json('s1.jpg')],
      [`${deep}.jpg`, imageBytes(2)],
    ]);
    expect(readFileSync(shard).includes(`path=${long}.json`)).toBe(true);
    const wds = await openWebDataset(shard);
    expect(wds.size).toBe(2);
    expect([wds.sample(0).where, wds.sample(0).images[0].read()]).toEqual([
      `${shard}:${long}`,
      imageBytes(1),
    ]);
    expect([wds.sample(1).where, wds.sample(1).images[0].read()]).toEqual([
      `${shard}:${deep}`,
      imageBytes(2),
    ]);
  });

  it('finds members behind GNU ././@LongLink names', async () => {
    const key = `dir/${'g'.repeat(120)}`;
    const shard = gnuTar('gnu.tar', [
      [`${key}.json`, Buffer.from(json('png'))],
      [`${key}.png`, imageBytes(3)],
      ['dir/short.json', Buffer.from(json(`dir/short.webp`))],
      ['dir/short.webp', imageBytes(4)],
    ]);
    const wds = await openWebDataset(shard);
    expect(wds.size).toBe(2);
    expect(wds.sample(0).images.map((img) => [img.where, img.read()])).toEqual([
      [`${shard}:${key}.png`, imageBytes(3)],
    ]);
    expect(wds.sample(1).images[0].read()).toEqual(imageBytes(4));
  });

  it('takes an image string as the member name, its basename or its suffix', async () => {
    const record = JSON.stringify({
      images: ['a/s7.0.png', 's7.1.png', 'jpg'],
      conversations: turns('<image><image><image>'),
    });
    const shard = await packTar('names.tar', [
      ['a/s7.json', record],
      ['a/s7.0.png', imageBytes(5)],
      ['a/s7.1.png', imageBytes(6)],
      ['a/s7.jpg', imageBytes(7)],
    ]);
    const wds = await openWebDataset(shard);
    expect(wds.sample(0).images.map((img) => img.read())).toEqual([5, 6, 7].map(imageBytes));
  });

  it('refuses bad samples with DataErrors naming the shard and member', async () => {
    const shard = await packTar('bad.tar', [
      ['s0.json', json('png')],
      ['s0.png', imageBytes(0)],
      ['s1.jpg', imageBytes(1)], // no .json
      ['s2.json', json('s2.jpg')],
      ['s2.png', imageBytes(2)], // the image named is not there
      ['s3.json', '{"image": '],
      ['s4.json', JSON.stringify({ conversations: [{ from: 'robot', value: 'x' }] })],
    ]);
    const wds = await openWebDataset(shard);
    expect(wds.size).toBe(5);
    expect(wds.sample(0).images[0].read()).toEqual(imageBytes(0));
    const refusal = async (i: number): Promise<string> => {
      const e = await errorOf(() => wds.sample(i));
      expect(e).toBeInstanceOf(DataError);
      return e.message;
    };
    expect(await refusal(1)).toBe(`${shard}:s1: no .json member (the sample has s1.jpg)`);
    expect(await refusal(2)).toBe(
      `${shard}:s2.json: image 's2.jpg' is no member of the sample (it has s2.json, s2.png)`,
    );
    expect(await refusal(3)).toMatch(new RegExp(`^${shard}:s3.json: not JSON: .+`));
    expect(await refusal(4)).toMatch(
      new RegExp(`^${shard}:s4.json: conversations\\[0\\].from: unknown role 'robot'`),
    );
  });

  it('that is not a tar file is a UserError naming it', async () => {
    for (const [name, content] of [
      ['text.tar', 'just some text, not a tar archive\n'.repeat(40)],
      ['short.tar', 'tiny'],
    ]) {
      const path = file(name, content);
      const e = await errorOf(() => openWebDataset(path));
      expect([e instanceof UserError, e instanceof DataError]).toEqual([true, false]);
      expect(e.message).toMatch(new RegExp(`^${path}: not a tar file \\(.+\\)$`));
    }
    const missing = join(dir, 'missing.tar');
    expect((await errorOf(() => openWebDataset(missing))).message).toBe(
      `cannot read ${missing}: ENOENT`,
    );
    const empty = join(dir, 'no-shards');
    mkdirSync(empty);
    expect((await errorOf(() => openWebDataset(empty))).message).toBe(
      `${empty}: no .tar shards in this folder`,
    );
  });
});

describe('a folder of shards', () => {
  const sample = (key: string) => ({ key, json: { conversations: turns(key) }, files: [] });

  it('is read in the order of the shard names', async () => {
    const folder = join(dir, 'ordered');
    await writeWebDataset(folder, ['a', 'b', 'c', 'd', 'e'].map(sample), 2);
    const wds = await openWebDataset(folder);
    expect(Array.from({ length: wds.size }, (_, i) => wds.sample(i).messages[0].content)).toEqual([
      'a',
      'b',
      'c',
      'd',
      'e',
    ]);
  });

  it('of an Energon dataset is the list in .nv-meta/.info.yaml, counts checked', async () => {
    const folder = join(dir, 'energon');
    await writeWebDataset(join(folder, 'parts'), ['a', 'b', 'c'].map(sample), 2);
    file('energon/shard-999999.tar', 'not listed, not read');
    const info = file(
      'energon/.nv-meta/.info.yaml',
      'shard_counts:\n  parts/shard-000001.tar: 1\n  parts/shard-000000.tar: 2\n',
    );
    const wds = await openDataset(folder);
    expect(Array.from({ length: wds.size }, (_, i) => wds.sample(i).messages[0].content)).toEqual([
      'c',
      'a',
      'b',
    ]);
    writeFileSync(info, 'shard_counts:\n  parts/shard-000000.tar: 3\n');
    expect((await errorOf(() => openWebDataset(folder))).message).toBe(
      `${join(folder, 'parts/shard-000000.tar')}: 2 samples, but ${info} says 3`,
    );
  });
});
