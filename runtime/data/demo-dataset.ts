// The demo's dataset: the synthetic task of ../shared/reference/tiny-vlm.md as files on disk, so
// that `lfc demo` trains through the data path a user's data takes. Each sample is a PNG (a
// background of one colour with a square of another in one quadrant, and a little noise) and a
// conversation in the LLaVA format: the user asks for a description, the assistant answers
// "<square> square on <background> background <top|bottom> <left|right>", which only the image
// tells. The control is the same JSONL with the image paths moved by a seeded derangement: a
// caption no longer belongs to its image.
//
//   DIR/images/NNNNNN.png   (8a) × (8b) pixels, a, b ∈ 1..4 (the tiny models' 1 to 16 tokens)
//   DIR/train.jsonl         one sample a line, images relative to the file
//   DIR/control.jsonl       the same samples, images shuffled across them
//   DIR/dataset.json        what made it (kind, version, samples, seed): a match is reused

import { existsSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { crc32, deflateSync } from 'node:zlib';
import { makeDirs } from '../../compiler/files.js';
import { generator, permutation } from './sampler.js';

/** The RGB-cube corners: colour c has channel k at level c's bit (2 − k). */
export const COLOUR_NAMES = [
  'black',
  'blue',
  'green',
  'cyan',
  'red',
  'magenta',
  'yellow',
  'white',
] as const;
const LEVELS = [0.15, 0.85];
const NOISE_STD = 0.03;
const VERSION = 2;

export interface DemoDataset {
  readonly dir: string;
  readonly train: string;
  readonly control: string;
  readonly samples: number;
  /** false: an earlier one with the same parameters was reused */
  readonly made: boolean;
}

/**
 * An 8-bit RGB PNG (signature, IHDR, one IDAT, IEND; every row filter 0): a few microseconds for
 * the demo's small images, where a call into sharp costs about 0.8 ms.
 */
export function encodePng(rgb: Uint8Array, width: number, height: number): Buffer {
  const chunk = (type: string, data: Buffer) => {
    const head = Buffer.alloc(8);
    head.writeUInt32BE(data.length, 0);
    head.write(type, 4, 'latin1');
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])) >>> 0, 0);
    return Buffer.concat([head, data, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr.set([8, 2, 0, 0, 0], 8); // depth 8, colour type 2 (RGB), deflate, filter 0, no interlace
  const rows = Buffer.alloc(height * (1 + 3 * width));
  for (let y = 0; y < height; y++)
    rows.set(rgb.subarray(y * 3 * width, (y + 1) * 3 * width), y * (1 + 3 * width) + 1);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', deflateSync(rows)),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}

interface DemoSample {
  readonly height: number;
  readonly width: number;
  readonly background: number;
  readonly square: number;
  readonly quadrant: number;
}

function drawSample(i: number, seed: number): { s: DemoSample; rgb: Buffer } {
  const rand = generator(seed, i);
  const below = (n: number) => Math.floor(rand() * n);
  const height = 8 * (1 + below(4));
  const width = 8 * (1 + below(4));
  const background = below(8);
  const square = (background + 1 + below(7)) % 8;
  const quadrant = below(4);
  const side = Math.min(height, width) / 2;
  const top = (quadrant >> 1) * (height / 2) + (height / 2 - side) / 2;
  const left = (quadrant & 1) * (width / 2) + (width / 2 - side) / 2;
  const rgb = Buffer.alloc(height * width * 3);
  for (let y = 0; y < height; y++)
    for (let x = 0; x < width; x++) {
      const c = y >= top && y < top + side && x >= left && x < left + side ? square : background;
      for (let k = 0; k < 3; k++) {
        // Box–Muller noise
        const g = Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
        const v = LEVELS[(c >> (2 - k)) & 1] + NOISE_STD * g;
        rgb[(y * width + x) * 3 + k] = Math.round(255 * Math.min(1, Math.max(0, v)));
      }
    }
  return { s: { height, width, background, square, quadrant }, rgb };
}

export function captionOf(s: Pick<DemoSample, 'background' | 'square' | 'quadrant'>): string {
  const [vertical, horizontal] = [
    s.quadrant >> 1 ? 'bottom' : 'top',
    s.quadrant & 1 ? 'right' : 'left',
  ];
  return `${COLOUR_NAMES[s.square]} square on ${COLOUR_NAMES[s.background]} background ${vertical} ${horizontal}`;
}

function line(image: string, caption: string): string {
  return JSON.stringify({
    image,
    conversations: [
      { from: 'human', value: '<image>\ndescribe the image' },
      { from: 'gpt', value: caption },
    ],
  });
}

/**
 * The demo's dataset in `dir`, made unless one of the same parameters is there. Written into a
 * sibling directory first and renamed, so an interrupted run leaves no half dataset.
 */
export async function demoDataset(dir: string, samples: number, seed = 0): Promise<DemoDataset> {
  const meta = { kind: 'lfc-demo-dataset', version: VERSION, samples, seed };
  const result = (made: boolean): DemoDataset => ({
    dir,
    train: join(dir, 'train.jsonl'),
    control: join(dir, 'control.jsonl'),
    samples,
    made,
  });
  const metaPath = join(dir, 'dataset.json');
  if (existsSync(metaPath)) {
    try {
      if (JSON.stringify(JSON.parse(readFileSync(metaPath, 'utf8'))) === JSON.stringify(meta))
        return result(false);
    } catch {
      // unreadable: made again
    }
  }
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  makeDirs(join(tmp, 'images'));
  const names: string[] = [];
  const captions: string[] = [];
  for (let i = 0; i < samples; i++) {
    const { s, rgb } = drawSample(i, seed);
    const name = `images/${String(i).padStart(6, '0')}.png`;
    writeFileSync(join(tmp, name), encodePng(rgb, s.width, s.height));
    names.push(name);
    captions.push(captionOf(s));
  }
  // the control: image i goes to sample σ(i), σ a derangement (a random cycle order)
  const order = permutation(samples, seed, 0x5eed);
  const moved = new Array<string>(samples);
  for (let k = 0; k < samples; k++) moved[order[(k + 1) % samples]] = names[order[k]];
  writeFileSync(
    join(tmp, 'train.jsonl'),
    names.map((n, i) => line(n, captions[i])).join('\n') + '\n',
  );
  writeFileSync(
    join(tmp, 'control.jsonl'),
    moved.map((n, i) => line(n, captions[i])).join('\n') + '\n',
  );
  writeFileSync(join(tmp, 'dataset.json'), JSON.stringify(meta, null, 1) + '\n');
  rmSync(dir, { recursive: true, force: true });
  makeDirs(join(dir, '..'));
  renameSync(tmp, dir);
  return result(true);
}
