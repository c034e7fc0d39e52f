// Pipeline costs and layer partitioning. Costs: per-layer FLOPs against formulas written out from
// the model shapes, and the pieces against `lfc inspect`'s total. Partitioning: the most
// expensive virtual stage against an exhaustive search over every contiguous split (the brute
// force below), on three presets with the encoder on stage 0 and off; Megatron's first/last-stage
// overrides against layouts written by hand; the per-stage description as text. The priced split:
// its weights against the simulator's cost model of the emitted programs, its balance against
// the exhaustive search.
import { describe, expect, it } from 'vitest';
import { UserError } from '../../compiler/errors.js';
import { forwardFlops } from '../../compiler/inspect.js';
import {
  costSite,
  forwardCosts,
  preFlops,
  type ForwardCosts,
} from '../../compiler/schedule/costs.js';
import {
  describeLayout,
  partitionPipeline,
  splitMinMax,
  type PipelineLayout,
} from '../../compiler/schedule/partition.js';
import { compile } from '../../compiler/pipeline.js';
import { buildTopology } from '../../compiler/parallel/topology.js';
import { pricedStageWeights } from '../../compiler/schedule/priced.js';
import { expectedSizes, instructionCosts, oneNode } from '../../compiler/sim/cost.js';
import { loadHardware } from '../../compiler/sim/hardware.js';
import { MODULES } from '../../ir/graph.js';
import { presetGraph } from '../helpers.js';

/**
 * The least possible cost of the most expensive part over every split of `weights` into `parts`
 * contiguous non-empty parts, part 0 also costing `pre` and the last part `post`: tries them all.
 */
function bruteForceMax(weights: readonly number[], parts: number, pre: number, post: number) {
  const L = weights.length;
  let best = Infinity;
  const walk = (part: number, start: number, worst: number) => {
    if (part === parts - 1) {
      let c = post + (part === 0 ? pre : 0);
      for (let i = start; i < L; i++) c += weights[i];
      best = Math.min(best, Math.max(worst, c));
      return;
    }
    let c = part === 0 ? pre : 0;
    // part holds weights start … end−1, leaving one weight for each later part
    for (let end = start + 1; end <= L - (parts - 1 - part); end++) {
      c += weights[end - 1];
      walk(part + 1, end, Math.max(worst, c));
    }
  };
  walk(0, 0, 0);
  return best;
}

const closeTo = (a: number, b: number) => Math.abs(a - b) <= 1e-9 * Math.max(a, b);

/** the layout's own numbers re-derived from its layer counts */
function checkLayout(layout: PipelineLayout, c: ForwardCosts): void {
  const K = layout.pp * layout.vpp;
  const counts = layout.virtualStageLayers;
  expect(counts).toHaveLength(K);
  // only an end the embedding or the loss fills may hold no layer
  expect(counts.every((n, s) => Number.isInteger(n) && n >= (s === 0 || s === K - 1 ? 0 : 1))).toBe(
    true,
  );
  expect(counts.reduce((a, b) => a + b, 0)).toBe(c.layerFlops.length);
  let first = 0;
  counts.forEach((n, s) => {
    expect(layout.virtualStageFirstLayer[s]).toBe(first);
    let flops =
      (s === 0 ? preFlops(c, layout.encoderOnStage0) : 0) + (s === K - 1 ? c.postFlops : 0);
    for (let i = first; i < first + n; i++) flops += c.layerFlops[i];
    expect(closeTo(layout.virtualStageFlops[s], flops)).toBe(true);
    first += n;
  });
  expect(layout.maxVirtualStageFlops).toBe(Math.max(...layout.virtualStageFlops));
}

