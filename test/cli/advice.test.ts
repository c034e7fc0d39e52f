// The fits check's advice: when a plan does not fit its device, each single change that applies is
// planned for its memory, and those that fit are listed with their figure. Held here to the same
// alternative compiled on its own, on a device made just too small for the plan, on one thread or
// on worker threads.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { alternativesOf, remediesFor } from '../../compiler/report/advice.js';
import { memoryByProgram, type DeviceMemory } from '../../compiler/report/memory.js';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-advice-'));
const OPTIONS: CompileOptions = {
  model: 'tiny-vlm-moe',
  nprocPerNode: 2,
  globalBatchSize: 4,
  microBatchSize: 2,
};
/** a hardware profile file of `memoryGib` per GPU, no reserve */
function profile(name: string, description: string, memoryGib: number): string {
  const file = join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    [
      `name: ${name}`,
      `description: ${description}`,
      'gpus_per_node: 8',
      `memory_gib: ${memoryGib}`,
      'memory_reserve_gib: 0',
      'compute: { matmul_tflops: 100, matmul_efficiency: 0.5, matmul_half_gflop: 1, memory_gbps: 1000, memory_efficiency: 0.8, launch_us: 5, dtype_bytes: 2, grad_dtype_bytes: 4 }',
      'links: { intra_node: { gbps: 100, latency_us: 5 }, inter_node: { gbps: 10, latency_us: 10 }, host: { gbps: 20, latency_us: 5 } }',
      'efficiency: { gemm: { tiles: [[128, 128]], sms: 100, grouped_streams: 4 }, attention: { default: flash2, flash2: { forward: 0.5, backward: 0.4, half_segment: 500, head_dim_multiple: 32 } }, collectives: { all_to_all: 1 }, overlap: { compute_slowdown: 0.1 } }',
      '',
    ].join('\n'),
  );
  return file;
}

const worst = (o: CompileOptions, device: DeviceMemory) =>
  Math.max(...memoryByProgram(compile(o), device).map((m) => m.bound.deviceBytes));

describe('the fits advice', () => {
  it('lists the changes that apply, each planned as if compiled on its own', async () => {
    const gpu = { name: 'small', bytes: 2 ** 40, reserveBytes: 0, runtime: 'gpu' } as const;
    const plain = worst(OPTIONS, gpu);
    const device = { ...gpu, bytes: plain - 1 };
    const changes = alternativesOf(OPTIONS, 2).map((a) => a.change);
    expect(changes).toContain('--use-distributed-optimizer');
    expect(changes).toContain('--micro-batch-size 1');
    expect(changes).toContain('--recompute-granularity full');
    const remedies = await remediesFor(OPTIONS, 2, device);
    const byChange = new Map(remedies.map((r) => [r.change, r]));
    // each figure is the alternative's own plan
    expect(byChange.get('--use-distributed-optimizer')!.deviceBytes).toBe(
      worst({ ...OPTIONS, distributedOptimizer: true }, gpu),
    );
    expect(byChange.get('--micro-batch-size 1')!.deviceBytes).toBe(
      worst({ ...OPTIONS, microBatchSize: 1 }, gpu),
    );
    for (const r of remedies) expect(r.fits).toBe(r.deviceBytes <= device.bytes);
    expect(remedies.some((r) => r.fits)).toBe(true);
    // smallest first
    const sizes = remedies.map((r) => r.deviceBytes);
    expect(sizes).toEqual([...sizes].sort((a, b) => a - b));
    // planned on two worker threads at once: the same answer
    expect(await remediesFor(OPTIONS, 2, device, { workers: 2 })).toEqual(remedies);
  }, 120_000);

  it('lfc compile prints them for a profile the plan does not fit', async () => {
    const hw = profile('small', 'a device just too small', 0.03);
    const argv = ['compile', 'tiny-vlm-moe', '--nproc-per-node', '2', '--global-batch-size', '4'];
    const small = [...argv, '--micro-batch-size', '2', '--hardware', hw, '--no-simulate'];
    const r = await cli(...small, '-o', join(dir, 'plan'));
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/does not fit small: p0 needs up to/);
    expect(r.out).toMatch(
      /single changes that fit \(each planned; largest program at the bounds\):|no single change fits/,
    );
    // the report first, then the advice: its last lines
    expect(r.out).toMatch(/would make it fit: planned below, after the report/);
    const lines = r.out.trimEnd().split('\n');
    // the advice's lines close the output (and, where no change fits, the lfc tune line)
    const last = lines.findIndex((l) =>
      /planned \d+ alternatives in [\d.]+ s on \d+ threads?; --no-advice skips them/.test(l),
    );
    expect(last).toBeGreaterThan(0);
    expect(lines.slice(last + 1).every((l) => /whole layouts|lfc tune/.test(l))).toBe(true);
    const planned = lines.findIndex((l) => /planned below, after the report/.test(l));
    expect(planned).toBeGreaterThan(0);
    expect(
      lines.findIndex((l) => /^ {2}(single changes that fit \(|no single change fits)/.test(l)),
    ).toBeGreaterThan(planned);
    const quiet = await cli(...small, '--no-advice', '-o', join(dir, 'plan2'));
    expect(quiet.out).toMatch(/does not fit small/);
    expect(quiet.out).not.toMatch(/alternatives|planned below/);
  }, 120_000);

  it('where no single change fits, points to lfc tune for the same model and cluster', async () => {
    const hw = profile('tiny', 'a device far too small for any layout', 0.001);
    const r = await cli(
      ...['compile', 'tiny-vlm-moe', '--nproc-per-node', '2', '--global-batch-size', '4'],
      ...['--hardware', hw, '--no-simulate', 'model.image_encoder.tensor_model_parallel_size=1'],
      ...['model.image_encoder.freeze=True', '-o', join(dir, 'plan3')],
    );
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/no single change fits/);
    const lines = r.out.trimEnd().split('\n');
    expect(lines.at(-2)).toMatch(/whole layouts of this model and cluster/);
    // the cluster, hardware and batch kept, the freeze kept, the encoder's TP left to the search
    const tune = lines.at(-1)!.trim();
    expect(tune).toBe(
      `lfc tune tiny-vlm-moe --nnodes 1 --nproc-per-node 2 --hardware ${hw} --global-batch-size 4 model.image_encoder.freeze=True`,
    );
    // a line lfc tune takes: here no layout's weights and optimizer state fit
    const tuned = await cli(...tune.split(' ').slice(1));
    expect(tuned.code).toBe(0);
    expect(tuned.out).toMatch(/no layout fits: in every one the weights and optimizer state alone/);
  }, 120_000);
});
