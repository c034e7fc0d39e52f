// The cost model (compiler/sim/cost.ts) by hand: collective formulas, a linear's price from its
// shapes, the sizes costs are taken at; hardware profiles and their errors; lfc compile's
// simulated-step report, its predicted trace and its flags.
import { readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import {
  collectiveSeconds,
  expectedSizes,
  gemmQuantization,
  groupCollectiveSeconds,
  instructionCosts,
  instructionWork,
  matmulEfficiency,
  oneNode,
} from '../../compiler/sim/cost.js';
import { listHardware, loadHardware, scaleEfficiency } from '../../compiler/sim/hardware.js';
import { microbatchForwardFlops } from '../../compiler/sim/report.js';
import { cli, gpuSideProfile } from '../helpers.js';

const h800 = loadHardware('h800');
const GiB = 2 ** 30;

describe('collective formulas', () => {
  const link = { gbps: 100, latencyUs: 10 };
  it.each([
    ['all_reduce', 8, 2 * 7 * 10e-6 + (2 * (7 / 8) * GiB) / 100e9],
    ['all_gather', 8, 7 * 10e-6 + ((7 / 8) * GiB) / 100e9],
    ['reduce_scatter', 4, 3 * 10e-6 + ((3 / 4) * GiB) / 100e9],
    ['all_to_all_v', 2, 10e-6 + GiB / 2 / 100e9],
    ['broadcast', 8, 3 * 10e-6 + GiB / 100e9],
    ['send', 2, 10e-6 + GiB / 100e9],
    ['all_reduce', 1, 0],
  ] as const)('%s over %i ranks, 1 GiB', (op, P, want) => {
    expect(collectiveSeconds(op, P, GiB, link)).toBeCloseTo(want, 12);
  });
});

describe('groups over nodes', () => {
  const links = { intraNode: { gbps: 200, latencyUs: 4 }, interNode: { gbps: 12.5, latencyUs: 8 } };
  const nvlink = (op: string, P: number) => collectiveSeconds(op, P, GiB, links.intraNode);
  it('a group on one node runs on NVLink', () => {
    for (const op of ['all_reduce', 'all_to_all_v', 'broadcast'])
      expect(groupCollectiveSeconds(op, oneNode(8), GiB, links)).toBe(nvlink(op, 8));
  });
  it('a ring of one rank per node runs at one NIC share; of q per node, at q shares', () => {
    const at = (q: number) =>
      groupCollectiveSeconds('all_reduce', { size: 4 * q, nodes: 4, local: q }, GiB, links);
    const P = 4;
    expect(at(1)).toBeCloseTo(2 * (P - 1) * 8e-6 + (2 * ((P - 1) / P) * GiB) / 12.5e9, 12);
    // 8 ranks a node: the node's 8 NIC shares (100 GB/s) carry the ring, NVLink is faster still
    const P32 = 32;
    expect(at(8)).toBeCloseTo(2 * (P32 - 1) * 8e-6 + (2 * ((P32 - 1) / P32) * GiB) / 100e9, 12);
    // never faster than NVLink: 32 NIC shares would be 400 GB/s
    const wide = groupCollectiveSeconds(
      'all_gather',
      { size: 64, nodes: 2, local: 32 },
      GiB,
      links,
    );
    expect(wide).toBeCloseTo(63 * 8e-6 + ((63 / 64) * GiB) / 200e9, 12);
  });
  it('an all-to-all sends its off-node blocks over the NIC share, the others over NVLink', () => {
    // ranks 0, 4, 8, 12 with 8 a node: 2 on each node
    const t = groupCollectiveSeconds('all_to_all_v', { size: 4, nodes: 2, local: 2 }, GiB, links);
    expect(t).toBeCloseTo(3 * 8e-6 + Math.max(GiB / 4 / 200e9, GiB / 2 / 12.5e9), 12);
    // every peer off the node: the flat inter-node figure
    const apart = groupCollectiveSeconds(
      'all_to_all_v',
      { size: 4, nodes: 4, local: 1 },
      GiB,
      links,
    );
    expect(apart).toBeCloseTo(collectiveSeconds('all_to_all_v', 4, GiB, links.interNode), 12);
  });
  it('a send to another node crosses one NIC share', () => {
    const t = groupCollectiveSeconds('send', { size: 2, nodes: 2, local: 1 }, GiB, links);
    expect(t).toBeCloseTo(8e-6 + GiB / 12.5e9, 12);
  });
});

describe('instruction costs', () => {
  const result = compile({ model: 'tiny-vlm', microBatchSize: 1, globalBatchSize: 1 });
  const [program] = result.programs;
  const sizes = expectedSizes(result.plan, result.programs);
  const costs = instructionCosts(program, h800, sizes, () => oneNode(1));

  it('a linear: launch + max(2·m·n·k at the efficiency its size reaches, bytes at bandwidth)', () => {
    const i = program.instructions.findIndex(
      (x) => x.op === 'linear' && x.phase === 'forward' && x.scope.startsWith('model.layers.'),
    );
    const x = program.instructions[i];
    const dims = (id: number) =>
      program.buffers[id].shape.map((d) => (d === 'S' ? sizes.get('S')! : Number(d)));
    expect(dims(x.inputs[0]).every(Number.isInteger)).toBe(true);
    const [m, k] = dims(x.inputs[0]);
    const [n] = dims(x.inputs[1]);
    const flops = 2 * m * n * k;
    const c = h800.compute;
    const e = h800.efficiency!;
    // whole tiles of the m × n output, in whole waves over the SMs, at the best tile size and
    // split of k (into parts at least split_k deep, at most 16)
    const splits = Array.from(
      { length: Math.max(1, Math.min(16, Math.floor(k / e.gemmSplitK))) },
      (_, i) => i + 1,
    );
    const quantization = Math.max(
      ...e.gemmTiles.flatMap(([rows, cols]) => {
        const blocks = Math.ceil(m / rows) * Math.ceil(n / cols);
        return splits.map(
          (s) =>
            ((m * n) / (blocks * rows * cols)) *
            ((blocks * s) / (Math.ceil((blocks * s) / e.sms) * e.sms)),
        );
      }),
    );
    expect(e.gemmSplitK).toBeGreaterThan(0);
    // the FLOPs at the quantized efficiency, plus a fixed half_gflop's worth at the full one,
    // all at k / (k + k_half) of it
    const peak = c.matmulTflops * 1e12 * c.matmulEfficiency * (k / (k + e.gemmKHalf));
    const math = flops / (peak * quantization) + (c.matmulHalfGflop * 1e9) / peak;
    const bytes =
      c.dtypeBytes *
      [...x.inputs, ...x.outputs].reduce((a, id) => a + dims(id).reduce((p, d) => p * d, 1), 0);
    const want =
      c.launchUs * 1e-6 + Math.max(math, bytes / (c.memoryGbps * 1e9 * c.memoryEfficiency));
    expect(quantization).toBeLessThan(1);
    expect(costs[i]).toBeCloseTo(want, 15);
    // a tiny GEMM costs about a tile's time: microseconds, not the milliseconds that scaling
    // its fixed cost by the tiles it wastes would give
    expect(math).toBeLessThan(20e-6);
  });

  it('every instruction costs a finite, non-negative time; kernels at least the launch', () => {
    program.instructions.forEach((x, i) => {
      expect(Number.isFinite(costs[i])).toBe(true);
      if (x.op !== 'reshape') expect(costs[i]).toBeGreaterThanOrEqual(h800.compute.launchUs * 1e-6);
    });
  });

  it("an expert dispatch's received rows at their bound over the group (balanced routing)", () => {
    const moe = compile({
      model: 'tiny-vlm-moe',
      nprocPerNode: 2,
      parallel: { ep: 2 },
      microBatchSize: 1,
      globalBatchSize: 2,
    } as CompileOptions);
    const s = expectedSizes(moe.plan, moe.programs);
    const rx = moe.plan.symbols.filter((x) => /^Rx\d+$/.test(x.name));
    expect(rx.length).toBeGreaterThan(0);
    for (const x of rx) expect(s.get(x.name)).toBe(Math.ceil(x.bound / 2));
    expect(s.get('S')).toBe(moe.plan.symbols.find((x) => x.name === 'S')!.bound);
  });

  it("MFU's model FLOPs are the model's, whatever the layout, at the expected visual tokens", () => {
    const flops = (parallel: CompileOptions['parallel']) =>
      compile({
        model: 'tiny-vlm-moe',
        nprocPerNode: 4,
        parallel,
        microBatchSize: 1,
        globalBatchSize: 4,
        skipVerify: true,
      });
    const one = flops({});
    for (const p of [{ tp: 2 }, { pp: 2 }, { ep: 2 }, { tp: 2, ep: 2 }, { ep: 4 }])
      expect(flops(p).modelForwardFlops).toBe(one.modelForwardFlops);
    const Nv = one.data.sizes.expected.visualTokens;
    expect(Nv).toBeLessThan(one.data.sizes.bound.visualTokens);
    expect(one.modelForwardFlops).toBeCloseTo(microbatchForwardFlops(one.graph, { Nv }), 0);
  });

  it('a micro-batch of several sequences attends within each: its FLOPs scale with the micro-batch', () => {
    const at = (microBatchSize: number) =>
      compile({
        model: 'tiny-vlm-moe',
        microBatchSize,
        globalBatchSize: 2 * microBatchSize,
        skipVerify: true,
      });
    const [one, two] = [at(1), at(2)];
    const seq = one.plan.training.seqLength;
    const attention = two.graph.nodes.filter(
      (n) => n.op === 'attention' && n.scope.startsWith('model.layers.'),
    );
    expect(attention.length).toBeGreaterThan(0);
    for (const n of attention) expect(n.attrs.max_segment).toBe(seq);
    // text only: twice the sequences, twice the FLOPs (not the attention of one of twice the length)
    expect(microbatchForwardFlops(two.graph, { Nv: 0 })).toBeCloseTo(
      2 * microbatchForwardFlops(one.graph, { Nv: 0 }),
      0,
    );
  });

  it('model FLOPs per microbatch: lfc inspect per text token × S + per image × the images Nv holds', async () => {
    const inspect = await cli('inspect', 'tiny-vlm', '--image-size', '32', '--json');
    const f = (
      JSON.parse(inspect.out) as {
        flops: { perTextToken: number; perImage: number; image: { visualTokens: number } };
      }
    ).flops;
    const S = result.plan.training.seqLength;
    const images = result.plan.training.maxVisualTokens / f.image.visualTokens;
    expect(Number.isInteger(images)).toBe(true);
    // inspect's figures are training FLOPs (3 × forward); one image is one attention segment, and
    // a text token attends over the whole sequence, where the plan's decoder attention is priced
    // within the data profile's samples (expected_segment): compared without that
    const whole = {
      ...result.graph,
      nodes: result.graph.nodes.map((n) => {
        if (n.op !== 'attention' || n.attrs.expected_segment === undefined) return n;
        const { expected_segment: _, ...attrs } = n.attrs;
        return { ...n, attrs };
      }),
    };
    expect(microbatchForwardFlops(whole)).toBeCloseTo(
      (f.perTextToken * S + f.perImage * images) / 3,
      0,
    );
    expect(microbatchForwardFlops(result.graph)).toBeLessThan(microbatchForwardFlops(whole));
  });
});

describe('efficiency curves (a GPU profile)', () => {
  const a100 = loadHardware('a100');
  const e = a100.efficiency!;
  const gemm = (m: number, n: number, k: number, groups = 1) =>
    ({ kind: 'gemm', m, n, k, groups }) as const;
  const T = 128;
  const square = { gemmTiles: [[T, T]] as [number, number][], sms: 108, groupedStreams: 4 };
  it('a GEMM of whole tiles in whole waves loses nothing to quantization', () => {
    // sms × 4 blocks: four whole waves
    expect(gemmQuantization(gemm(T * square.sms, 4 * T, 4096), square)).toBe(1);
    // one row past a tile: a second row of tiles, nearly empty
    const m = T + 1;
    const blocks = 2 * 4;
    expect(gemmQuantization(gemm(m, 4 * T, 4096), square)).toBeCloseTo(
      ((m * 4 * T) / (blocks * T * T)) * (blocks / square.sms),
      12,
    );
  });
  it('the tile size that wastes least is taken', () => {
    const both = {
      ...square,
      gemmTiles: [
        [2 * T, T],
        [T, T],
      ] as [number, number][],
    };
    // 128 rows: a 256-row tile is half empty, a 128-row one full
    const g = gemm(T, 27 * T * 4, 4096);
    expect(gemmQuantization(g, both)).toBe(gemmQuantization(g, square));
    expect(gemmQuantization(g, { ...square, gemmTiles: [[2 * T, T]] })).toBeLessThan(
      gemmQuantization(g, square),
    );
  });
  it("a grouped GEMM's experts run grouped_streams at a time, sharing the waves", () => {
    const one = gemmQuantization(gemm(T, T, 4096, 1), square);
    expect(one).toBeCloseTo(1 / square.sms, 12);
    // 64 experts of one tile each, 4 at once: each wave has 4 of the 108 SMs busy
    expect(gemmQuantization(gemm(T, T, 4096, 64), square)).toBeCloseTo(4 / square.sms, 12);
    expect(gemmQuantization(gemm(T, T, 4096, 108), { ...square, groupedStreams: 108 })).toBe(1);
  });
  it('split-K: a small output with a long k is split to fill the waves, each part split_k deep', () => {
    // one block of output: 108 SMs, k 4096 in parts of at least 512: at most 8 parts, 8 SMs busy
    const g = gemm(T, T, 4096);
    expect(gemmQuantization(g, { ...square, gemmSplitK: 512 })).toBeCloseTo(8 / square.sms, 12);
    expect(gemmQuantization(g, { ...square, gemmSplitK: 0 })).toBeCloseTo(1 / square.sms, 12);
    // never more than 16 parts
    expect(gemmQuantization(g, { ...square, gemmSplitK: 1 })).toBeCloseTo(16 / square.sms, 12);
    // 80 blocks: 1 part fills 80 of 108 SMs; 4 parts fill 320 of 324 (three whole waves)
    const wide = gemm(8 * T, 10 * T, 8192);
    expect(gemmQuantization(wide, { ...square, gemmSplitK: 512 })).toBeCloseTo(320 / 324, 12);
  });
  it('k_half: a short k reaches k / (k + k_half) of the efficiency; a grouped GEMM pays its fixed cost each round', () => {
    const base = { ...a100, efficiency: { ...e, gemmKHalf: 0, gemmSplitK: 0 } };
    const withK = { ...a100, efficiency: { ...e, gemmKHalf: 64, gemmSplitK: 0 } };
    const big = gemm(8192, 8192, 192);
    expect(matmulEfficiency(2 * 8192 * 8192 * 192, withK, big)).toBeCloseTo(
      (matmulEfficiency(2 * 8192 * 8192 * 192, base, big) * 192) / 256,
      12,
    );
    // 32 experts, 4 at a time: 8 rounds of the fixed half_gflop cost, seconds at the peak
    const c = a100.compute;
    const peak = c.matmulTflops * 1e12 * c.matmulEfficiency;
    const g = gemm(4096, 4096, 4096, 32);
    const f = 2 * 4096 * 4096 * 4096 * 32;
    const q = gemmQuantization(g, e);
    expect(f / (c.matmulTflops * 1e12 * matmulEfficiency(f, base, g))).toBeCloseTo(
      f / (peak * q) + (8 * c.matmulHalfGflop * 1e9) / peak,
      12,
    );
  });
  it('flash attention: its peak by pass, by segment length, head dims padded up', () => {
    const att = (backward: boolean, segment: number, headDim: number) => ({
      kind: 'attention' as const,
      backward,
      causal: true,
      tokens: 32768,
      heads: 32,
      headDim,
      segment,
    });
    const h = e.attention.halfSegment;
    expect(matmulEfficiency(1e12, a100, att(false, h, 128))).toBeCloseTo(
      e.attention.forward / 2,
      12,
    );
    expect(matmulEfficiency(1e12, a100, att(true, h, 128))).toBeCloseTo(
      e.attention.backward / 2,
      12,
    );
    // a head dim between multiples computes the padded one: 72 as 96 at a multiple of 32
    const m = e.attention.headDimMultiple;
    const d = m * 2 + m / 4;
    expect(
      matmulEfficiency(1e12, a100, att(false, 8192, d)) /
        matmulEfficiency(1e12, a100, att(false, 8192, m * 3)),
    ).toBeCloseTo(d / (m * 3), 12);
  });
  it("a direct exchange runs at the profile's all-to-all share of each link", () => {
    const g = { size: 4, nodes: 2, local: 2 };
    const at = (share: number) => groupCollectiveSeconds('all_to_all_v', g, GiB, a100.links, share);
    const latency = 3 * a100.links.interNode.latencyUs * 1e-6;
    expect(at(0.5) - latency).toBeCloseTo(2 * (at(1) - latency), 12);
    // rings keep the link's bandwidth
    expect(groupCollectiveSeconds('all_reduce', g, GiB, a100.links, 0.5)).toBe(
      groupCollectiveSeconds('all_reduce', g, GiB, a100.links),
    );
  });
  it('each family scales on its own (lfc tune --sensitivity)', () => {
    const slower = scaleEfficiency(a100, 'gemm', 0.8);
    expect(slower.compute.matmulEfficiency).toBeCloseTo(0.8 * a100.compute.matmulEfficiency, 12);
    expect(slower.efficiency).toEqual(a100.efficiency);
    const faster = scaleEfficiency(a100, 'network', 1.2);
    // never past the link's peak
    expect(faster.links.interNode.gbps).toBeLessThanOrEqual(a100.links.interNode.peakGbps!);
    expect(faster.links.interNode.gbps).toBeGreaterThan(a100.links.interNode.gbps);
    const a2a = scaleEfficiency(a100, 'all-to-all', 0.8);
    expect(a2a.efficiency!.allToAll).toBeCloseTo(0.8 * e.allToAll, 12);
  });
});

describe('hardware profiles', () => {
  it("ships h800, h100, a100, a800 (the article's) and h200, each loading", () => {
    expect(listHardware()).toEqual(
      expect.arrayContaining(['a100', 'a800', 'h100', 'h200', 'h800']),
    );
    for (const name of listHardware()) expect(loadHardware(name).name).toBe(name);
    // the A800 is an A100 with NVLink cut to 400 GB/s; the H200 an H100 with more, faster HBM
    const [a100, a800, h200] = ['a100', 'a800', 'h200'].map((n) => loadHardware(n));
    expect(a800.compute.matmulTflops).toBe(a100.compute.matmulTflops);
    expect(a800.links.intraNode.gbps).toBeLessThan(a100.links.intraNode.gbps);
    expect([h200.memoryGiB, h200.compute.memoryGbps]).toEqual([140, 4800]);
  });
  it.each([
    [
      'an unknown name, with the nearest',
      'h80',
      /--hardware h80: no such profile \(did you mean 'h800'\?\)/,
    ],
    ['a missing file', '/nonexistent/x.yaml', /no such file/],
  ])('refuses %s', (_what, arg, message) => {
    expect(() => loadHardware(arg)).toThrow(message);
  });
  it('names the missing or bad key and the file', () => {
    const text = readFileSync(loadHardware('h800').path, 'utf8');
    const bad = join(tmpdir(), 'bad-hw.yaml');
    writeFileSync(bad, text.replace(/matmul_tflops: \d+/, 'matmul_tflops: -1'));
    expect(() => loadHardware(bad)).toThrow(
      /bad-hw\.yaml: compute\.matmul_tflops must be a number/,
    );
    writeFileSync(bad, text.replace(/ {2}inter_node:.*\n/, ''));
    expect(() => loadHardware(bad)).toThrow(/bad-hw\.yaml: links\.inter_node is missing/);
    writeFileSync(
      bad,
      text.replace(/inter_node: \{ gbps: (\d+)/, 'inter_node: { gbps: $1, efficiency: 1.2'),
    );
    expect(() => loadHardware(bad)).toThrow(
      /bad-hw\.yaml: links\.inter_node\.efficiency must be a number in \(0, 1\]/,
    );
    writeFileSync(bad, text.replace(/\nefficiency:[^]*?\n(?=[a-z])/, '\n'));
    expect(() => loadHardware(bad)).toThrow(/bad-hw\.yaml: efficiency is missing/);
    writeFileSync(
      bad,
      text.replace(
        / {2}attention:\n(?: {4}.*\n)+/,
        '  attention: { forward: 0.5, backward: 0.4 }\n',
      ),
    );
    expect(() => loadHardware(bad)).toThrow(
      /bad-hw\.yaml: efficiency\.attention lists its figures by kernel: write default: <kernel>/,
    );
    writeFileSync(bad, text.replace(/^host: .*$/m, 'host: { op_us: -40, grouped_gemm_us: 8 }'));
    expect(() => loadHardware(bad)).toThrow(/bad-hw\.yaml: host\.op_us must be a number/);
    writeFileSync(bad, text.replace(/^host: .*$/m, 'host: { op_us: 40 }'));
    expect(() => loadHardware(bad)).toThrow(/bad-hw\.yaml: host\.grouped_gemm_us is missing/);
    writeFileSync(bad, text.replace(/default: flash3/, 'default: flash9'));
    expect(() => loadHardware(bad)).toThrow(
      /bad-hw\.yaml: efficiency\.attention\.default must name one of its kernels \(flash3, flash2, cudnn\), got "flash9"/,
    );
    writeFileSync(bad, text.replace(/(flash2: \{ forward: )[\d.]+/, '$11.5'));
    expect(() => loadHardware(bad)).toThrow(
      /bad-hw\.yaml: efficiency\.attention\.flash2\.forward must be a number in \(0, 1\]/,
    );
    writeFileSync(bad, text.replace(/sms: \d+/, 'sms: 1.5'));
    expect(() => loadHardware(bad)).toThrow(
      /bad-hw\.yaml: efficiency\.gemm\.sms must be an integer/,
    );
  });
  it('prices attention as the chosen kernel runs it, the default unless --attention-kernel', () => {
    const h100 = loadHardware('h100');
    const e = h100.efficiency!;
    expect(e.attentionKernel).toBe('flash3');
    expect(Object.keys(e.attentionKernels)).toEqual(['flash3', 'flash2', 'cudnn']);
    const att = (backward: boolean) => ({
      kind: 'attention' as const,
      backward,
      causal: true,
      tokens: 8192,
      heads: 32,
      headDim: 128,
      segment: 8192,
    });
    for (const kernel of ['flash3', 'flash2', 'cudnn']) {
      const hw = loadHardware('h100', kernel);
      const f = e.attentionKernels[kernel];
      expect(hw.efficiency!.attentionKernel).toBe(kernel);
      // the kernel's own figures, by the header's curve: peak × L / (L + half)
      expect(matmulEfficiency(1e12, hw, att(false))).toBeCloseTo(
        (f.forward * 8192) / (8192 + f.halfSegment),
        12,
      );
      expect(matmulEfficiency(1e12, hw, att(true))).toBeCloseTo(
        (f.backward * 8192) / (8192 + f.halfSegment),
        12,
      );
      // GEMMs are the kernel's business alone
      expect(hw.compute).toEqual(h100.compute);
    }
    // FlashAttention-2 on Hopper runs at about half of FlashAttention-3 (arXiv 2407.08608)
    const fa2 = matmulEfficiency(1e12, loadHardware('h100', 'flash2'), att(false));
    expect(fa2 / matmulEfficiency(1e12, h100, att(false))).toBeGreaterThan(0.45);
    expect(fa2 / matmulEfficiency(1e12, h100, att(false))).toBeLessThan(0.6);
  });
  it.each([
    [
      'h100',
      'flash',
      /--attention-kernel flash: h100 has no figures for it \(did you mean 'flash3'\?\) \(its kernels: flash3, flash2, cudnn;/,
    ],
    [
      'a800',
      'flash3',
      /--attention-kernel flash3: a800 has no figures for it .*\(its kernels: flash2;/,
    ],
    // a name every object has is no kernel either
    ['a800', 'constructor', /--attention-kernel constructor: a800 has no figures for it/],
  ])('refuses an attention kernel the profile has no figures for: %s %s', (hw, kernel, message) => {
    expect(() => loadHardware(hw, kernel)).toThrow(message);
  });
  it("a link's efficiency scales its peak: what collectives reach (a100, a800: measured on A100)", () => {
    const text = readFileSync(loadHardware('h800').path, 'utf8');
    const half = join(tmpdir(), 'half-hw.yaml');
    writeFileSync(
      half,
      text.replace(/inter_node: \{ gbps: (\d+)/, 'inter_node: { gbps: $1, efficiency: 0.5'),
    );
    const [base, slowed] = [h800, loadHardware(half)];
    expect(slowed.links.interNode.gbps).toBe(base.links.interNode.gbps / 2);
    expect(slowed.links.interNode.peakGbps).toBe(base.links.interNode.gbps);
    for (const name of ['a100', 'a800']) {
      const { intraNode, interNode } = loadHardware(name).links;
      expect(intraNode.gbps / intraNode.peakGbps!).toBeCloseTo(0.775, 6);
      expect(interNode.gbps / interNode.peakGbps!).toBeCloseTo(0.896, 6);
    }
  });
});

describe('lfc compile: the simulated step', () => {
  const out = join(tmpdir(), 'sim-report');
  const flags = ['--nproc-per-node', '2', '--pp', '2', '--global-batch-size', '4', '-o', out];
  it('reports step time, tokens/s, MFU and each program’s split', async () => {
    const r = await cli('compile', 'tiny-vlm-moe', ...flags);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(
      /simulated on h800 \(attention: flash3\): step [\d.]+ ms, [\d.]+k tokens\/s, MFU [\d.]+%/,
    );
    expect(r.out).toMatch(
      /p0 \(rank 0\): compute [\d.]+%, exposed communication [\d.]+%( \(\w+ [\d.]+%(, \w+ [\d.]+%)*\))?, idle [\d.]+%/,
    );
    expect(r.out).toMatch(/p1 \(rank 1\): compute/);
    // a model this small waits for the framework's host on a GPU (h800 prices it)
    expect(r.out).toMatch(/idle [\d.]+% \(waiting for the host [\d.]+%\)/);
  });
  it('--hardware a100 is slower than h100 for the same plan; --json carries the forecast', async () => {
    const step = async (hw: string) => {
      const r = await cli(
        'compile',
        'tiny-vlm-moe',
        ...flags,
        '--hardware',
        gpuSideProfile(hw),
        '--json',
      );
      return (JSON.parse(r.out) as { forecast: { stepSeconds: number; mfu: number } }).forecast;
    };
    const [a, h] = [await step('a100'), await step('h100')];
    expect(a.stepSeconds).toBeGreaterThan(h.stepSeconds);
    expect(a.mfu).toBeGreaterThan(0);
  });
  it('--attention-kernel prices the step with that kernel: flash2 is slower on Hopper', async () => {
    const compiled = async (...more: string[]) => {
      const r = await cli(
        'compile',
        'tiny-vlm-moe',
        ...flags,
        '--hardware',
        gpuSideProfile('h100'),
        ...more,
        '--json',
      );
      expect(r.code).toBe(0);
      return JSON.parse(r.out) as {
        forecast: { stepSeconds: number; attentionKernel: string };
        stats: unknown;
      };
    };
    const [fa3, fa2] = [await compiled(), await compiled('--attention-kernel', 'flash2')];
    expect([fa3.forecast.attentionKernel, fa2.forecast.attentionKernel]).toEqual([
      'flash3',
      'flash2',
    ]);
    expect(fa2.forecast.stepSeconds).toBeGreaterThan(fa3.forecast.stepSeconds);
    const bad = await cli(
      'compile',
      'tiny-vlm-moe',
      ...flags,
      '--hardware',
      'a800',
      '--attention-kernel',
      'flash3',
    );
    expect(bad.code).toBe(2);
    expect(bad.err).toMatch(
      /--attention-kernel flash3: a800 has no figures for it .*its kernels: flash2/,
    );
    expect(bad.err).not.toMatch(/\n\s+at /);
  });
  it('--trace writes the predicted timeline: the first rank of each program', async () => {
    const trace = join(out, 'predicted.json');
    const r = await cli('compile', 'tiny-vlm-moe', ...flags, '--trace', trace);
    expect(r.out).toMatch(/trace: .*predicted\.json \(simulated\)/);
    const events = (
      JSON.parse(readFileSync(trace, 'utf8')) as { traceEvents: { ph: string; pid: number }[] }
    ).traceEvents.filter((e) => e.ph === 'X');
    expect(new Set(events.map((e) => e.pid))).toEqual(new Set([0, 1]));
  });
  it('--no-simulate drops it; --hardware bogus is a user error', async () => {
    const r = await cli('compile', 'tiny-vlm-moe', ...flags, '--no-simulate');
    expect(r.out).not.toMatch(/simulated on/);
    const bad = await cli('compile', 'tiny-vlm-moe', ...flags, '--hardware', 'h80');
    expect(bad.code).toBe(2);
    expect(bad.err).toMatch(/did you mean 'h800'/);
  });
});

describe('element sizes', () => {
  // AdamW reads and writes fp32 master weights and moments: in a --bf16 plan they are f32 (4
  // bytes); in an f32 plan (the CPU runtime's precision) every buffer stands for the profile's
  // element size (2 on a bf16 GPU profile)
  it.each([
    [true, 4],
    [false, 2],
  ])('bf16 %s: an adamw instruction moves its f32 buffers at %i bytes an element', (bf16, per) => {
    const r = compile({
      model: 'tiny-vlm',
      microBatchSize: 1,
      globalBatchSize: 2,
      precision: { bf16 },
    });
    const p = r.programs[0];
    const sizes = new Map(r.plan.symbols.map((s) => [s.name, s.bound]));
    const work = instructionWork(p, sizes, 2, 4);
    const i = p.instructions.findIndex((x) => x.op === 'adamw');
    const x = p.instructions[i];
    const ids = [...x.inputs, ...x.outputs];
    expect(ids.every((id) => p.buffers[id].dtype === 'f32' || p.buffers[id].dtype === 'bf16')).toBe(
      true,
    );
    const elems = (id: number) =>
      p.buffers[id].shape.reduce((a, d) => a * Number(sizes.get(d) ?? d), 1);
    const want = ids.reduce(
      (a, id) => a + elems(id) * (p.buffers[id].dtype === 'f32' ? per : 2),
      0,
    );
    expect(work[i].bytes).toBe(want);
  });
});