describe('costs', () => {
  it('a dense layer of qwen2.5-vl-7b: q, k, v, o, causal attention and the SwiGLU MLP', () => {
    const c = forwardCosts(presetGraph('qwen2.5-vl-7b'));
    const [S, h, heads, kv, d, ffn, vocab] = [4096, 3584, 28, 4, 128, 18944, 152064];
    const layer =
      2 * S * h * (heads * d) + // q_proj
      2 * 2 * S * h * (kv * d) + // k_proj, v_proj
      (4 * S * S * heads * d) / 2 + // attention, causal
      2 * S * (heads * d) * h + // o_proj
      3 * 2 * S * h * ffn; // gate, up, down
    expect(c.sizes).toEqual({ S, Nv: S });
    expect(c.layerFlops).toHaveLength(28);
    for (const f of c.layerFlops) expect(f).toBe(layer);
    expect(c.embedFlops).toBe(0); // lookups, no matmul
    expect(c.postFlops).toBe(2 * S * h * vocab); // lm_head
  });

  it('an MoE layer of qwen3-vl-30b-a3b: router and top-8 of 128 experts', () => {
    const c = forwardCosts(presetGraph('qwen3-vl-30b-a3b'));
    const [S, h, heads, kv, d, experts, k, f] = [32768, 2048, 32, 4, 128, 128, 8, 768];
    const layer =
      2 * S * h * (heads * d) +
      2 * 2 * S * h * (kv * d) +
      (4 * S * S * heads * d) / 2 +
      2 * S * (heads * d) * h +
      2 * S * h * experts + // router
      3 * 2 * (S * k) * h * f; // each token through k experts
    expect(c.layerFlops).toHaveLength(48);
    for (const x of c.layerFlops) expect(x).toBe(layer);
  });

  it('the pieces add up to the forward FLOPs of the whole graph, at any S and Nv', () => {
    for (const [preset, S, Nv] of [
      ['tiny-vlm-moe', 128, 128],
      ['tiny-vlm-moe', 96, 0],
      ['qwen2.5-vl-7b', 4096, 1024],
      ['qwen3-vl-30b-a3b', 32768, 2048],
    ] as const) {
      const g = presetGraph(preset);
      const c = forwardCosts(g, { S, Nv });
      const sum =
        c.layerFlops.reduce((a, b) => a + b, 0) + c.embedFlops + c.encoderFlops + c.postFlops;
      expect(closeTo(sum, forwardFlops(g, MODULES, { S, Nv })), preset).toBe(true);
      expect(c.encoderFlops, preset).toBe(
        forwardFlops(g, ['image_encoder', 'image_projector'], { S, Nv }),
      );
    }
  });

  it('the encoder follows the expected visual tokens, the decoder layers do not', () => {
    const g = presetGraph('qwen2.5-vl-7b');
    const full = forwardCosts(g);
    const few = forwardCosts(g, { Nv: 256 });
    const none = forwardCosts(g, { Nv: 0 });
    expect(few.layerFlops).toEqual(full.layerFlops);
    expect(none.encoderFlops).toBe(0);
    expect(few.encoderFlops).toBeGreaterThan(0);
    expect(few.encoderFlops).toBeLessThan(full.encoderFlops);
    expect(preFlops(few, true)).toBe(few.embedFlops + few.encoderFlops);
    expect(preFlops(few, false)).toBe(few.embedFlops);
  });

  it('sizes beyond the graph bounds are refused', () => {
    const g = presetGraph('tiny-vlm-moe');
    expect(() => forwardCosts(g, { Nv: 129 })).toThrow(UserError);
    expect(() => forwardCosts(g, { Nv: 129 })).toThrow(
      'schedule costs: visual tokens per microbatch Nv 129 must lie in 0…128',
    );
    expect(() => forwardCosts(g, { S: 0 })).toThrow(
      'schedule costs: tokens per microbatch S 0 must lie in 1…128',
    );
  });
});

