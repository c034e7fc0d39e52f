// Static memory against Megatron's count. Megatron-LM's distributed optimizer documentation gives
// the bytes per trainable parameter of mixed-precision training with Adam:
//   bf16 parameter 2 + fp32 main gradient 4 + fp32 master weight, exp_avg, exp_avg_sq 4 + 4 + 4
//   = 18 without the distributed optimizer, and 6 + 12/d with it, d the ranks the optimizer state
//   is sharded over;
// in f32 (no --bf16: no master weights) 4 + 4 + 8 = 16, or 8 + 8/d. A frozen parameter holds its
// compute copy only (2 bytes in bf16; the projector stays trainable). d is each parameter's own gradient group, written here
// from the layout, not read from the plan: dp for dense decoder parameters, expert-DP
// (world / (ep · etp · pp)) for experts, and the encoder's group at levels 2 (tp · dp) and 3
// (the world); a group of one rank is not sharded.
//
// On the Qwen presets under several layouts, each program's parameter + gradient + optimizer
// regions equal that count up to padding: every tensor is aligned to 64 bytes in each region it
// has a buffer in (at most 5: parameter, gradient, master, exp_avg, exp_avg_sq), and a sharded
// bucket is padded to a multiple of 64 · d bytes in the gradient and parameter regions, its three
// fp32 slices to 64 bytes each.
import { describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import type { ProgramFile } from '../../compiler/plan/format.js';
import { bytesPerParam } from '../../compiler/inspect.js';
import { resolvePrecision } from '../../compiler/frontend/precision.js';
import { cli } from '../helpers.js';

const ALIGN = 64;

interface Case {
  readonly name: string;
  readonly options: CompileOptions;
  readonly bf16: boolean;
  readonly frozenEncoder: boolean;
  /** encoder level: 1 (sharded like the decoder, summed over dp), 2, 3 */
  readonly level: 1 | 2 | 3;
}

/** qwen2.5-vl-7b as the article trains it (tp 4 × dp 2, level 2), its encoder frozen or not */
const qwen7b = (frozenEncoder: boolean): Case => ({
  name: `qwen2.5-vl-7b, tp 4 × dp 2, distributed optimizer, level 2, encoder ${frozenEncoder ? 'frozen (the article)' : 'trained'}`,
  options: {
    model: 'qwen2.5-vl-7b',
    overrides: frozenEncoder ? ['+model.image_encoder.freeze=True'] : [],
    nprocPerNode: 8,
    parallel: { tp: 4 },
    distributedOptimizer: true,
    encoder: { heteroDp: true },
    globalBatchSize: 32,
    precision: { bf16: true },
  },
  bf16: true,
  frozenEncoder,
  level: 2,
});

const CASES: Case[] = [
  qwen7b(true),
  qwen7b(false),
  {
    name: 'qwen3-vl-30b-a3b, tp 4 × pp 2 × ep 4 on 32 ranks, no distributed optimizer (18 bytes)',
    options: {
      model: 'qwen3-vl-30b-a3b',
      nnodes: 4,
      nprocPerNode: 8,
      parallel: { tp: 4, pp: 2, ep: 4 },
      seqLength: 32768,
      globalBatchSize: 64,
      precision: { bf16: true },
    },
    bf16: true,
    frozenEncoder: false,
    level: 1,
  },
  {
    name: 'qwen3-vl-30b-a3b, pp 2 × ep 4 × vpp 2, distributed optimizer, level 3, encoder trained',
    options: {
      model: 'qwen3-vl-30b-a3b',
      nnodes: 4,
      nprocPerNode: 8,
      parallel: { pp: 2, ep: 4, vpp: 2 },
      distributedOptimizer: true,
      encoder: { fullHeteroDp: true },
      seqLength: 32768,
      globalBatchSize: 64,
      precision: { bf16: true },
    },
    bf16: true,
    frozenEncoder: false,
    level: 3,
  },
  {
    name: 'qwen2.5-vl-3b, tp 2 × dp 4, distributed optimizer, f32 (8 + 8/d)',
    options: {
      model: 'qwen2.5-vl-3b',
      nprocPerNode: 8,
      parallel: { tp: 2 },
      distributedOptimizer: true,
      globalBatchSize: 8,
      seqLength: 4096,
    },
    bf16: false,
    frozenEncoder: false,
    level: 1,
  },
];

/** the data-parallel group a parameter's gradient (and sharded optimizer state) is summed over */
function gradGroup(name: string, c: Case, world: number): number {
  const p = c.options.parallel ?? {};
  const tp = p.tp ?? 1;
  const pp = p.pp ?? 1;
  const ep = p.ep ?? 1;
  const dp = world / (tp * pp);
  if (name.includes('.mlp.experts.')) return world / (ep * tp * pp);
  if (name.startsWith('visual.')) return c.level === 3 ? world : c.level === 2 ? tp * dp : dp;
  return dp;
}

/** the vision encoder's own parameters (the projector, visual.merger and the deepstack mergers,
 * stays trainable when the encoder is frozen) */
const isEncoder = (name: string) =>
  name.startsWith('visual.') && !/^visual\.(merger|deepstack)/.test(name);

/** Megatron's bytes of one program's parameters, gradients and optimizer state */
function megatronBytes(program: ProgramFile, c: Case, world: number): number {
  let bytes = 0;
  for (const q of program.params) {
    const n = q.shard.reduce((a, [, len]) => a * len, 1);
    const frozen = c.frozenEncoder && isEncoder(q.name);
    const d = gradGroup(q.name, c, world);
    const sharded = c.options.distributedOptimizer === true && d > 1;
    if (c.bf16) bytes += frozen ? 2 * n : sharded ? (6 + 12 / d) * n : 18 * n;
    else bytes += frozen ? 4 * n : sharded ? (8 + 8 / d) * n : 16 * n;
  }
  return bytes;
}

describe("static memory: parameters, gradients and optimizer state are Megatron's bytes", () => {
  for (const c of CASES) {
    it(
      c.name,
      () => {
        const r = compile({ ...c.options, skipVerify: true });
        const world = r.plan.topology.worldSize;
        for (const program of r.programs) {
          const { param, grad, optim } = program.regions;
          const planned = param + grad + optim;
          const want = megatronBytes(program, c, world);
          const shards = program.optimizerShards ?? [];
          const padding =
            5 * ALIGN * program.params.length +
            shards.reduce((a, s) => a + 2 * ALIGN * s.parts + 3 * ALIGN, 0);
          const gib = (b: number) => (b / 2 ** 30).toFixed(3);
          console.log(
            `${c.name.split(',')[0]} ${program.id}: planned ${gib(planned)} GiB, Megatron ${gib(want)} GiB, +${planned - want} bytes (padding bound ${padding})`,
          );
          expect(planned, program.id).toBeGreaterThanOrEqual(want);
          expect(planned - want, program.id).toBeLessThanOrEqual(padding);
        }
      },
      60_000,
    );
  }
});

describe('lfc inspect agrees', () => {
  it.each([
    { bf16: true, dist: false, d: 1, want: 18 },
    { bf16: true, dist: true, d: 4, want: 6 + 12 / 4 },
    { bf16: false, dist: false, d: 1, want: 16 },
    { bf16: false, dist: true, d: 2, want: 8 + 8 / 2 },
  ])('bf16 $bf16, distributed optimizer $dist over $d: $want bytes a trainable parameter', (c) => {
    const b = bytesPerParam({
      precision: resolvePrecision({ bf16: c.bf16 }),
      distributedOptimizer: c.dist,
      dataParallelSize: c.d,
    });
    expect(b.weight + b.master + b.grad + b.moments).toBe(c.want);
  });

  it("its totals are a one-rank plan's parameter, gradient and optimizer regions (tiny-vlm, bf16)", async () => {
    const r = await cli('inspect', 'tiny-vlm', '--bf16', '--json');
    const m = (JSON.parse(r.out) as { memory: Record<string, number> }).memory;
    const plan = compile({ model: 'tiny-vlm', precision: { bf16: true } });
    const { param, grad, optim } = plan.programs[0].regions;
    const tensors = plan.programs[0].params.length;
    expect(
      param + grad + optim - (m.weightBytes + m.gradBytes + m.masterBytes + m.optimizerBytes),
    ).toBeGreaterThanOrEqual(0);
    expect(
      param + grad + optim - (m.weightBytes + m.gradBytes + m.masterBytes + m.optimizerBytes),
    ).toBeLessThanOrEqual(5 * ALIGN * tensors);
  });
});
