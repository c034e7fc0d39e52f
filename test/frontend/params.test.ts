// Parameter counts of every preset against a hand count written here from the config numbers
// (reference/anchors.md, reference/tiny-vlm.md), independent of the builder.
import { describe, expect, it } from 'vitest';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import { countParams } from '../../compiler/inspect.js';
import { PRESETS, presetGraph } from '../helpers.js';

interface Vit {
  blocks: number;
  hidden: number;
  mlp: number;
  patchIn: number;
  patchBias: boolean;
  /** LayerNorm has weight and bias, RMSNorm a weight */
  layerNorm: boolean;
  swiglu: boolean;
  posParams: number;
}

function vitCount(v: Vit): number {
  const h = v.hidden;
  const normP = v.layerNorm ? 2 * h : h;
  const attn = h * 3 * h + 3 * h + h * h + h;
  const mlp = v.swiglu
    ? 2 * (h * v.mlp + v.mlp) + v.mlp * h + h
    : h * v.mlp + v.mlp + v.mlp * h + h;
  return v.patchIn * h + (v.patchBias ? h : 0) + v.posParams + v.blocks * (2 * normP + attn + mlp);
}

/** merger: norm over Hv (pre-shuffle) or 4·Hv (post-shuffle, deepstack), fc1 4Hv→4Hv, fc2 4Hv→Hd */
function mergerCount(hv: number, hd: number, layerNorm: boolean, postShuffle: boolean): number {
  const w = 4 * hv;
  const n = postShuffle ? w : hv;
  return (layerNorm ? 2 * n : n) + w * w + w + w * hd + hd;
}

interface Dec {
  layers: number;
  hidden: number;
  heads: number;
  kv: number;
  headDim: number;
  vocab: number;
  tied: boolean;
  qkvBias: boolean;
  qkNorm: boolean;
  ffn?: number;
  experts?: number;
  topk?: number;
  expertFfn?: number;
}

function decoderCount(d: Dec): { total: number; active: number } {
  const h = d.hidden;
  const q = d.heads * d.headDim;
  const kv = d.kv * d.headDim;
  const attn =
    h * q + 2 * h * kv + q * h + (d.qkvBias ? q + 2 * kv : 0) + (d.qkNorm ? 2 * d.headDim : 0);
  const norms = 2 * h;
  const embed = d.vocab * h * (d.tied ? 1 : 2);
  if (!d.experts) {
    const layer = attn + norms + 3 * h * d.ffn!;
    const total = embed + h + d.layers * layer;
    return { total, active: total };
  }
  const expert = 3 * h * d.expertFfn!;
  const router = d.experts * h;
  const total = embed + h + d.layers * (attn + norms + router + d.experts * expert);
  const active = embed + h + d.layers * (attn + norms + router + d.topk! * expert);
  return { total, active };
}

const TINY_VIT: Vit = {
  blocks: 2,
  hidden: 64,
  mlp: 256,
  patchIn: 48,
  patchBias: true,
  layerNorm: true,
  swiglu: false,
  posParams: 2 * 8 * 64,
};
const QWEN3_VIT: Vit = {
  blocks: 27,
  hidden: 1152,
  mlp: 4304,
  patchIn: 3 * 2 * 16 * 16,
  patchBias: true,
  layerNorm: true,
  swiglu: false,
  posParams: 2304 * 1152,
};
const qwen25Vit = (mlp: number): Vit => ({
  blocks: 32,
  hidden: 1280,
  mlp,
  patchIn: 3 * 2 * 14 * 14,
  patchBias: false,
  layerNorm: false,
  swiglu: true,
  posParams: 0,
});

// the tiny Qwen presets (docs/qwen-vl.md): 4×4 patches with temporal patch 2
const QWEN25_TINY_VIT: Vit = {
  blocks: 4,
  hidden: 64,
  mlp: 128,
  patchIn: 3 * 2 * 4 * 4,
  patchBias: false,
  layerNorm: false,
  swiglu: true,
  posParams: 0,
};
const QWEN3_TINY_VIT: Vit = {
  blocks: 3,
  hidden: 64,
  mlp: 256,
  patchIn: 3 * 2 * 4 * 4,
  patchBias: true,
  layerNorm: true,
  swiglu: false,
  posParams: 16 * 64,
};

/** Llama 2 and 3 decoders: 8 KV heads of 128, no biases, no qk-norm, untied */
const LLAMA = {
  kv: 8,
  headDim: 128,
  vocab: 128256,
  tied: false,
  qkvBias: false,
  qkNorm: false,
} as const;

