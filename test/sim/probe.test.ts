// The h200 profile against an H200's measured kernels (bench/data/h200, bench/gpu_probe.py): the
// cost model's price of each measured case, family by family, and the fit that gives the
// profile's figures (compiler/sim/probe.ts).

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import { parseCompileArgs } from '../../cli/compile.js';
import { compile } from '../../compiler/pipeline.js';
import { loadHardware, scaleEfficiency } from '../../compiler/sim/hardware.js';
import { forecastStep } from '../../compiler/sim/report.js';
import {
  DRAM_BYTES,
  fitProbe,
  loadProbe,
  priceProbe,
  summarize,
} from '../../compiler/sim/probe.js';
import { projectRoot } from '../../compiler/paths.js';
import { cli } from '../helpers.js';

const probe = loadProbe(join(projectRoot(), 'bench/data/h200'));
const h200 = loadHardware('h200');
const family = (cases: ReturnType<typeof summarize>, name: string) => {
  const f = cases.find((s) => s.family === name);
  if (!f) throw new Error(`no ${name} cases`);
  return f;
};

describe('h200 against its measured kernels', () => {
  it('reads every family of the probe, the GPU-only timings where there are some', () => {
    expect(probe.environment.name).toBe('NVIDIA H200');
    expect(probe.sources).toMatchObject({
      gemm: 'graphs.json',
      grouped: 'graphs.json',
      memory: 'graphs.json',
      attention: 'eager.json',
    });
    expect(probe.gemm!.length).toBe(78);
    expect(probe.attention!.filter((a) => !a.error).length).toBe(66);
  });

  it('prices GEMMs within 15% for most shapes, and within 35% for every one', () => {
    const s = family(summarize(priceProbe(probe, h200)), 'gemm');
    expect(s.median).toBeGreaterThan(0.93);
    expect(s.median).toBeLessThan(1.07);
    expect(s.within / s.cases).toBeGreaterThan(0.8);
    expect(s.min).toBeGreaterThan(0.65);
    expect(s.max).toBeLessThan(1.35);
  });

  it('prices attention on the kernel measured, forward and backward', () => {
    const all = summarize(priceProbe(probe, h200));
    for (const k of ['flash2', 'cudnn'])
      for (const pass of ['forward', 'backward']) {
        const s = family(all, `attention ${k} ${pass}`);
        expect(s.median, `${k} ${pass}`).toBeGreaterThan(0.9);
        expect(s.median, `${k} ${pass}`).toBeLessThan(1.1);
        expect(s.min, `${k} ${pass}`).toBeGreaterThan(0.7);
        expect(s.max, `${k} ${pass}`).toBeLessThan(1.5);
      }
  });

  // the one miss: a 1 GiB copy timed in a graph ran at 2.8 TB/s, the same copy launched from Python
  // at 4.2 (eager.json)
  it('prices memory-bound kernels out of L2 within 30%, and a grouped GEMM kernel within 35%', () => {
    const cases = priceProbe(probe, h200);
    const big = cases.filter((c) => c.family === 'memory-bound' && c.bytes! >= DRAM_BYTES);
    expect(big.length).toBe(12);
    for (const c of big) expect(c.predicted / c.measured, c.label).toBeGreaterThan(0.7);
    for (const c of big) expect(c.predicted / c.measured, c.label).toBeLessThan(1.3);
    const g = family(summarize(cases), 'grouped (_grouped_mm)');
    expect(g.median).toBeGreaterThan(0.8);
    expect(g.min).toBeGreaterThan(0.65);
    expect(g.max).toBeLessThan(1.35);
  });

  it('tells a profile off by 30% apart (the checks above can fail)', () => {
    const fast = family(summarize(priceProbe(probe, scaleEfficiency(h200, 'gemm', 1.3))), 'gemm');
    expect(fast.median).toBeLessThan(0.8);
    const e = h200.efficiency!;
    const cudnn = e.attentionKernels.cudnn;
    const slow = {
      ...h200,
      efficiency: {
        ...e,
        attentionKernels: {
          ...e.attentionKernels,
          cudnn: { ...cudnn, forward: 0.7 * cudnn.forward },
        },
      },
    };
    expect(
      family(summarize(priceProbe(probe, slow)), 'attention cudnn forward').median,
    ).toBeGreaterThan(1.3);
  });

  it("the fit gives the profile's figures back, from a profile far off", () => {
    const off = scaleEfficiency(scaleEfficiency(h200, 'gemm', 0.6), 'memory', 0.6);
    const f = fitProbe(probe, {
      ...off,
      compute: { ...off.compute, launchUs: 9, matmulHalfGflop: 5 },
      efficiency: { ...off.efficiency!, gemmKHalf: 0, gemmSplitK: 0 },
    });
    expect(f.compute.launchUs).toBeCloseTo(h200.compute.launchUs, 2);
    expect(f.compute.matmulEfficiency).toBeCloseTo(h200.compute.matmulEfficiency, 2);
    expect(f.compute.matmulHalfGflop).toBeCloseTo(h200.compute.matmulHalfGflop, 1);
    expect(f.compute.memoryEfficiency).toBeCloseTo(h200.compute.memoryEfficiency, 2);
    expect(f.efficiency!.gemmKHalf).toBe(h200.efficiency!.gemmKHalf);
    expect(f.efficiency!.gemmSplitK).toBe(h200.efficiency!.gemmSplitK);
    for (const k of ['flash2', 'cudnn']) {
      const got = f.efficiency!.attentionKernels[k];
      const want = h200.efficiency!.attentionKernels[k];
      expect(got.forward, k).toBeCloseTo(want.forward, 2);
      expect(got.backward, k).toBeCloseTo(want.backward, 2);
      expect(got.halfSegment, k).toBe(want.halfSegment);
    }
  });

  it('simulates a whole measured step (Llama 3 8B, 4 layers, fused kernels) within 10%', () => {
    const m = JSON.parse(
      readFileSync(join(projectRoot(), 'bench/data/h200/step-compiled.json'), 'utf8'),
    ) as { median_seconds: number; layers: number; microbatches: number; seq: number };
    const { options } = parseCompileArgs([
      'llama3-8b-text',
      `model.text_decoder.num_layers=${m.layers}`,
      ...['--nproc-per-node', '1', '--seq-length', String(m.seq), '--micro-batch-size', '1'],
      ...['--global-batch-size', String(m.microbatches), '--bf16', '--hardware', 'h200'],
      ...['--attention-kernel', 'cudnn', '--data-profile', 'text'],
    ]);
    const r = compile({ ...options, skipVerify: true });
    const programs = new Map(r.programs.map((p) => [p.id, p]));
    const hw = loadHardware('h200', 'cudnn');
    const step = forecastStep(r.modelForwardFlops, r.plan, programs, hw).forecast.stepSeconds;
    expect(step / m.median_seconds).toBeGreaterThan(0.9);
    expect(step / m.median_seconds).toBeLessThan(1.1);
  });

  it('lfc calibrate --probe writes the fitted profile, which lfc compile takes', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'lfc-probe-'));
    try {
      const out = join(dir, 'h200-probe.yaml');
      const probeDir = join(projectRoot(), 'bench/data/h200');
      const r = await cli('calibrate', '--probe', probeDir, '--hardware', 'h200', '-o', out);
      expect(r.err).not.toContain('warning');
      expect(r.code, r.err).toBe(0);
      expect(r.out).toMatch(/gemm +1\.01 → 1\.01 \(67\/78 within 15%\)/);
      const back = loadHardware(out);
      // the fit of the committed profile gives the committed profile's figures back
      expect(back.compute.matmulEfficiency).toBeCloseTo(h200.compute.matmulEfficiency, 2);
      expect(back.compute.memoryEfficiency).toBeCloseTo(h200.compute.memoryEfficiency, 2);
      expect(back.efficiency!.gemmSplitK).toBe(h200.efficiency!.gemmSplitK);
      expect(back.efficiency!.attentionKernels.cudnn.forward).toBeCloseTo(0.55, 2);
      expect(back.links).toEqual(h200.links);
      const c = await cli('compile', 'tiny-vlm', '--hardware', out, '-o', join(dir, 'plan'));
      expect(c.code, c.err).toBe(0);
      expect(c.out).toContain('simulated on h200-probe');
      // a probe of another GPU than the base profile's: fitted, with a warning
      const w = await cli('calibrate', '--probe', probeDir, '--hardware', 'h100');
      expect(w.code).toBe(0);
      expect(w.err).toContain("is not h100's");
      const bad = await cli('calibrate', '--probe', dir);
      expect(bad.code).toBe(2);
      expect(bad.err).toContain('no eager.json or graphs.json');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
