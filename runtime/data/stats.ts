// lfc data stats: what datasets hold, read the way training reads them (the same loader, tokenizer
// and processor, packed at the plan's sizes), and the data profile (configs/data/,
// docs/data-profiles.md) that `lfc compile --data-profile` plans memory for.
//
// Per sample: images, each image's size as it comes, text tokens (the chat template's included),
// visual tokens, loss tokens. Per packed microbatch: samples, text, visual and loss tokens,
// padding. The profile's histograms are the samples' own figures, binned where they are many.

import YAML from 'yaml';
import type { Microbatch } from '../batch.js';
import { DataLoader, type DataCounts, type LoaderOptions, type SampleFigures } from './loader.js';

export interface Summary {
  readonly count: number;
  readonly mean: number;
  readonly p50: number;
  readonly p90: number;
  readonly max: number;
}

export interface DataStats {
  readonly epochSamples: number;
  /** samples read (the first `samples` of the epoch, or all of it) */
  readonly samples: number;
  readonly counts: DataCounts;
  readonly imagesPerSample: Map<number, number>;
  /** `WxH` → images */
  readonly resolutions: Map<string, number>;
  /** text tokens of a sample → samples */
  readonly textTokens: Map<number, number>;
  readonly perSample: { text: Summary; visual: Summary; loss: Summary };
  readonly perMicrobatch: {
    count: number;
    samples: Summary;
    text: Summary;
    visual: Summary;
    loss: Summary;
    padding: Summary;
  };
  readonly seqLength: number;
  readonly maxVisualTokens: number;
}

export function summarize(values: readonly number[]): Summary {
  if (!values.length) return { count: 0, mean: 0, p50: 0, p90: 0, max: 0 };
  const v = [...values].sort((a, b) => a - b);
  const at = (q: number) => v[Math.min(v.length - 1, Math.floor(q * v.length))];
  return {
    count: v.length,
    mean: v.reduce((a, b) => a + b, 0) / v.length,
    p50: at(0.5),
    p90: at(0.9),
    max: v[v.length - 1],
  };
}

/**
 * Reads `limit` samples (default: one epoch) through a loader of one microbatch a step, its
 * images' sizes from their headers, nothing decoded. onProgress: samples read so far.
 */
export async function dataStats(
  o: Omit<LoaderOptions, 'globalMicrobatches' | 'perReplica' | 'replica' | 'encodes' | 'observe'>,
  limit?: number,
  onProgress?: (read: number, of: number) => void,
): Promise<DataStats> {
  const figures: SampleFigures[] = [];
  const loader = await DataLoader.open({
    ...o,
    globalMicrobatches: 1,
    perReplica: 1,
    replica: 0,
    encodes: () => false,
    observe: (s) => figures.push(s),
  });
  const epoch = loader.epochSamples;
  const want = Math.min(limit ?? epoch, epoch);
  const mbs: Microbatch[] = [];
  while (loader.position < want) {
    const step = await loader.nextStep();
    mbs.push(step.microbatches[0]);
    onProgress?.(Math.min(loader.position, want), want);
  }
  const read = figures.filter((f) => f.position < want);
  const imagesPerSample = new Map<number, number>();
  const resolutions = new Map<string, number>();
  const textTokens = new Map<number, number>();
  for (const f of read) {
    textTokens.set(f.textTokens, (textTokens.get(f.textTokens) ?? 0) + 1);
    imagesPerSample.set(f.images.length, (imagesPerSample.get(f.images.length) ?? 0) + 1);
    for (const im of f.images) {
      const key = `${im.width}x${im.height}`;
      resolutions.set(key, (resolutions.get(key) ?? 0) + 1);
    }
  }
  const imageId = loader.tokenizer.image?.id;
  const per = mbs.map((mb) => {
    let used = 0;
    let visual = 0;
    let loss = 0;
    let samples = 0;
    for (let i = 0; i < mb.tokens.length; i++) {
      if (mb.segments[i] < 0) continue;
      used++;
      visual += +(mb.tokens[i] === imageId);
      loss += mb.lossMask[i];
      samples = Math.max(samples, mb.segments[i] + 1);
    }
    return { used, visual, loss, samples, padding: mb.tokens.length - used };
  });
  return {
    epochSamples: epoch,
    samples: want,
    counts: loader.counts,
    imagesPerSample,
    resolutions,
    textTokens,
    perSample: {
      text: summarize(read.map((f) => f.textTokens)),
      visual: summarize(read.map((f) => f.visualTokens)),
      loss: summarize(read.map((f) => f.lossTokens)),
    },
    perMicrobatch: {
      count: mbs.length,
      samples: summarize(per.map((p) => p.samples)),
      text: summarize(per.map((p) => p.used - p.visual)),
      visual: summarize(per.map((p) => p.visual)),
      loss: summarize(per.map((p) => p.loss)),
      padding: summarize(per.map((p) => p.padding)),
    },
    seqLength: o.bounds.seqLength,
    maxVisualTokens: o.bounds.maxVisualTokens,
  };
}