const EXPECTED: Record<
  string,
  { enc: number; proj: number; dec: { total: number; active: number } }
> = {
  'tiny-vlm': {
    enc: vitCount(TINY_VIT),
    proj: mergerCount(64, 128, true, false),
    dec: decoderCount({
      layers: 4,
      hidden: 128,
      heads: 8,
      kv: 4,
      headDim: 16,
      vocab: 512,
      tied: false,
      qkvBias: false,
      qkNorm: true,
      ffn: 384,
    }),
  },
  'tiny-vlm-moe': {
    enc: vitCount(TINY_VIT),
    proj: mergerCount(64, 128, true, false),
    dec: decoderCount({
      layers: 4,
      hidden: 128,
      heads: 8,
      kv: 4,
      headDim: 16,
      vocab: 512,
      tied: false,
      qkvBias: false,
      qkNorm: true,
      experts: 8,
      topk: 2,
      expertFfn: 128,
    }),
  },
  // bench/mfu.ts's model: tiny-vlm-moe's shape at real widths
  'vlm-moe-150m': {
    enc: vitCount({
      blocks: 12,
      hidden: 384,
      mlp: 1536,
      patchIn: 3 * 14 * 14,
      patchBias: true,
      layerNorm: true,
      swiglu: false,
      posParams: 2 * 16 * 384,
    }),
    proj: mergerCount(384, 512, true, false),
    dec: decoderCount({
      layers: 12,
      hidden: 512,
      heads: 8,
      kv: 4,
      headDim: 64,
      vocab: 8192,
      tied: false,
      qkvBias: false,
      qkNorm: true,
      experts: 8,
      topk: 2,
      expertFfn: 1024,
    }),
  },
  'qwen2.5-vl-tiny': {
    enc: vitCount(QWEN25_TINY_VIT),
    proj: mergerCount(64, 128, false, false),
    dec: decoderCount({
      layers: 4,
      hidden: 128,
      heads: 8,
      kv: 4,
      headDim: 16,
      vocab: 512,
      tied: true,
      qkvBias: true,
      qkNorm: false,
      ffn: 384,
    }),
  },
  'qwen3-vl-moe-tiny': {
    enc: vitCount(QWEN3_TINY_VIT),
    proj: mergerCount(64, 128, true, false) + 2 * mergerCount(64, 128, true, true),
    dec: decoderCount({
      layers: 4,
      hidden: 128,
      heads: 8,
      kv: 4,
      headDim: 16,
      vocab: 512,
      tied: false,
      qkvBias: false,
      qkNorm: true,
      experts: 8,
      topk: 2,
      expertFfn: 128,
    }),
  },
  'qwen2.5-vl-3b': {
    enc: vitCount(qwen25Vit(3420)),
    proj: mergerCount(1280, 2048, false, false),
    dec: decoderCount({
      layers: 36,
      hidden: 2048,
      heads: 16,
      kv: 2,
      headDim: 128,
      vocab: 151936,
      tied: true,
      qkvBias: true,
      qkNorm: false,
      ffn: 11008,
    }),
  },
  'qwen2.5-vl-7b': {
    enc: vitCount(qwen25Vit(3420)),
    proj: mergerCount(1280, 3584, false, false),
    dec: decoderCount({
      layers: 28,
      hidden: 3584,
      heads: 28,
      kv: 4,
      headDim: 128,
      vocab: 152064,
      tied: false,
      qkvBias: true,
      qkNorm: false,
      ffn: 18944,
    }),
  },
  'qwen2.5-vl-32b': {
    enc: vitCount(qwen25Vit(3456)),
    proj: mergerCount(1280, 5120, false, false),
    dec: decoderCount({
      layers: 64,
      hidden: 5120,
      heads: 40,
      kv: 8,
      headDim: 128,
      vocab: 152064,
      tied: false,
      qkvBias: true,
      qkNorm: false,
      ffn: 27648,
    }),
  },
  'qwen2.5-vl-72b': {
    enc: vitCount(qwen25Vit(3456)),
    proj: mergerCount(1280, 8192, false, false),
    dec: decoderCount({
      layers: 80,
      hidden: 8192,
      heads: 64,
      kv: 8,
      headDim: 128,
      vocab: 152064,
      tied: false,
      qkvBias: true,
      qkNorm: false,
      ffn: 29568,
    }),
  },
  'qwen3-vl-30b-a3b': {
    enc: vitCount(QWEN3_VIT),
    proj: mergerCount(1152, 2048, true, false) + 3 * mergerCount(1152, 2048, true, true),
    dec: decoderCount({
      layers: 48,
      hidden: 2048,
      heads: 32,
      kv: 4,
      headDim: 128,
      vocab: 151936,
      tied: false,
      qkvBias: false,
      qkNorm: true,
      experts: 128,
      topk: 8,
      expertFfn: 768,
    }),
  },
  'qwen3-vl-235b-a22b': {
    enc: vitCount(QWEN3_VIT),
    proj: mergerCount(1152, 4096, true, false) + 3 * mergerCount(1152, 4096, true, true),
    dec: decoderCount({
      layers: 94,
      hidden: 4096,
      heads: 64,
      kv: 4,
      headDim: 128,
      vocab: 151936,
      tied: false,
      qkvBias: false,
      qkNorm: true,
      experts: 128,
      topk: 8,
      expertFfn: 1536,
    }),
  },
  // text-only stand-ins (bench/published.ts): a published decoder on the tiny encoder
  'llama3-8b-text': {
    enc: vitCount(TINY_VIT),
    proj: mergerCount(64, 4096, true, false),
    dec: decoderCount({ ...LLAMA, layers: 32, hidden: 4096, heads: 32, ffn: 14336 }),
  },
  'llama3-70b-text': {
    enc: vitCount(TINY_VIT),
    proj: mergerCount(64, 8192, true, false),
    dec: decoderCount({ ...LLAMA, layers: 80, hidden: 8192, heads: 64, ffn: 28672 }),
  },
  'llama2-70b-text': {
    enc: vitCount(TINY_VIT),
    proj: mergerCount(64, 8192, true, false),
    dec: decoderCount({ ...LLAMA, layers: 80, hidden: 8192, heads: 64, vocab: 32000, ffn: 28672 }),
  },
};

