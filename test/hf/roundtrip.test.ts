// lfc checkpoint → lfc export-hf → a rank's pieces read back (runtime/hf/load.ts), without the
// native runtime: under every layout below, every rank's piece of every parameter is bit-identical
// to that piece of the checkpoint's whole tensor at fp32, and is its bf16 rounding when exported
// in bf16 (or loaded into a bf16 plan's buffers). Both name families, the fused experts, tensor-
// parallel rows and columns (the fused q/k/v of a tensor-parallel encoder too), vocabulary rows,
// expert subsets, pipeline stages; one shard and several.
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { compile } from '../../compiler/pipeline.js';
import { roundToBf16 } from '../../runtime/bf16.js';
import { heldPieces, writeCheckpoint } from '../../runtime/checkpoint.js';
import { closeLoadPlan, planHfLoad, readPieces, type HfSource } from '../../runtime/hf/load.js';
import { readSafetensors, writeSafetensors, type Tensor } from '../../runtime/safetensors.js';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-hf-roundtrip-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** a deterministic checkpoint of whole tensors (random values, no two alike) */
function checkpointOf(model: string, save: string): Map<string, Float32Array> {
  const { plan } = compile({ model });
  let seed = 12345;
  const rand = () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31 - 0.5;
  };
  const whole = new Map<string, Float32Array>();
  const tensors = new Map<string, Tensor>();
  for (const p of plan.params) {
    const data = Float32Array.from({ length: p.shape.reduce((a, b) => a * b, 1) }, rand);
    whole.set(p.name, data);
    tensors.set(p.name, { dtype: 'F32', shape: [...p.shape], data });
  }
  writeCheckpoint(
    save,
    { model: tensors, optim: new Map() },
    {
      model: plan.model.name,
      step: 1,
      seed: 1,
      dataStep: 1,
      lr: {},
    },
  );
  return whole;
}

/** a piece's values cut from the whole tensor, row-major over the piece */
function cut(whole: Float32Array, shape: readonly number[], index: readonly (readonly number[])[]) {
  const strides = shape.map((_, d) => shape.slice(d + 1).reduce((a, b) => a * b, 1));
  const out: number[] = [];
  const walk = (d: number, at: number) => {
    if (d === shape.length) return void out.push(whole[at]);
    for (const g of index[d]) walk(d + 1, at + g * strides[d]);
  };
  walk(0, 0);
  return Float32Array.from(out);
}

const wholes = new Map<string, Map<string, Float32Array>>();

interface Layout {
  readonly name: string;
  readonly ranks: number;
  readonly parallel: { tp?: number; pp?: number; ep?: number };
  readonly overrides?: readonly string[];
  readonly bf16?: boolean;
}

const LAYOUTS: Record<string, readonly Layout[]> = {
  'qwen3-vl-moe-tiny': [
    { name: '1 rank', ranks: 1, parallel: {} },
    {
      name: 'tp 2, encoder tp 2',
      ranks: 2,
      parallel: { tp: 2 },
      overrides: ['model.image_encoder.tensor_model_parallel_size=2'],
    },
    { name: 'ep 2', ranks: 2, parallel: { ep: 2 } },
    { name: 'tp 2 × ep 2, bf16', ranks: 4, parallel: { tp: 2, ep: 2 }, bf16: true },
  ],
  'qwen2.5-vl-tiny': [{ name: 'tp 2 × pp 2', ranks: 4, parallel: { tp: 2, pp: 2 } }],
  'tiny-vlm-moe': [{ name: 'tp 2 × ep 2', ranks: 4, parallel: { tp: 2, ep: 2 } }],
};

