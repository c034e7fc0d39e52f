// The data loader of one rank: the global batch of each step, packed from the sampler's stream,
// and of it the microbatches of this rank's data-parallel replica, as the runtime takes them.
//
// Every rank plans the whole global batch (the samples' token and visual-token counts: their
// text tokenized, their images' sizes read from the file headers), so that where microbatch g
// starts is a function of the data position alone, the same under every layout. Only the
// replica's own microbatches are built, and their images decoded only where this rank's program
// encodes them. A bad sample (a DataError: bad JSON, a missing or undecodable image, a marker
// count that differs from its images, no loss token) is skipped and counted, or ends the run
// under strict; a sample that fits no microbatch is dropped and counted (or cut, truncate).
//
//   1. draw        the sampler's next position → (dataset, index) → RawSample
//   2. prepare     image sizes → visual tokens (shrunk to the bound where one image alone passes
//                  it) → the conversation encoded (chat.ts) → PackedSample
//   3. pack        microbatch g takes samples while they fit (packer.ts)
//   4. build       this replica's microbatches: images decoded and processed, arrays assembled

import { UserError } from '../../compiler/errors.js';
import { processedSize, type ImageProcessorSpec } from '../../compiler/frontend/data-profile.js';
import type { Image, Microbatch } from '../batch.js';
import { encodeConversation, type EncodedText } from './chat.js';
import { openDataset, type Dataset } from './datasets.js';
import { processImage } from './image-processor.js';
import { decodeImage, imageInfo } from './images.js';
import { assemble, fits, truncated, type PackBounds, type PackedSample } from './packer.js';
import { DataError, type RawSample } from './sample.js';
import { SampleStream, splitRange, type DataSource, type Draw, type SplitPart } from './sampler.js';
import { loadTokenizer, type TextTokenizer } from './tokenizer.js';

export type TrainingPhase = 'sft' | 'pretrain';

export interface LoaderOptions {
  readonly sources: readonly DataSource[];
  readonly split: readonly [number, number, number];
  readonly part: SplitPart;
  readonly tokenizer: string;
  readonly phase: TrainingPhase;
  readonly seed: number;
  /** tokens and visual tokens of a microbatch */
  readonly bounds: PackBounds;
  /** microbatches of the global batch, and of one replica (replica r holds r·perReplica …) */
  readonly globalMicrobatches: number;
  readonly perReplica: number;
  readonly replica: number;
  readonly processor: ImageProcessorSpec;
  /** the model's vocabulary: a tokenizer with more ids is refused */
  readonly vocabSize: number;
  /** whether this rank encodes the images of its slot j (else grids stand for them) */
  readonly encodes: (slot: number) => boolean;
  /** M-RoPE position ids of a packed microbatch (the native addon's ropeIndex); absent: [S] */
  readonly ropeIndex?: (
    tokens: Int32Array,
    segments: Int32Array,
    grids: Int32Array,
    imageTokenId: number,
    mergeSize: number,
  ) => Int32Array;
  readonly truncate?: boolean;
  /** a bad sample ends the run (exit 2) instead of being skipped */
  readonly strict?: boolean;
  /** sees every sample prepared (lfc data stats) */
  readonly observe?: (s: SampleFigures) => void;
}

/** One prepared sample in figures (lfc data stats). */
export interface SampleFigures {
  readonly position: number;
  readonly where: string;
  /** each image's size as it comes, in pixels */
  readonly images: readonly { readonly width: number; readonly height: number }[];
  /** its tokens but the visual ones (chat template included) */
  readonly textTokens: number;
  readonly visualTokens: number;
  readonly lossTokens: number;
  /** fits no microbatch: dropped */
  readonly dropped: boolean;
}

/** What the loader met, counted since it opened. */
export interface DataCounts {
  /** samples packed into microbatches */
  packed: number;
  /** bad samples skipped, by the first line of their problem */
  bad: number;
  /** samples dropped for not fitting a microbatch alone */
  dropped: number;
  /** samples cut to the sequence (truncate) */
  truncated: number;
  /** images shrunk below the processor's size to fit the visual bound */
  shrunk: number;
  /** the first few distinct problems, for the run's summary */
  examples: string[];
}

export interface StepData {
  /** this replica's microbatches, slot by slot */
  readonly microbatches: Microbatch[];
  /** the data position of the step's first sample, and of the next step's */
  readonly startPosition: number;
  readonly endPosition: number;
  /** each microbatch of the global batch: its samples' data positions */
  readonly positions: readonly (readonly number[])[];
  /** this replica's microbatches: their samples, by dataset and index */
  readonly samples: readonly (readonly {
    readonly position: number;
    readonly dataset: number;
    readonly index: number;
  }[])[];
}

interface Prepared extends PackedSample {
  readonly raw: RawSample;
  /** its images' bytes, read once for their sizes and kept for decoding (dropped once it is
   * packed into another replica's microbatch: a rank holds its own replica's images only) */
  bytes: readonly Buffer[];
  readonly draw: Draw;
  /** each image's processed [height, width] */
  readonly sizes: readonly (readonly [number, number])[];
}