describe('parameter counts equal the hand count', () => {
  it('covers every preset', () => {
    expect(Object.keys(EXPECTED).sort()).toEqual([...PRESETS].sort());
  });
  it('anchors: the Qwen3-VL decoders as published', () => {
    expect(EXPECTED['qwen3-vl-30b-a3b'].dec).toEqual({
      total: 30_532_122_624,
      active: 3_353_032_704,
    });
    expect(EXPECTED['qwen3-vl-235b-a22b'].dec.total).toBe(235_093_634_560);
  });
  it('anchors: the Llama decoders as published (their Hugging Face checkpoints)', () => {
    expect(EXPECTED['llama3-8b-text'].dec.total).toBe(8_030_261_248);
    expect(EXPECTED['llama3-70b-text'].dec.total).toBe(70_553_706_496);
    expect(EXPECTED['llama2-70b-text'].dec.total).toBe(68_976_648_192);
  });
  it.each(PRESETS)('%s', (name) => {
    const p = countParams(presetGraph(name), loadModelConfig(name));
    const want = EXPECTED[name];
    expect(p.image_encoder.total).toBe(want.enc);
    expect(p.image_projector.total).toBe(want.proj);
    expect(p.text_decoder.total).toBe(want.dec.total);
    expect(p.text_decoder.activePerToken).toBe(want.dec.active);
    expect(p.total.total).toBe(want.enc + want.proj + want.dec.total);
    expect(p.total.activePerToken).toBe(want.enc + want.proj + want.dec.active);
  });
});

describe('freezing', () => {
  it('model.image_encoder.freeze freezes visual.* except the merger', async () => {
    const { buildForwardGraph } = await import('../../compiler/frontend/build.js');
    const cfg = loadModelConfig('tiny-vlm', ['model.image_encoder.freeze=True']);
    const g = buildForwardGraph(cfg);
    const frozen = g.params.filter((p) => !p.trainable).map((p) => p.name);
    expect(frozen.length).toBeGreaterThan(0);
    expect(frozen.every((n) => n.startsWith('visual.') && !n.startsWith('visual.merger'))).toBe(
      true,
    );
    expect(
      g.params
        .filter((p) => p.name.startsWith('visual.') && !p.name.startsWith('visual.merger'))
        .every((p) => !p.trainable),
    ).toBe(true);
    const counts = countParams(g, cfg);
    expect(counts.image_encoder.trainable).toBe(0);
    expect(counts.image_projector.trainable).toBe(counts.image_projector.total);
  });
  it('model.image_projector.freeze freezes the merger', async () => {
    const { buildForwardGraph } = await import('../../compiler/frontend/build.js');
    const g = buildForwardGraph(
      loadModelConfig('tiny-vlm', ['+model.image_projector.freeze=true']),
    );
    expect(
      g.params
        .filter((p) => !p.trainable)
        .map((p) => p.name)
        .every((n) => n.startsWith('visual.merger')),
    ).toBe(true);
  });
});