for (const [model, layouts] of Object.entries(LAYOUTS)) {
  describe(`${model}: export-hf, then every rank's pieces`, () => {
    const save = join(dir, `${model}-ckpt`);
    const whole = checkpointOf(model, save);
    wholes.set(model, whole);
    const exported = (dtype: 'fp32' | 'bf16', shard: string) => {
      const out = join(dir, `${model}-${dtype}-${shard}`);
      return {
        out,
        run: cli(
          'export-hf',
          out,
          '--load',
          save,
          '--model',
          model,
          '--dtype',
          dtype,
          '--max-shard-size',
          shard,
        ),
      };
    };

    it('exports one shard or several, with config.json and the index', async () => {
      for (const [dtype, shard] of [
        ['fp32', '5GB'],
        ['fp32', '300KB'],
        ['bf16', '5GB'],
      ] as const) {
        const { out, run } = exported(dtype, shard);
        const r = await run;
        expect(r.err.replace(/^lfc: warning: .*\n/, '')).toBe('');
        expect(r.code).toBe(0);
        const files = readdirSync(out).sort();
        if (shard === '5GB') expect(files).toEqual(['config.json', 'model.safetensors']);
        else {
          expect(files.length).toBeGreaterThan(3);
          const index = JSON.parse(readFileSync(join(out, 'model.safetensors.index.json'), 'utf8'));
          expect(new Set(Object.values(index.weight_map))).toEqual(
            new Set(files.filter((f) => f.startsWith('model-'))),
          );
        }
      }
    });

    for (const layout of layouts)
      it(`${layout.name}: each rank's pieces are the checkpoint's, bit for bit`, () => {
        const { plan, programs } = compile({
          model,
          overrides: layout.overrides,
          nprocPerNode: layout.ranks,
          parallel: layout.parallel,
          globalBatchSize: 4,
          precision: layout.bf16 ? { bf16: true } : undefined,
        });
        const byId = new Map(programs.map((p) => [p.id, p]));
        for (const [dtype, shard] of [
          ['fp32', '300KB'],
          ['bf16', '5GB'],
        ] as const) {
          const source: HfSource = { dir: join(dir, `${model}-${dtype}-${shard}`), part: 'all' };
          let pieces = 0;
          for (let rank = 0; rank < layout.ranks; rank++) {
            const held = heldPieces(plan, byId.get(plan.rankPrograms[rank])!, rank);
            const lp = planHfLoad(
              [source],
              plan.model.name,
              plan.model.config as never,
              plan.params,
              held,
            );
            expect(lp.kept).toEqual([]);
            try {
              readPieces(
                lp,
                (r) =>
                  layout.bf16
                    ? { bf16: new Uint16Array(r.shape.reduce((a, b) => a * b, 1)) }
                    : new Float32Array(r.shape.reduce((a, b) => a * b, 1)),
                (r, got) => {
                  const want = cut(
                    whole.get(r.name)!,
                    plan.params.find((p) => p.name === r.name)!.shape,
                    r.index,
                  );
                  const bits =
                    got instanceof Float32Array
                      ? new Uint32Array(got.buffer)
                      : Uint32Array.from(got.bf16, (b) => b << 16);
                  const rounded = dtype === 'bf16' || layout.bf16;
                  const wantBits = rounded
                    ? Uint32Array.from(want, (x) => roundToBf16(x) << 16)
                    : new Uint32Array(want.buffer);
                  expect(
                    Buffer.from(bits.buffer).equals(Buffer.from(wantBits.buffer)),
                    `${r.param} on rank ${rank}`,
                  ).toBe(true);
                  pieces++;
                },
              );
              // streamed: exactly the piece's bytes were read, nothing more
              const bytes = lp.reads.reduce((a, r) => a + r.shape.reduce((x, y) => x * y, 1), 0);
              expect(lp.dirs[0].stats.bytes).toBe(bytes * (dtype === 'bf16' ? 2 : 4));
            } finally {
              closeLoadPlan(lp);
            }
          }
          expect(pieces).toBeGreaterThanOrEqual(plan.params.length);
        }
      });
  });
}

describe("fused experts in transformers v5's in-memory layout ([E, 2F, H], [E, H, F])", () => {
  it('load the same pieces as the hub layout', () => {
    const model = 'qwen3-vl-moe-tiny';
    const hub = join(dir, `${model}-fp32-5GB`);
    const v5 = join(dir, `${model}-v5`);
    cpSync(hub, v5, { recursive: true });
    const file = join(v5, 'model.safetensors');
    const tensors = readSafetensors(file).tensors;
    for (const [name, t] of tensors) {
      if (!/experts\.(gate_up|down)_proj$/.test(name)) continue;
      const [E, a, b] = t.shape;
      const src = t.data as Float32Array;
      const out = new Float32Array(src.length);
      for (let e = 0; e < E; e++)
        for (let i = 0; i < a; i++)
          for (let j = 0; j < b; j++) out[e * a * b + j * a + i] = src[e * a * b + i * b + j];
      tensors.set(name, { dtype: 'F32', shape: [E, b, a], data: out });
    }
    writeSafetensors(file, tensors);
    const { plan, programs } = compile({
      model,
      nprocPerNode: 2,
      parallel: { ep: 2 },
      globalBatchSize: 4,
    });
    const whole = wholes.get(model)!;
    for (let rank = 0; rank < 2; rank++) {
      const held = heldPieces(plan, programs[0], rank);
      const lp = planHfLoad(
        [{ dir: v5, part: 'all' }],
        plan.model.name,
        plan.model.config as never,
        plan.params,
        held,
      );
      try {
        readPieces(
          lp,
          (r) => new Float32Array(r.shape.reduce((x, y) => x * y, 1)),
          (r, got) => {
            const want = cut(
              whole.get(r.name)!,
              plan.params.find((p) => p.name === r.name)!.shape,
              r.index,
            );
            expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer)), r.param).toBe(true);
          },
        );
      } finally {
        closeLoadPlan(lp);
      }
    }
  });
});