/** Problems kept for the run's summary (distinct ones: the same sample comes back each epoch). */
const MAX_EXAMPLES = 8;

/** Consecutive bad or dropped samples after which the data is taken to be unusable. */
const MAX_CONSECUTIVE_BAD = 1000;

export class DataLoader {
  readonly counts: DataCounts = {
    packed: 0,
    bad: 0,
    dropped: 0,
    truncated: 0,
    shrunk: 0,
    examples: [],
  };
  private pending: Prepared | undefined;

  private constructor(
    private readonly o: LoaderOptions,
    private readonly datasets: readonly Dataset[],
    readonly tokenizer: TextTokenizer,
    private readonly stream: SampleStream,
    private readonly ranges: readonly { readonly start: number; readonly end: number }[],
  ) {}

  static async open(o: LoaderOptions): Promise<DataLoader> {
    const tokenizer = loadTokenizer(o.tokenizer);
    if (tokenizer.vocabSize > o.vocabSize)
      throw new UserError(
        `--tokenizer-model ${tokenizer.where} has ${tokenizer.vocabSize} ids; the model's vocabulary has ${o.vocabSize}`,
      );
    if (!tokenizer.image)
      throw new UserError(
        `--tokenizer-model ${tokenizer.where} has no image placeholder (Qwen's <|image_pad|>, LLaVA's <image>) for the model's images`,
      );
    if (tokenizer.image.id >= o.vocabSize)
      throw new UserError(
        `--tokenizer-model ${tokenizer.where}: the image placeholder ${tokenizer.image.token} is id ${tokenizer.image.id}, past the model's vocabulary of ${o.vocabSize}`,
      );
    const datasets = await Promise.all(o.sources.map((s) => openDataset(s.path)));
    const ranges = datasets.map((d) => splitRange(d.size, o.split, o.part));
    ranges.forEach((r, i) => {
      if (r.end <= r.start)
        throw new UserError(
          `${o.sources[i].path}: its ${o.part} split is empty (${datasets[i].size} samples, --split ${o.split.map((x) => +x.toFixed(4)).join(',')})`,
        );
    });
    const stream = new SampleStream(
      ranges,
      o.sources.map((s) => s.weight),
      o.seed,
    );
    return new DataLoader(o, datasets, tokenizer, stream, ranges);
  }

  /** samples of one epoch: the datasets' split parts together */
  get epochSamples(): number {
    return this.ranges.reduce((a, r) => a + r.end - r.start, 0);
  }

  /** the data position of the next sample to pack */
  get position(): number {
    return this.pending?.draw.position ?? this.stream.position;
  }

  seek(position: number): void {
    this.pending = undefined;
    this.stream.seek(position);
  }

  /**
   * The next step's global batch, and this replica's microbatches of it; decodeAll: every
   * microbatch's images decoded, also where this rank does not encode them (the step dump).
   */
  async nextStep(opts: { decodeAll?: boolean } = {}): Promise<StepData> {
    const o = this.o;
    const startPosition = this.position;
    const packed: Prepared[][] = [];
    for (let g = 0; g < o.globalMicrobatches; g++) {
      const mb: Prepared[] = [];
      let tokens = 0;
      let visual = 0;
      for (;;) {
        const s = this.pending ?? (await this.prepareNext());
        if (!fits(s, tokens, visual, o.bounds)) {
          this.pending = s;
          break;
        }
        this.pending = undefined;
        mb.push(s);
        tokens += s.tokens.length;
        visual += s.visual;
      }
      packed.push(mb);
      const mine = g >= o.replica * o.perReplica && g < (o.replica + 1) * o.perReplica;
      if (!mine) for (const s of mb) s.bytes = [];
    }
    this.counts.packed += packed.reduce((a, mb) => a + mb.length, 0);
    const mine = packed.slice(o.replica * o.perReplica, (o.replica + 1) * o.perReplica);
    const microbatches = await Promise.all(
      mine.map((mb, j) => this.build(mb, opts.decodeAll || o.encodes(j))),
    );
    return {
      microbatches,
      startPosition,
      endPosition: this.position,
      positions: packed.map((mb) => mb.map((s) => s.draw.position)),
      samples: mine.map((mb) =>
        mb.map((s) => ({
          position: s.draw.position,
          dataset: s.draw.dataset,
          index: s.draw.index,
        })),
      ),
    };
  }

  /** The next sample that fits a microbatch alone: bad ones skipped, too long ones dropped. */
  private async prepareNext(): Promise<Prepared> {
    for (let tries = 0; ; tries++) {
      if (tries >= MAX_CONSECUTIVE_BAD)
        throw new UserError(
          `${MAX_CONSECUTIVE_BAD} samples in a row were bad or did not fit (the first: ${this.counts.examples[0] ?? 'none kept'})`,
        );
      const draw = this.stream.next();
      let s: Prepared | undefined;
      try {
        s = await this.prepare(draw);
      } catch (e) {
        if (!(e instanceof DataError) || this.o.strict) throw e;
        this.note('bad', e.message);
        continue;
      }
      if (s) return s;
    }
  }