describe('balanced partition equals the exhaustive search', () => {
  // Nv: the bound (every token visual: the encoder dominates) and a light image load
  const cases: [preset: string, Nv: number[], layouts: [number, number][]][] = [
    [
      'tiny-vlm-moe',
      [128, 16],
      [
        [1, 1],
        [2, 1],
        [2, 2],
        [4, 1],
      ],
    ],
    [
      'qwen2.5-vl-7b',
      [4096, 256],
      [
        [2, 1],
        [2, 2],
        [4, 1],
        [4, 2],
      ],
    ],
    [
      'qwen3-vl-30b-a3b',
      [32768, 1024],
      [
        [2, 1],
        [2, 2],
        [4, 1],
      ],
    ],
  ];
  for (const [preset, nvs, layouts] of cases) {
    for (const Nv of nvs) {
      for (const [pp, vpp] of layouts) {
        for (const encoderOnStage0 of [true, false]) {
          it(`${preset} Nv=${Nv} pp=${pp} vpp=${vpp} encoder ${encoderOnStage0 ? 'on stage 0' : 'separate'}`, () => {
            const c = forwardCosts(presetGraph(preset), { Nv });
            const layout = partitionPipeline(c, { pp, vpp, encoderOnStage0 });
            checkLayout(layout, c);
            expect(layout.method).toBe('balanced');
            const best = bruteForceMax(
              c.layerFlops,
              pp * vpp,
              preFlops(c, encoderOnStage0),
              c.postFlops,
            );
            expect(closeTo(layout.maxVirtualStageFlops, best)).toBe(true);
          });
        }
      }
    }
  }

  it('qwen3-vl-30b-a3b at pp=4 vpp=2, on layers grouped in pairs (24 weights, 8 parts)', () => {
    const c = forwardCosts(presetGraph('qwen3-vl-30b-a3b'), { Nv: 1024 });
    const pairs = Array.from(
      { length: 24 },
      (_, i) => c.layerFlops[2 * i] + c.layerFlops[2 * i + 1],
    );
    for (const encoderOnStage0 of [true, false]) {
      const pre = preFlops(c, encoderOnStage0);
      const counts = splitMinMax(pairs, 8, pre, c.postFlops);
      let at = 0;
      const costs = counts.map((n, k) => {
        let x = (k === 0 ? pre : 0) + (k === 7 ? c.postFlops : 0);
        for (let i = at; i < at + n; i++) x += pairs[i];
        at += n;
        return x;
      });
      expect(closeTo(Math.max(...costs), bruteForceMax(pairs, 8, pre, c.postFlops))).toBe(true);
    }
  });

  it('random uneven weights: the split is optimal and every part non-empty', () => {
    let seed = 11;
    const rand = (n: number) => (seed = (seed * 1103515245 + 12345) % 2 ** 31) % n;
    for (let trial = 0; trial < 1000; trial++) {
      const L = 1 + rand(10);
      const parts = 1 + rand(L);
      const weights = Array.from({ length: L }, () => rand(10));
      const [pre, post] = [rand(30), rand(30)];
      const counts = splitMinMax(weights, parts, pre, post);
      expect(counts).toHaveLength(parts);
      expect(counts.every((n) => n >= 1)).toBe(true);
      let at = 0;
      const costs = counts.map((n, k) => {
        let x = (k === 0 ? pre : 0) + (k === parts - 1 ? post : 0);
        for (let i = at; i < at + n; i++) x += weights[i];
        at += n;
        return x;
      });
      expect(at).toBe(L);
      expect(Math.max(...costs), JSON.stringify({ weights, parts, pre, post })).toBe(
        bruteForceMax(weights, parts, pre, post),
      );
    }
  });

  it('the maximum comes first, evenness second: [3,9,1,8,2,3,8] in 4 parts costs at most 11', () => {
    // the most even split by sum of squares alone, 3+9 | 1+8 | 2+3 | 8, peaks at 12
    expect(bruteForceMax([3, 9, 1, 8, 2, 3, 8], 4, 0, 0)).toBe(11);
    expect(splitMinMax([3, 9, 1, 8, 2, 3, 8], 4)).toEqual([1, 2, 2, 2]); // 3 | 10 | 10 | 11
  });

  it('among optimal splits, the most even one; ties give later parts the extra layers', () => {
    expect(splitMinMax([1, 1, 1, 1, 1, 1, 1, 1], 4)).toEqual([2, 2, 2, 2]);
    // the first part carries 3: it holds one layer, the other 7 spread as evenly as they can
    expect(splitMinMax([1, 1, 1, 1, 1, 1, 1, 1], 4, 3)).toEqual([1, 2, 2, 3]);
    expect(splitMinMax([1, 1, 1, 1, 1, 1, 1], 2)).toEqual([3, 4]);
  });
});

