// lfc run --load-hf on the native runtime: a checkpoint trained here, exported with lfc export-hf
// and loaded back starts the next run from exactly its weights (the step dump's weights, whole
// tensors under any layout, are the checkpoint's bit for bit at fp32: on one rank and on tp 2 ×
// ep 2); the encoder and the decoder load from different directories, the rest keeps its init;
// a bf16 plan loads a bf16 export exactly. The tiny-vlm-moe model: its names are the Qwen2.5-VL
// family's (the tiny Qwen presets do not run on the runtime yet; roundtrip.test.ts reads their
// pieces without it).
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { roundToBf16 } from '../../runtime/bf16.js';
import { iterDir } from '../../runtime/checkpoint.js';
import { partOf } from '../../runtime/hf/names.js';
import { readSafetensors, type Tensor } from '../../runtime/safetensors.js';
import { cli } from '../helpers.js';

const MODEL = 'tiny-vlm-moe';
const dir = mkdtempSync(join(tmpdir(), 'lfc-hf-train-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const at = (...p: string[]) => join(dir, ...p);

function plan(
  name: string,
  flags: { ranks?: number; tp?: number; ep?: number; bf16?: boolean } = {},
) {
  const { plan, programs } = compile({
    model: MODEL,
    globalBatchSize: 4,
    nprocPerNode: flags.ranks,
    parallel: { tp: flags.tp, ep: flags.ep },
    precision: flags.bf16 ? { bf16: true } : undefined,
  });
  writePlan(at(name), plan, programs);
  return at(name);
}

const weightsOf = (file: string) => readSafetensors(file).tensors;
const bits = (t: Tensor) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);

/** the first step's weights of a run: what it started from */
async function startOf(planDir: string, ...flags: string[]): Promise<Map<string, Tensor>> {
  const dump = `${planDir}-dump-${flags.join('-').replace(/[^a-z0-9-]/gi, '')}`;
  const r = await cli(
    'run',
    planDir,
    '--train-iters',
    '1',
    '--quiet',
    '--dump-step',
    dump,
    ...flags,
  );
  expect(r.err).toBe('');
  expect(r.code).toBe(0);
  return weightsOf(join(dump, 'weights.safetensors'));
}

let step1: Map<string, Tensor>;
let step2: Map<string, Tensor>;

beforeAll(async () => {
  const one = plan('one');
  const r = await cli(
    'run',
    one,
    '--train-iters',
    '2',
    '--save',
    at('ckpt'),
    '--save-interval',
    '1',
    '--quiet',
  );
  expect(r.code).toBe(0);
  step1 = weightsOf(join(iterDir(at('ckpt'), 1), 'model.safetensors'));
  step2 = weightsOf(join(iterDir(at('ckpt'), 2), 'model.safetensors'));
  for (const [out, load, dtype] of [
    ['hf2', iterDir(at('ckpt'), 2), 'fp32'],
    ['hf1', iterDir(at('ckpt'), 1), 'fp32'],
    ['hf2-bf16', iterDir(at('ckpt'), 2), 'bf16'],
  ]) {
    const e = await cli(
      'export-hf',
      at(out),
      '--load',
      load,
      '--plan',
      one,
      '--dtype',
      dtype,
      '--max-shard-size',
      '500KB',
    );
    expect(e.code).toBe(0);
  }
}, 120_000);

describe('export-hf → run --load-hf', () => {
  it('one rank starts from the checkpoint, bit for bit', async () => {
    const start = await startOf(at('one'), '--load-hf', at('hf2'));
    expect([...start.keys()].sort()).toEqual([...step2.keys()].sort());
    for (const [name, t] of step2) expect(bits(start.get(name)!).equals(bits(t)), name).toBe(true);
  });

  it('tp 2 × ep 2 (4 ranks, each reading its pieces) starts from it too', async () => {
    const start = await startOf(plan('tp2ep2', { ranks: 4, tp: 2, ep: 2 }), '--load-hf', at('hf2'));
    for (const [name, t] of step2) expect(bits(start.get(name)!).equals(bits(t)), name).toBe(true);
  });

  it('the encoder from one directory, the decoder from another', async () => {
    const start = await startOf(
      at('one'),
      '--load-hf-encoder',
      at('hf2'),
      '--load-hf-decoder',
      at('hf1'),
    );
    for (const [name, t] of start) {
      const want = partOf(name) === 'decoder' ? step1 : step2; // the merger comes with the encoder
      expect(bits(t).equals(bits(want.get(name)!)), name).toBe(true);
    }
  });

  it('the encoder alone, from a directory without the merger: the rest keeps its init', async () => {
    const noMerger = at('hf2-vit');
    cpSync(at('hf2'), noMerger, { recursive: true });
    const index = join(noMerger, 'model.safetensors.index.json');
    const json = JSON.parse(readFileSync(index, 'utf8'));
    for (const k of Object.keys(json.weight_map))
      if (k.startsWith('visual.merger.')) delete json.weight_map[k];
    writeFileSync(index, JSON.stringify(json));
    const init = await startOf(at('one'));
    const start = await startOf(at('one'), '--load-hf-encoder', noMerger);
    for (const [name, t] of start) {
      const want = partOf(name) === 'encoder' ? step2 : init;
      expect(bits(t).equals(bits(want.get(name)!)), name).toBe(true);
    }
  });

  it('a bf16 plan loads a bf16 export exactly (its fp32 masters the bf16 values)', async () => {
    const start = await startOf(plan('bf16', { bf16: true }), '--load-hf', at('hf2-bf16'));
    for (const [name, t] of step2) {
      const want = Float32Array.from(
        t.data as Float32Array,
        (x) => new Float32Array(new Uint32Array([roundToBf16(x) << 16]).buffer)[0],
      );
      expect(bits(start.get(name)!).equals(Buffer.from(want.buffer)), name).toBe(true);
    }
  });
});
