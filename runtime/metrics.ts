// What a training step and an evaluation report: one record each, per rank, that the trainer
// (runtime/train.ts) makes and the launcher, the progress line and the step dumps read.

export interface StepMetrics {
  readonly step: number;
  readonly loss: number;
  readonly ceLoss: number;
  readonly auxLoss: number;
  readonly captionLoss: number | null;
  readonly gradNorm: number;
  readonly lr: number;
  readonly tokens: number;
  readonly lossTokens: number;
  readonly stepMs: number;
  readonly tokensPerSecond: number;
  /** this process's peak resident memory so far */
  readonly peakRssBytes: number;
  /** the most device bytes the native runtime held in the step: its regions, allocated whole,
   * and each stream's scratch high-water (runtime/native.ts NativeStepMemory) */
  readonly deviceHighBytes: number;
  /** of which scratch: Σ over streams of the most one instruction held */
  readonly scratchHighBytes: number;
  /** --use-vit-dp-balance: images of the step encoded on another rank than their own */
  readonly vitImagesMoved?: number;
  /** a run on datasets: the data position after this step (the next step's first sample) */
  readonly dataPosition?: number;
}

/** An evaluation on the validation split: means over its global batches of each one's loss. */
export interface EvalMetrics {
  /** after this training step */
  readonly step: number;
  readonly loss: number;
  readonly ceLoss: number;
  readonly captionLoss: number | null;
  /** global batches read */
  readonly batches: number;
  readonly lossTokens: number;
}