describe('first/last-stage overrides (Megatron: the rest evenly, each stage evenly over its chunks)', () => {
  const c = forwardCosts(presetGraph('qwen2.5-vl-7b')); // 28 layers

  it('first 4 and last 6 over pp=4: the middle stages take 9 each', () => {
    const layout = partitionPipeline(c, { pp: 4, firstStageLayers: 4, lastStageLayers: 6 });
    expect(layout.method).toBe('given');
    expect(layout.virtualStageLayers).toEqual([4, 9, 9, 6]);
    checkLayout(layout, c);
  });

  it('first 7 only over pp=4: the other three stages take 7 each', () => {
    expect(partitionPipeline(c, { pp: 4, firstStageLayers: 7 }).virtualStageLayers).toEqual([
      7, 7, 7, 7,
    ]);
  });

  it('with vpp=2, first 6 and last 6: chunks of 3, 4, 4, 3 in both rounds', () => {
    const layout = partitionPipeline(c, {
      pp: 4,
      vpp: 2,
      firstStageLayers: 6,
      lastStageLayers: 6,
      encoderOnStage0: false,
    });
    expect(layout.virtualStageLayers).toEqual([3, 4, 4, 3, 3, 4, 4, 3]);
    checkLayout(layout, c);
    expect(describeLayout(layout).map((line) => line.replace(/; forward .*/, ''))).toEqual([
      'stage 0: chunk 0 layers 0–2 (+embedding), chunk 1 layers 14–16',
      'stage 1: chunk 0 layers 3–6, chunk 1 layers 17–20',
      'stage 2: chunk 0 layers 7–10, chunk 1 layers 21–24',
      'stage 3: chunk 0 layers 11–13, chunk 1 layers 25–27 (+lm_head, loss)',
    ]);
  });

  it('overrides that cannot be honoured are refused with the rule and the numbers', () => {
    const refused = (opts: Parameters<typeof partitionPipeline>[1], msg: string) => {
      expect(() => partitionPipeline(c, opts)).toThrow(UserError);
      expect(() => partitionPipeline(c, opts)).toThrow(`invalid layout (pp-uneven-layers): ${msg}`);
    };
    refused(
      { pp: 4, vpp: 2, firstStageLayers: 5 },
      '--decoder-first-pipeline-num-layers 5 is not a multiple of 2 chunks per stage',
    );
    refused(
      { pp: 4, firstStageLayers: 5, lastStageLayers: 6 },
      'the 17 layers left for 2 middle stages do not split evenly with at least one per chunk',
    );
    refused(
      { pp: 2, firstStageLayers: 10, lastStageLayers: 10 },
      'first 10 and last 10 stage layers do not add up to the 28 decoder layers',
    );
    refused(
      { pp: 1, lastStageLayers: 28 },
      '--decoder-last-pipeline-num-layers 28 needs pipeline parallelism (pipeline size is 1)',
    );
  });

  it('more virtual stages than layers are refused', () => {
    expect(() => partitionPipeline(c, { pp: 8, vpp: 4 })).toThrow(
      'invalid layout (pp-layers): 28 decoder layers cannot fill pp·vpp = 32 virtual stages (pipeline 8 × virtual 4); each needs at least one layer',
    );
  });
});

describe("the embedding and the loss counted as layers (Megatron's --account-for-*-in-pipeline-split)", () => {
  const c = forwardCosts(presetGraph('qwen2.5-vl-7b')); // 28 layers

  it('28 layers + embedding + loss over pp 6: five pieces each, the ends give one place up', () => {
    const layout = partitionPipeline(c, { pp: 6, accountForEmbedding: true, accountForLoss: true });
    expect(layout.method).toBe('given');
    expect(layout.virtualStageLayers).toEqual([4, 5, 5, 5, 5, 4]);
    checkLayout(layout, c);
  });

  it('30 pieces over pp 10 × vpp 3: the first chunk holds only the embedding, the last only the loss', () => {
    const layout = partitionPipeline(c, {
      pp: 10,
      vpp: 3,
      accountForEmbedding: true,
      accountForLoss: true,
      encoderOnStage0: false,
    });
    expect(layout.virtualStageLayers).toEqual([0, ...Array<number>(28).fill(1), 0]);
    checkLayout(layout, c);
    const lines = describeLayout(layout).map((line) => line.replace(/; forward .*/, ''));
    expect(lines[0]).toBe(
      'stage 0: chunk 0 no layer (+embedding), chunk 1 layer 9, chunk 2 layer 19',
    );
    expect(lines[9]).toBe(
      'stage 9: chunk 0 layer 8, chunk 1 layer 18, chunk 2 no layer (+lm_head, loss)',
    );
  });

  it('the loss alone: 29 pieces over pp 29 would leave the last stage empty of layers', () => {
    expect(partitionPipeline(c, { pp: 29, accountForLoss: true }).virtualStageLayers).toEqual([
      ...Array<number>(28).fill(1),
      0,
    ]);
  });

  it('pieces that do not divide, or the first/last counts besides, are refused with the rule', () => {
    expect(() => partitionPipeline(c, { pp: 4, accountForEmbedding: true })).toThrow(
      'invalid layout (pp-account-for): 28 decoder layers + the embedding = 29 pieces do not split evenly over pp·vpp = 4 virtual stages',
    );
    expect(() =>
      partitionPipeline(c, { pp: 2, accountForLoss: true, firstStageLayers: 14 }),
    ).toThrow(/\(pp-account-for\).*do not combine with --decoder-first-pipeline-num-layers/);
  });
});

