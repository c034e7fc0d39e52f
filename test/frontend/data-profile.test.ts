// Data profiles (compiler/frontend/data-profile.ts): smart_resize and visual tokens on cases worked
// by hand here, the sizes of a hand-made profile, every shipped profile, each malformed profile's
// one-line message, and the synthetic profile against a direct count of samples drawn the way
// runtime-native/src/data/microbatch.cc synthesize() draws them.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import {
  listDataProfiles,
  loadDataProfile,
  profileSizes,
  smartResize,
  visualTokensOfGrid,
  visualTokensOfImage,
} from '../../compiler/frontend/data-profile.js';

const qwen3 = loadModelConfig('qwen3-vl-30b-a3b').model.image_encoder; // patch 16, merge 2, max 768
const qwen25 = loadModelConfig('qwen2.5-vl-7b').model.image_encoder; // patch 14, merge 2, max 784
const tiny = loadModelConfig('tiny-vlm').model.image_encoder; // patch 4, merge 2, max 32

const dir = mkdtempSync(join(tmpdir(), 'lfc-data-profile-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let files = 0;
/** a profile file with the given YAML text; returns its path */
function profileFile(text: string): string {
  const path = join(dir, `p${files++}.yaml`);
  writeFileSync(path, text);
  return path;
}

const HEAD = 'name: hand\ndescription: hand-made\nreasons: for the test\n';

describe('smartResize (HF smart_resize), [height, width]', () => {
  it('rounds 1920×1080 to factor 28, then scales it under 28·28·1280 pixels', () => {
    // rounded 1092×1932 = 2109744 > 1003520; β = √(2073600/1003520) = 1.43747;
    // 1080/β/28 = 26.83 → 26·28 = 728, 1920/β/28 = 47.70 → 47·28 = 1316
    expect(smartResize(1080, 1920, 28, 3136, 1003520)).toEqual([728, 1316]);
  });

  it('does the same at factor 32 (Qwen3-VL) with the defaults scaled to it', () => {
    // rounded 1088×1920 = 2088960 > 1280·32² = 1310720; β = √(2073600/1310720) = 1.25779;
    // 1080/β/32 = 26.83 → 832, 1920/β/32 = 47.70 → 1504
    expect(smartResize(1080, 1920, 32, 4096, 1310720)).toEqual([832, 1504]);
    // under the Qwen3-VL checkpoint's 65536 … 16777216 the rounded size already fits
    expect(smartResize(1080, 1920, 32, 65536, 16777216)).toEqual([1088, 1920]);
  });

  it('scales a tiny image up to min_pixels', () => {
    // rounded 28×56 = 1568 < 3136; β = √(3136/1500) = 1.44594;
    // ⌈30·β/28⌉ = ⌈1.549⌉ = 2 → 56, ⌈50·β/28⌉ = ⌈2.582⌉ = 3 → 84
    expect(smartResize(30, 50, 28, 3136, 1003520)).toEqual([56, 84]);
  });

  it('scales a huge image down to max_pixels', () => {
    // β = √(48000000/1003520) = 6.91600; 6000/β/28 = 30.98 → 840, 8000/β/28 = 41.31 → 1148
    expect(smartResize(6000, 8000, 28, 3136, 1003520)).toEqual([840, 1148]);
  });

  it("rounds halves to even, as Python's round()", () => {
    expect(smartResize(70, 700, 28, 3136, 1003520)).toEqual([56, 700]); // 2.5 → 2
    expect(smartResize(42, 700, 28, 3136, 1003520)).toEqual([56, 700]); // 1.5 → 2
  });
});

describe('visualTokensOfImage: the processor, then max_image_size on each side', () => {
  it('Qwen3-VL (24 merged tokens a side at most)', () => {
    expect(visualTokensOfImage(448, 448, qwen3)).toBe(14 * 14);
    expect(visualTokensOfImage(640, 480, qwen3)).toBe(15 * 20);
    // 832×1504 = 26×47 merged; 47 > 24: ⌊26·24/47⌋ = 13 rows, 24 columns
    expect(visualTokensOfImage(1920, 1080, qwen3)).toBe(13 * 24);
  });

  it('Qwen2.5-VL (28 merged tokens a side at most)', () => {
    expect(visualTokensOfImage(448, 448, qwen25)).toBe(16 * 16);
    // 728×1316 = 26×47 merged; ⌊26·28/47⌋ = 15 rows, 28 columns
    expect(visualTokensOfImage(1920, 1080, qwen25)).toBe(15 * 28);
  });

  it("tiny: the preset's min_pixels of one merged token keeps an 8×8 image; without it, HF's 4·8²", () => {
    expect(visualTokensOfImage(8, 8, tiny)).toBe(1);
    expect(visualTokensOfImage(4, 4, tiny)).toBe(1); // scaled up to 8×8
    expect(visualTokensOfImage(32, 32, tiny)).toBe(16);
    const hfDefaults = { ...tiny, min_pixels: undefined, max_pixels: undefined };
    expect(visualTokensOfImage(8, 8, hfDefaults)).toBe(4);
  });

  it('a grid is taken as is, but for max_image_size', () => {
    expect(visualTokensOfGrid(4, 3, tiny)).toBe(12);
    expect(visualTokensOfGrid(30, 10, qwen3)).toBe(24 * 8); // ⌊10·24/30⌋ = 8
  });

  it('refuses an image more elongated than 200:1', () => {
    expect(() => visualTokensOfImage(4000, 10, qwen3)).toThrow(/aspect ratio above 200/);
  });
});

describe('profileSizes on a hand-made profile', () => {
  // E[images] = 0.5 (weights 2, 2 normalize to ½, ½), one image = 448×448 = 16×16 = 256 tokens on
  // Qwen2.5-VL, E[text] = 200: E[visual] = 128, E[sample] = 328 tokens. A sample is 100, 300, 356
  // or 556 tokens, equally likely: E[L²] = 133968, so a token's sample has 133968/328 = 408.4
  const body =
    'images_per_sample: {0: 2, 1: 2}\nimage_resolution: {"448x448": 1}\ntext_tokens: {100: 1, 300: 1}\n';
  const S = 32768;

  it('with no cap: samples 32768/328 = 99.9, visual 32768·128/328 = 12787.5, images 49.95', () => {
    const p = loadDataProfile(profileFile(HEAD + body));
    expect(profileSizes(p, qwen25, S)).toEqual({
      bound: { visualTokens: 32768 },
      expected: { visualTokens: 12788, images: 50, samples: 100, sampleTokens: 408 },
    });
  });

  it('with a cap of 8192 tokens, which binds: 8192/128 = 64 samples', () => {
    const p = loadDataProfile(profileFile(HEAD + body + 'caps: {max_visual_tokens: 8192}\n'));
    expect(profileSizes(p, qwen25, S)).toEqual({
      bound: { visualTokens: 8192 },
      expected: { visualTokens: 8192, images: 32, samples: 64, sampleTokens: 408 },
    });
  });

  it('with a fraction: 1/8 binds (4096 tokens), 1/2 does not (16384 > 12788)', () => {
    const eighth = loadDataProfile(profileFile(HEAD + body + 'caps: {max_visual_fraction: 0.125}'));
    expect(profileSizes(eighth, qwen25, S)).toEqual({
      bound: { visualTokens: 4096 },
      expected: { visualTokens: 4096, images: 16, samples: 32, sampleTokens: 408 },
    });
    const half = loadDataProfile(profileFile(HEAD + body + 'caps: {max_visual_fraction: 0.5}'));
    expect(profileSizes(half, qwen25, S)).toEqual({
      bound: { visualTokens: 16384 },
      expected: { visualTokens: 12788, images: 50, samples: 100, sampleTokens: 408 },
    });
  });
});

describe('shipped profiles', () => {
  it('lists the six profiles and loads `default` when none is named', () => {
    expect(listDataProfiles()).toEqual([
      'article',
      'caption',
      'default',
      'sft-multi-image',
      'synthetic',
      'text',
    ]);
    expect(loadDataProfile().name).toBe('default');
  });

  for (const name of listDataProfiles()) {
    it(`${name} loads, is named for its file, and plans within its bound`, () => {
      const p = loadDataProfile(name);
      expect(p.name).toBe(name);
      expect(p.source).toBe(`configs/data/${name}.yaml`);
      expect(p.description).not.toContain('\n');
      for (const enc of [qwen3, qwen25, tiny]) {
        const { bound, expected } = profileSizes(p, enc, 32768);
        expect(bound.visualTokens).toBeLessThanOrEqual(32768);
        // text: no images, the encoder planned for one visual token
        if (name === 'text') expect([bound.visualTokens, expected.visualTokens]).toEqual([1, 0]);
        else expect(expected.visualTokens).toBeGreaterThan(0);
        expect(expected.visualTokens).toBeLessThanOrEqual(bound.visualTokens);
      }
    });
  }

  it("the article's cap is half the 32k sequence", () => {
    expect(profileSizes(loadDataProfile('article'), qwen3, 32768).bound.visualTokens).toBe(16384);
  });
});

describe('malformed profiles: one line naming the file and the field', () => {
  const ok = {
    images: 'images_per_sample: {1: 1}\n',
    res: 'image_resolution: {"448x448": 1}\n',
    text: 'text_tokens: {100: 1}\n',
  };
  // prettier-ignore
  const cases: [string, string, string][] = [
    ['an unknown field', HEAD + ok.images + ok.res + ok.text + 'capz: {}\n', "unknown field 'capz' (did you mean 'caps'?)"],
    ['a negative weight', HEAD + 'images_per_sample: {0: 1, 2: -1}\n' + ok.res + ok.text, 'images_per_sample: weight of 2 must be a non-negative number, got -1'],
    ['a weight that is not a number', HEAD + ok.images + ok.res + 'text_tokens: {100: many}\n', 'text_tokens: weight of 100 must be a non-negative number, got "many"'],
    ['both caps', HEAD + ok.images + ok.res + ok.text + 'caps: {max_visual_tokens: 8, max_visual_fraction: 0.5}\n', 'caps: give max_visual_tokens or max_visual_fraction, not both'],
    ['an unknown cap', HEAD + ok.images + ok.res + ok.text + 'caps: {max_visual_token: 8}\n', "caps: unknown field 'max_visual_token' (did you mean 'max_visual_tokens'?)"],
    ['a cap of 0 tokens', HEAD + ok.images + ok.res + ok.text + 'caps: {max_visual_tokens: 0}\n', 'caps: max_visual_tokens must be a positive integer, got 0'],
    ['a fraction above 1', HEAD + ok.images + ok.res + ok.text + 'caps: {max_visual_fraction: 1.5}\n', 'caps: max_visual_fraction must be in (0, 1], got 1.5'],
    ['a resolution that is not WxH', HEAD + ok.images + 'image_resolution: {"448": 1}\n' + ok.text, "image_resolution: '448' is not WIDTHxHEIGHT in pixels"],
    ['a resolution of 0 pixels', HEAD + ok.images + 'image_resolution: {"448x0": 1}\n' + ok.text, "image_resolution: '448x0' is not WIDTHxHEIGHT in pixels"],
    ['a resolution too elongated', HEAD + ok.images + 'image_resolution: {"4000x10": 1}\n' + ok.text, 'image_resolution: 4000x10 is more elongated than the processor takes (200:1)'],
    ['a grid that is not RxC', HEAD + ok.images + 'image_grid: {"2by2": 1}\n' + ok.text, "image_grid: '2by2' is not ROWSxCOLS in merged tokens"],
    ['no image size', HEAD + ok.images + ok.text, 'image_resolution (WIDTHxHEIGHT pixels) or image_grid (ROWSxCOLS) is required'],
    ['both image sizes', HEAD + ok.images + ok.res + 'image_grid: {"1x1": 1}\n' + ok.text, 'give image_resolution or image_grid, not both'],
    ['an empty histogram', HEAD + ok.images + ok.res + 'text_tokens: {}\n', 'text_tokens: empty; give at least one value → weight'],
    ['all-zero weights', HEAD + ok.images + ok.res + 'text_tokens: {100: 0, 200: 0}\n', 'text_tokens: every weight is 0'],
    ['a histogram that is a list', HEAD + ok.images + ok.res + 'text_tokens: [100]\n', 'text_tokens: must be a mapping of value → weight'],
    ['a fractional image count', HEAD + 'images_per_sample: {1.5: 1}\n' + ok.res + ok.text, "images_per_sample: '1.5' is not a non-negative integer"],
    ['samples of 0 text tokens', HEAD + ok.images + ok.res + 'text_tokens: {0: 1}\n', "text_tokens: '0' is not a positive integer"],
    ['a description of two lines', 'name: x\ndescription: "a\\nb"\nreasons: r\n' + ok.images + ok.res + ok.text, 'description: must be one line'],
    ['no reasons', 'name: x\ndescription: d\n' + ok.images + ok.res + ok.text, 'reasons: must be a non-empty string'],
    ['a list at the top', '- 1\n', 'expected a mapping at the top level'],
  ];
  for (const [what, text, message] of cases) {
    it(what, () => {
      const path = profileFile(text);
      expect(() => loadDataProfile(path)).toThrow(`${path}: ${message}`);
      expect(() => loadDataProfile(path)).toThrow(/^[^\n]*$/);
    });
  }

  it('unparseable YAML', () => {
    const path = profileFile(HEAD + 'images_per_sample: {0: 1\n');
    expect(() => loadDataProfile(path)).toThrow(new RegExp(`^${path}: malformed YAML: [^\\n]+$`));
  });

  it('a missing file or an unknown name lists the profiles', () => {
    const known = 'profiles: article, caption, default, sft-multi-image, synthetic';
    expect(() => loadDataProfile(join(dir, 'nope.yaml'))).toThrow(
      `data profile file ${join(dir, 'nope.yaml')} does not exist; ${known}`,
    );
    expect(() => loadDataProfile('articel')).toThrow(
      `unknown data profile 'articel' (did you mean 'article'?); ${known}`,
    );
  });
});

describe('the synthetic profile against samples drawn as synthesize() draws them', () => {
  /** mulberry32: a small seeded generator (not the runtime's hash; only the distribution matters) */
  function generator(seed: number): (n: number) => number {
    let a = seed >>> 0;
    return (n) => {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = Math.imul(a ^ (a >>> 15), 1 | a);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return Math.floor((((t ^ (t >>> 14)) >>> 0) / 2 ** 32) * n); // uniform in 0..n-1
    };
  }
  /** one sample: an ia×ib image (1..4 each), 3 caption tokens and 3..8 filler tokens */
  function sample(below: (n: number) => number): { visual: number; tokens: number } {
    const visual = (1 + below(4)) * (1 + below(4));
    return { visual, tokens: visual + 3 + (3 + below(6)) };
  }
  /** one microbatch, packed as synthesize() packs: stop at the first sample that does not fit */
  function microbatch(below: (n: number) => number, S: number): { visual: number; tokens: number } {
    let visual = 0;
    let tokens = 0;
    for (;;) {
      const s = sample(below);
      if (tokens + s.tokens > S) return { visual, tokens };
      visual += s.visual;
      tokens += s.tokens;
    }
  }
  const synthetic = loadDataProfile('synthetic');

  it('at 32768 tokens: within 1% of the mean over 50 packed microbatches', () => {
    const below = generator(1);
    let visual = 0;
    for (let i = 0; i < 50; i++) visual += microbatch(below, 32768).visual;
    const { expected } = profileSizes(synthetic, qwen3, 32768);
    // E[ia·ib] = 2.5² = 6.25, E[L] = 6.25 + 3 + 5.5 = 14.75: 32768·6.25/14.75 = 13884.7
    expect(expected.visualTokens).toBe(13885);
    expect(Math.abs(expected.visualTokens - visual / 50) / expected.visualTokens).toBeLessThan(
      0.01,
    );
  });

  it("at the tiny presets' 128 tokens: above the count by the packer's padding share", () => {
    const below = generator(2);
    const n = 20000;
    let visual = 0;
    let tokens = 0;
    for (let i = 0; i < n; i++) {
      const m = microbatch(below, 128);
      visual += m.visual;
      tokens += m.tokens;
    }
    const { bound, expected } = profileSizes(synthetic, tiny, 128);
    expect(bound.visualTokens).toBe(128);
    // the padding the module's header names: E[L(L−1)]/(2·E[L]) over the 96 equally likely samples
    let lSquared = 0;
    let squares = 0;
    for (let a = 1; a <= 4; a++)
      for (let b = 1; b <= 4; b++)
        for (let f = 3; f <= 8; f++) {
          lSquared += (a * b + 3 + f) * (a * b + 2 + f);
          squares += (a * b + 3 + f) ** 2;
        }
    // 128/14.75 = 8.68 samples; a token's sample E[L²]/E[L] over the same 96
    const sampleTokens = Math.round(squares / 96 / 14.75);
    expect(expected).toEqual({ visualTokens: 54, images: 9, samples: 9, sampleTokens });
    const padding = lSquared / 96 / (2 * 14.75); // 7.56 tokens
    expect(Math.abs(128 - tokens / n - padding) / padding).toBeLessThan(0.03);
    const measured = visual / n; // ≈ 50.5
    expect(expected.visualTokens - measured).toBeGreaterThan(0);
    expect(Math.abs(measured - ((128 - padding) * 6.25) / 14.75) / measured).toBeLessThan(0.03);
  });
});