/**
 * A histogram of at most `bins` keys: values rounded to multiples of a step that doubles until
 * they fit (WxH keys: both sides, the step from 16 pixels), weights summed.
 */
export function binned<K extends number | string>(
  counts: ReadonlyMap<K, number>,
  bins: number,
): Map<K, number> {
  const keys = [...counts.keys()];
  if (keys.length <= bins) return new Map(counts);
  const isSize = typeof keys[0] === 'string';
  for (let step = isSize ? 16 : 2; ; step *= 2) {
    const round = (x: number) => Math.max(step, Math.round(x / step) * step);
    const out = new Map<K, number>();
    for (const [k, n] of counts) {
      const key = (
        isSize
          ? (k as string)
              .split('x')
              .map((x) => round(Number(x)))
              .join('x')
          : Math.max(1, Math.round((k as number) / step) * step)
      ) as K;
      out.set(key, (out.get(key) ?? 0) + n);
    }
    if (out.size <= bins) return out;
  }
}

/** The data profile of these statistics, as YAML (configs/data's schema). */
export function profileYaml(s: DataStats, name: string, sources: readonly string[]): string {
  /** counts → shares of `total`, keys in order */
  const histogram = <K extends number | string>(m: ReadonlyMap<K, number>, total = s.samples) =>
    Object.fromEntries(
      [...m.entries()]
        .sort(([a], [b]) =>
          typeof a === 'number' ? a - (b as number) : String(a).localeCompare(String(b)),
        )
        .map(([k, n]) => [String(k), +(n / total).toFixed(6)]),
    );
  const images = [...s.resolutions.values()].reduce((a, b) => a + b, 0);
  return YAML.stringify({
    name,
    description: `measured by lfc data stats on ${s.samples} samples of ${sources.join(', ')}`,
    reasons: [
      `Measured, not assumed: ${s.samples} of ${s.epochSamples} samples read as training reads them`,
      `(tokenizer, chat template and image processor of the run), packed into microbatches of`,
      `${s.seqLength} tokens with at most ${s.maxVisualTokens} visual: ${s.perMicrobatch.count} microbatches,`,
      `${s.perMicrobatch.visual.mean.toFixed(1)} visual tokens each on average (max ${s.perMicrobatch.visual.max}).`,
      `${s.counts.bad} bad samples skipped, ${s.counts.dropped} dropped for not fitting a microbatch.`,
    ].join('\n'),
    images_per_sample: histogram(s.imagesPerSample),
    // text-only data: the schema still wants an image size, never drawn
    ...(images
      ? { image_resolution: histogram(binned(s.resolutions, 24), images) }
      : { image_grid: { '1x1': 1 } }),
    text_tokens: histogram(binned(s.textTokens, 16)),
    caps: { max_visual_tokens: s.maxVisualTokens },
  });
}