describe('the priced partition (compile with a hardware profile)', () => {
  const hw = loadHardware('h800');
  const result = compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 4,
    parallel: { pp: 2, ep: 2 },
    globalBatchSize: 4,
    microBatchSize: 1,
    hardware: hw,
  });
  const weights = pricedStageWeights(result.graph, {
    hardware: hw,
    topology: buildTopology({ nnodes: 1, nprocPerNode: 4, tp: 1, pp: 2, vpp: 1, cp: 1, ep: 2 }),
    nprocPerNode: 4,
    encoderShare: 1,
  });
  it("each piece's weight is what the simulator's cost model gives its instructions, per microbatch", () => {
    // the emitted programs, priced instruction by instruction (compiler/sim/cost.ts), summed by
    // piece over the step's microbatches: another path to the same seconds
    const sizes = expectedSizes(result.plan, result.programs);
    const microbatches = result.plan.training.numMicrobatches;
    const per = new Map<string, number>();
    for (const p of result.programs) {
      const costs = instructionCosts(p, hw, sizes, (x) => oneNode(Number(x.attrs.group_size ?? 2)));
      p.instructions.forEach((x, i) => {
        if (x.phase === 'optimizer' || x.op === 'send' || x.op === 'recv') return;
        // the gradients' sums are emitted (compiler/emit/grad-sync.ts), no node of the graph
        if (x.scope === 'gradient_sync') return;
        const site = costSite(x.scope);
        const piece = typeof site === 'string' ? site : `layer ${site.layer}`;
        per.set(piece, (per.get(piece) ?? 0) + costs[i] / microbatches);
      });
    }
    weights.layer.forEach((w, i) => expect(w / per.get(`layer ${i}`)!).toBeCloseTo(1, 2));
    expect(weights.encoder / per.get('encoder')!).toBeCloseTo(1, 2);
    // the final norm, the head and the loss
    expect(weights.post / per.get('post')!).toBeCloseTo(1, 2);
  });
  it('balances them: the most expensive stage is the least any split allows', () => {
    expect(result.layout!.method).toBe('priced');
    const pre = weights.embed + weights.encoder;
    const stages = result.layout!.virtualStageLayers;
    const cost = (s: number) => {
      const first = stages.slice(0, s).reduce((a, b) => a + b, 0);
      const own = weights.layer.slice(first, first + stages[s]).reduce((a, b) => a + b, 0);
      return own + (s === 0 ? pre : 0) + (s === stages.length - 1 ? weights.post : 0);
    };
    const worst = Math.max(...stages.map((_, s) => cost(s)));
    expect(worst).toBeCloseTo(bruteForceMax(weights.layer, 2, pre, weights.post), 12);
  });
  it('without a profile, forward FLOPs', () => {
    const flops = compile({
      model: 'tiny-vlm-moe',
      nprocPerNode: 4,
      parallel: { pp: 2, ep: 2 },
      globalBatchSize: 4,
      microBatchSize: 1,
      skipVerify: true,
    });
    expect(flops.layout!.method).toBe('balanced');
  });
});

describe('layout description', () => {
  /** 8 layers of 1 TFLOP, an encoder of 2 and lm_head + loss of 1 */
  const costs: ForwardCosts = {
    sizes: { S: 1, Nv: 1 },
    layerFlops: new Array<number>(8).fill(1e12),
    embedFlops: 0,
    encoderFlops: 2e12,
    postFlops: 1e12,
  };

  it('pp=2 vpp=2 with the encoder on stage 0: virtual stages 1, 2, 3, 2 layers (3, 2, 3, 3 TFLOP)', () => {
    const layout = partitionPipeline(costs, { pp: 2, vpp: 2 });
    expect(layout.virtualStageLayers).toEqual([1, 2, 3, 2]);
    expect(layout.virtualStageFlops).toEqual([3e12, 2e12, 3e12, 3e12]);
    expect(describeLayout(layout)).toEqual([
      'stage 0: chunk 0 layer 0 (+embedding, encoder), chunk 1 layers 3–5; forward 6.00 TFLOP',
      'stage 1: chunk 0 layers 1–2, chunk 1 layers 6–7 (+lm_head, loss); forward 5.00 TFLOP',
    ]);
  });

  it('pp=2 under full separation: chunks are not named, the encoder is not on stage 0', () => {
    const layout = partitionPipeline(costs, { pp: 2, encoderOnStage0: false });
    expect(describeLayout(layout)).toEqual([
      'stage 0: layers 0–3 (+embedding); forward 4.00 TFLOP',
      'stage 1: layers 4–7 (+lm_head, loss); forward 5.00 TFLOP',
    ]);
  });
});
