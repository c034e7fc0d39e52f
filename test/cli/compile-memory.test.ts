// lfc compile's memory table: each distinct program's planned bytes per rank by kind, held to what
// the model and the layout say they must be: one rank holds every parameter (f32) once, with a
// gradient for each trainable one and AdamW's two moments; the distributed optimizer over dp 2
// halves the optimizer state and leaves the parameters; pipeline stages split the parameters between them.
import { describe, expect, it } from 'vitest';
import { describeMemory } from '../../cli/compile.js';
import { memoryByProgram } from '../../compiler/report/memory.js';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import { cli } from '../helpers.js';

const BATCH = { microBatchSize: 1, globalBatchSize: 4 };
const memoryOf = (o: Partial<CompileOptions>) => {
  const result = compile({ model: 'tiny-vlm-moe', ...BATCH, ...o } as CompileOptions);
  return { result, memory: memoryByProgram(result) };
};
const ALIGN = 64; // bytes each tensor may be padded to in its region

describe('memory per rank', () => {
  it('one rank: every parameter once, a gradient per trainable one, two AdamW moments', () => {
    const { result, memory } = memoryOf({});
    expect(memory).toHaveLength(1);
    const [m] = memory;
    const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);
    const params = result.plan.params;
    const all = params.reduce((a, p) => a + 4 * numel(p.shape), 0);
    const trainable = params.filter((p) => p.trainable).reduce((a, p) => a + 4 * numel(p.shape), 0);
    expect(m.parameters).toBeGreaterThanOrEqual(all);
    expect(m.parameters).toBeLessThanOrEqual(all + ALIGN * params.length);
    expect(m.gradients).toBeGreaterThanOrEqual(trainable);
    expect(m.gradients).toBeLessThanOrEqual(trainable + ALIGN * params.length);
    expect(m.optimizer).toBeGreaterThanOrEqual(2 * trainable);
    expect(m.optimizer).toBeLessThanOrEqual(2 * (trainable + ALIGN * params.length));
    expect(m.device).toBe(
      m.parameters + m.gradients + m.optimizer + m.batch + m.activations + m.scratch,
    );
    expect(m.activations).toBeGreaterThan(0);
    expect(m.host).toBe(0);
  });

  it('the distributed optimizer over dp 2 halves the optimizer state, not the parameters', () => {
    const plain = memoryOf({ nprocPerNode: 2 }).memory;
    const sharded = memoryOf({ nprocPerNode: 2, distributedOptimizer: true }).memory;
    expect(plain).toHaveLength(1);
    expect(plain[0].ranks).toBe(2);
    const [a, b] = [plain[0], sharded[0]];
    expect(b.parameters).toBe(a.parameters);
    const tensors = memoryOf({}).result.plan.params.length;
    expect(Math.abs(b.optimizer - a.optimizer / 2)).toBeLessThanOrEqual(ALIGN * 2 * tensors);
  });

  it('pp 2: one program per stage, the two holding the parameters of one rank between them', () => {
    const one = memoryOf({}).memory[0];
    const { memory } = memoryOf({ nprocPerNode: 2, parallel: { pp: 2 } });
    expect(memory.map((m) => m.stages).sort()).toEqual([[0], [1]]);
    expect(memory.map((m) => m.ranks)).toEqual([1, 1]);
    // tiny-vlm-moe ties no weights (its embedding and lm_head are tensors of their own): the
    // stages hold disjoint parameters
    expect(memory[0].parameters + memory[1].parameters).toBe(one.parameters);
    expect(memory[0].device).toBeGreaterThanOrEqual(memory[1].device); // largest first
  });

  it('lfc compile prints the table, and --json carries it', async () => {
    const argv = ['compile', 'tiny-vlm-moe', '--nproc-per-node', '2', '--pp', '2'];
    const text = await cli(
      ...argv,
      '--global-batch-size',
      '4',
      '-o',
      `${process.env.TMPDIR ?? '/tmp'}/mem-table`,
    );
    expect(text.code).toBe(0);
    expect(text.out).toMatch(/memory per rank, MiB/);
    expect(text.out).toMatch(/p0 \(1 rank, stage 0\)/);
    expect(text.out).toMatch(/p1 \(1 rank, stage 1\)/);
    const json = await cli(
      ...argv,
      '--global-batch-size',
      '4',
      '--json',
      '-o',
      `${process.env.TMPDIR ?? '/tmp'}/mem-json`,
    );
    const parsed = JSON.parse(json.out) as {
      memory: {
        device: { name: string; bytes: number; reserveBytes: number };
        programs: {
          program: string;
          device: number;
          bound: { deviceBytes: number };
          expected: { deviceBytes: number };
          hostBytes: number;
          fits: boolean;
        }[];
      };
    };
    const { device, programs } = parsed.memory;
    expect(device.name).toBe('h800'); // the default --hardware
    expect(programs.map((m) => m.program).sort()).toEqual(['p0', 'p1']);
    for (const m of programs) {
      expect(m.bound.deviceBytes).toBe(m.device);
      // the synthetic profile expects fewer visual tokens than its bound (the sequence)
      expect(m.expected.deviceBytes).toBeLessThanOrEqual(m.bound.deviceBytes);
      expect(m.hostBytes).toBe(0);
      expect(m.fits).toBe(m.bound.deviceBytes + device.reserveBytes <= device.bytes);
    }
    expect(describeMemory(programs as never, 1).at(-1)).toMatch(/… and 1 program more/);
  });

  it("a GPU device does not count the CPU runtime's scratch; a CPU one does", () => {
    const { result } = memoryOf({});
    const device = (runtime: 'cpu' | 'gpu') => ({
      name: runtime,
      bytes: 2 ** 40,
      reserveBytes: 0,
      runtime,
    });
    const [cpu] = memoryByProgram(result, device('cpu'));
    const [gpu] = memoryByProgram(result, device('gpu'));
    const scratch = result.programs[0].regions.scratch;
    expect(scratch).toBeGreaterThan(0);
    expect(cpu.scratch).toBe(scratch);
    expect(gpu.scratch).toBe(0);
    expect(cpu.device - gpu.device).toBe(scratch);
    expect(cpu.expected.deviceBytes - gpu.expected.deviceBytes).toBe(scratch);
  });
});
