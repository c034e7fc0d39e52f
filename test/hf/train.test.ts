// lfc run --load-hf on the native runtime: a checkpoint trained here, exported with lfc export-hf
// and loaded back starts the next run from exactly its weights (the step dump's weights, whole
// tensors under any layout, are the checkpoint's bit for bit at fp32: on one rank and on several);
// the encoder and the decoder load from different directories, the rest keeps its init; a bf16
// plan loads a bf16 export exactly. The tiny Qwen presets (both families, the fused experts, tied
// embeddings over pipeline stages) and tiny-vlm-moe (lfc's own names, the Qwen2.5-VL family's).
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

const dir = mkdtempSync(join(tmpdir(), 'lfc-hf-train-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Flags {
  readonly ranks?: number;
  readonly tp?: number;
  readonly pp?: number;
  readonly ep?: number;
  readonly bf16?: boolean;
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

const expectSame = (got: Map<string, Tensor>, want: (name: string) => Tensor) => {
  for (const [name, t] of got) expect(bits(t).equals(bits(want(name))), name).toBe(true);
};

const CASES: readonly {
  model: string;
  layout?: Flags;
  name?: string;
  parts?: boolean;
  bf16?: boolean;
}[] = [
  {
    model: 'qwen3-vl-moe-tiny',
    layout: { ranks: 4, tp: 2, ep: 2 },
    name: 'tp 2 × ep 2',
    parts: true,
  },
  {
    model: 'qwen2.5-vl-tiny',
    layout: { ranks: 4, tp: 2, pp: 2 },
    name: 'tp 2 × pp 2 (tied embeddings on both stages)',
    bf16: true,
  },
  { model: 'tiny-vlm-moe' },
];

for (const c of CASES)
  describe(`${c.model}: export-hf → run --load-hf`, () => {
    const at = (...p: string[]) => join(dir, c.model, ...p);
    const plan = (name: string, flags: Flags = {}) => {
      const { plan, programs } = compile({
        model: c.model,
        globalBatchSize: 4,
        nprocPerNode: flags.ranks,
        parallel: { tp: flags.tp, pp: flags.pp, ep: flags.ep },
        precision: flags.bf16 ? { bf16: true } : undefined,
      });
      writePlan(at(name), plan, programs);
      return at(name);
    };
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
      const exports: [string, number, string][] = [['hf2', 2, 'fp32']];
      if (c.parts) exports.push(['hf1', 1, 'fp32']);
      if (c.bf16) exports.push(['hf2-bf16', 2, 'bf16']);
      for (const [out, step, dtype] of exports) {
        const e = await cli(
          'export-hf',
          at(out),
          '--load',
          iterDir(at('ckpt'), step),
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

    it('one rank starts from the checkpoint, bit for bit', async () => {
      const start = await startOf(at('one'), '--load-hf', at('hf2'));
      expect([...start.keys()].sort()).toEqual([...step2.keys()].sort());
      expectSame(start, (n) => step2.get(n)!);
    });

    if (c.layout)
      it(`${c.name}, each rank reading its pieces, starts from it too`, async () => {
        expectSame(await startOf(plan('multi', c.layout!), '--load-hf', at('hf2')), (n) =>
          step2.get(n)!,
        );
      });

    if (c.parts) {
      it('the encoder from one directory, the decoder from another', async () => {
        const start = await startOf(
          at('one'),
          '--load-hf-encoder',
          at('hf2'),
          '--load-hf-decoder',
          at('hf1'),
        );
        // the merger and the deepstack mergers come with the encoder
        expectSame(start, (n) => (partOf(n) === 'decoder' ? step1 : step2).get(n)!);
      });

      it('the encoder alone, from a directory without the mergers: the rest keeps its init', async () => {
        const noMerger = at('hf2-vit');
        cpSync(at('hf2'), noMerger, { recursive: true });
        const index = join(noMerger, 'model.safetensors.index.json');
        const json = JSON.parse(readFileSync(index, 'utf8'));
        for (const k of Object.keys(json.weight_map))
          if (/merger/.test(k)) delete json.weight_map[k];
        writeFileSync(index, JSON.stringify(json));
        const init = await startOf(at('one'));
        const start = await startOf(at('one'), '--load-hf-encoder', noMerger);
        expectSame(start, (n) => (partOf(n) === 'encoder' ? step2 : init).get(n)!);
      });
    }

    if (c.bf16)
      it('a bf16 plan loads a bf16 export exactly (its fp32 masters the bf16 values)', async () => {
        const start = await startOf(plan('bf16', { bf16: true }), '--load-hf', at('hf2-bf16'));
        const rounded = (t: Tensor): Tensor => ({
          ...t,
          data: new Float32Array(
            Uint32Array.from(t.data as Float32Array, (x) => roundToBf16(x) << 16).buffer,
          ),
        });
        expectSame(start, (n) => rounded(step2.get(n)!));
      });
  });
