// lfc calibrate: the fits recover a known profile from samples it generates (kernel times from
// kernelSeconds, transfer times from the link formula, with ±5% noise), and the command measures
// this machine into a profile lfc compile loads.
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { describe, expect, it } from 'vitest';
import { fitCompute, fitLink } from '../../compiler/sim/calibrate.js';
import { kernelSeconds } from '../../compiler/sim/cost.js';
import { loadHardware } from '../../compiler/sim/hardware.js';
import { cli } from '../helpers.js';

/** deterministic noise in [1 − a, 1 + a] */
function noise(a: number) {
  let x = 12345;
  return () => {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    return 1 + a * (2 * (x / 2 ** 32) - 1);
  };
}

describe('calibration fits', () => {
  it('recover launch, memory bandwidth, matmul peak and its half-size from kernel times', () => {
    const truth = {
      matmulTflops: 0.08,
      matmulEfficiency: 1,
      matmulHalfGflop: 0.002,
      memoryGbps: 12,
      memoryEfficiency: 1,
      launchUs: 3,
      dtypeBytes: 4,
      gradDtypeBytes: 4,
    };
    const jitter = noise(0.05);
    const samples = [];
    for (let k = 0; k < 40; k++) {
      const bytes = 2 ** (8 + (k % 6)); // 256 B … 8 KiB: launch-bound
      samples.push({
        flops: 0,
        bytes,
        seconds: kernelSeconds(0, bytes, { compute: truth }) * jitter(),
      });
      const big = 2 ** (18 + (k % 8)); // 256 KiB … 32 MiB: bandwidth-bound
      samples.push({
        flops: 0,
        bytes: big,
        seconds: kernelSeconds(0, big, { compute: truth }) * jitter(),
      });
      const flops = 2 * 64 ** 3 * 2 ** (k % 12); // 0.5 MFLOP … 1 GFLOP
      const bytesMoved = 3 * 4 * 64 * 64;
      samples.push({
        flops,
        bytes: bytesMoved,
        seconds: kernelSeconds(flops, bytesMoved, { compute: truth }) * jitter(),
      });
    }
    const fit = fitCompute(samples);
    expect(fit.launchUs / truth.launchUs).toBeGreaterThan(0.9);
    expect(fit.launchUs / truth.launchUs).toBeLessThan(1.1);
    expect(fit.memoryGbps / truth.memoryGbps).toBeGreaterThan(0.9);
    expect(fit.memoryGbps / truth.memoryGbps).toBeLessThan(1.1);
    expect(fit.matmulTflops / truth.matmulTflops).toBeGreaterThan(0.85);
    expect(fit.matmulTflops / truth.matmulTflops).toBeLessThan(1.15);
    expect(fit.matmulHalfGflop / truth.matmulHalfGflop).toBeGreaterThan(0.7);
    expect(fit.matmulHalfGflop / truth.matmulHalfGflop).toBeLessThan(1.4);
  });

  it('recovers latency and bandwidth from transfer times', () => {
    const jitter = noise(0.05);
    const samples = [1, 2, 4, 8, 16, 64, 256, 1024].flatMap((kib) =>
      [1, 2].map((steps) => {
        const moved = kib * 1024;
        return { steps, moved, seconds: (steps * 50e-6 + moved / 2e9) * jitter() };
      }),
    );
    const link = fitLink(samples);
    expect(link.gbps).toBeGreaterThan(1.8);
    expect(link.gbps).toBeLessThan(2.2);
    expect(link.latencyUs).toBeGreaterThan(40);
    expect(link.latencyUs).toBeLessThan(60);
  });

  it('refuses too few samples, naming what is missing', () => {
    expect(() => fitCompute([])).toThrow(/small kernels/);
    expect(() => fitLink([])).toThrow(/collectives/);
  });
});

describe('lfc calibrate', () => {
  it('writes a profile of this machine that lfc compile takes', async () => {
    const file = join(tmpdir(), 'local.yaml');
    const r = await cli('calibrate', '--steps', '2', '--threads', '1', '-o', file);
    expect(r.err).toMatch(/lfc calibrate: kernels of tiny-vlm-moe/);
    expect(r.code).toBe(0);
    const hw = loadHardware(file);
    expect(hw.name).toBe('local');
    expect(hw.compute.matmulTflops).toBeGreaterThan(0);
    expect(hw.compute.dtypeBytes).toBe(4);
    const c = await cli(
      'compile',
      'tiny-vlm',
      '--hardware',
      file,
      '-o',
      join(tmpdir(), 'cal-plan'),
    );
    expect(c.out).toMatch(/simulated on local: step [\d.]+ ms/);
  }, 120_000);
});