  /** The sample at a draw, encoded; undefined when it fits no microbatch (counted). */
  private async prepare(draw: Draw): Promise<Prepared | undefined> {
    const o = this.o;
    const raw = this.datasets[draw.dataset].sample(draw.index);
    const spec = o.processor;
    const f = spec.factor;
    const sizes: [number, number][] = [];
    const visualTokens: number[] = [];
    const infos: { width: number; height: number }[] = [];
    const bytes: Buffer[] = [];
    for (const im of raw.images) {
      bytes.push(im.read());
      const info = await imageInfo(bytes[bytes.length - 1], im.where);
      infos.push(info);
      let [h, w] = processedSize(info.width, info.height, spec);
      if ((h / f) * (w / f) > o.bounds.maxVisualTokens) {
        // alone past the microbatch's bound: shrunk to fit it
        [h, w] = processedSize(info.width, info.height, spec, o.bounds.maxVisualTokens * f * f);
        this.counts.shrunk++;
      }
      sizes.push([h, w]);
      visualTokens.push((h / f) * (w / f));
    }
    const text: EncodedText = encodeConversation(this.tokenizer, raw.messages, {
      phase: o.phase,
      visualTokens,
      where: raw.where,
    });
    const P = spec.patchSize;
    let s: Prepared = {
      raw,
      bytes,
      draw,
      sizes,
      position: draw.position,
      tokens: text.tokens,
      target: text.target,
      reply: text.reply,
      grids: sizes.map(([h, w]) => [1, h / P, w / P] as const),
      visual: visualTokens.reduce((a, b) => a + b, 0),
    };
    // encodeConversation has checked the placeholders against the images and found a loss token
    if (s.tokens.length > o.bounds.seqLength && o.truncate) {
      const runs = imageRuns(s, this.tokenizer.image?.id, spec.mergeSize);
      const cut = truncated(s, runs, o.bounds.seqLength, spec.mergeSize);
      s = { ...s, ...cut, sizes: s.sizes.slice(0, cut.grids.length) };
      this.counts.truncated++;
      if (!s.target.some((t, i) => t && i > 0))
        throw new DataError(raw.where, 'no loss token left after --truncate');
    }
    const dropped = !fits(s, 0, 0, o.bounds);
    o.observe?.({
      position: draw.position,
      where: raw.where,
      images: infos,
      textTokens: s.tokens.length - s.visual,
      visualTokens: s.visual,
      lossTokens: s.target.reduce((a, t) => a + t, 0), // target[0] is never one
      dropped,
    });
    if (dropped) {
      this.note(
        'dropped',
        `${raw.where}: ${s.tokens.length} tokens and ${s.visual} visual tokens do not fit a microbatch of ${o.bounds.seqLength} and ${o.bounds.maxVisualTokens}`,
      );
      return undefined;
    }
    return s;
  }

  /** A microbatch of this replica, its images decoded or (decode false) their grids alone. */
  private async build(samples: readonly Prepared[], decode: boolean): Promise<Microbatch> {
    const o = this.o;
    let images: Image[] | undefined;
    if (decode) {
      images = [];
      for (const s of samples)
        for (let i = 0; i < s.grids.length; i++) {
          const src = s.raw.images[i];
          const [h, w] = s.sizes[i];
          try {
            const rgb = await decodeImage(s.bytes[i], src.where);
            images.push(processImage(rgb, o.processor, [h, w]));
          } catch (e) {
            // its header read, its data not: the sample is packed on every rank already, so
            // it trains with a blank image (the processor's mean) rather than move the packing
            if (!(e instanceof DataError) || o.strict) throw e;
            this.note('bad', `${e.message} (its header reads: trained with a blank image)`);
            images.push({ height: h, width: w, pixels: new Float32Array(3 * h * w) });
          }
        }
    }
    const imageTokenId = this.tokenizer.image?.id ?? 0;
    const rope = o.ropeIndex;
    return assemble(samples, o.bounds.seqLength, {
      images,
      imageTokenId,
      ...(rope
        ? { ropeIndex: (t, seg, g) => rope(t, seg, g, imageTokenId, o.processor.mergeSize) }
        : {}),
    });
  }

  private note(kind: 'bad' | 'dropped', message: string): void {
    this.counts[kind]++;
    const seen = this.counts.examples;
    if (seen.length < MAX_EXAMPLES && !seen.includes(message)) seen.push(message);
  }
}

/** Each image's [start, end) in a sample's tokens: its run of placeholder ids, in order. */
function imageRuns(
  s: PackedSample,
  imageId: number | undefined,
  mergeSize: number,
): [number, number][] {
  const runs: [number, number][] = [];
  if (imageId === undefined) return runs;
  let k = 0;
  for (const [t, h, w] of s.grids) {
    while (k < s.tokens.length && s.tokens[k] !== imageId) k++;
    const n = (t * h * w) / (mergeSize * mergeSize);
    runs.push([k, k + n]);
    k += n;
  }
  return runs;
}
