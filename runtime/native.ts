// The typed loader of the native runtime (runtime-native/, a Node addon built with cmake by
// scripts/setup.mjs).
//
// The addon executes one rank's program (compiler/plan/format.ts: ProgramFile): it validates the
// program when a Runtime is constructed, owns the memory of its regions, fills microbatch data
// (given or synthetic), and runs training steps on a worker thread with one executor thread per
// stream. A rank of a multi-rank plan connects to the other ranks first (Gloo over TCP, met at a
// rendezvous store), and its collective instructions run over those connections.
// runtime-native/README.md describes the model; this file only declares its types.

import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import type { ProgramRegion, StreamName } from '../compiler/plan/format.js';
import { chooseOpenblasKernel } from './blas.js';
import { EnvironmentError } from '../compiler/errors.js';

export interface NativeRuntimeOptions {
  /** OpenBLAS threads (process-wide); unset keeps OpenBLAS's default */
  readonly threads?: number;
  /** pixels per patch side (default 4) */
  readonly patchSize?: number;
  /** patches per merge-block side (default 2) */
  readonly mergeSize?: number;
  /** frames per patch: a still image is repeated this many times in time (default 1) */
  readonly temporalPatch?: number;
  /** window attention: the window side in merged tokens (default 0: none) */
  readonly windowMerged?: number;
  /** side of the interpolated position table (default 0: none) */
  readonly tableSide?: number;
  /** the model's image placeholder token; a microbatch must carry the same (default 1) */
  readonly imageTokenId?: number;
  /** 3: the model's rotary positions are M-RoPE ids (t, h, w); the synthetic data makes them */
  readonly positionRows?: number;
  /** report per-instruction start/end times in step results */
  readonly timing?: boolean;
  /** accept collective instructions (the runtime must be connected before its first step) */
  readonly collectives?: boolean;
  /**
   * the plan's symbols (plan.json `symbols`): S and Nv come from the data; the others are
   * run-time symbols, at their bound until a variable-size collective of the step sets them
   */
  readonly symbols?: readonly { readonly name: string; readonly bound: number }[];
}

/** A communicator to open: a group of the plan (index into `groups`) on a stream. */
export interface NativeCommContext {
  readonly group: number;
  readonly stream: 'compute' | 'comm' | 'copy' | 'grad';
}

/** How one rank meets the others (runtime-native/src/comm/comm.h: Config). */
export interface NativeCommConfig {
  readonly rank: number;
  readonly worldSize: number;
  /** `tcp:HOST:PORT` (the launcher's store) or `file:DIR` (one machine) */
  readonly store: string;
  /** store keys of this run start with it */
  readonly prefix: string;
  /** the address this rank's connections listen on (default 127.0.0.1) */
  readonly host?: string;
  /** plan.groups */
  readonly groups: readonly { readonly name: string; readonly ranks: readonly number[] }[];
  /** plan.rankGroups */
  readonly rankGroups: Readonly<Record<string, readonly number[]>>;
  /** every (group, stream) some rank's collectives use, the same list on every rank */
  readonly contexts: readonly NativeCommContext[];
  /** a collective (and the rendezvous) that takes longer fails, naming its op and group */
  readonly timeoutMs?: number;
}

export interface NativeImage {
  readonly height: number;
  readonly width: number;
  /** [3, height, width], channel-major */
  readonly pixels: Float32Array;
}

/** One packed sequence of S tokens and its images. */
export interface NativeMicrobatch {
  readonly tokens: Int32Array;
  /** next token of the same sample if it is a text token, else 0 */
  readonly labels: Int32Array;
  /** 1 exactly where the label is a text token */
  readonly lossMask: Uint8Array;
  /** index of each token within its sample, or M-RoPE ids [3, S] (rows t, h, w); 0 on padding */
  readonly positions: Int32Array;
  /** sample index of each token, −1 on padding */
  readonly segments: Int32Array;
  /** images [3, H, W], cut into patches by the runtime; or give pixelValues and grids */
  readonly images: readonly NativeImage[];
  /** [N, C·T·P·P] patches in merge-block order (docs/qwen-vl.md), with images empty */
  readonly pixelValues?: Float32Array;
  /** each image's grid (t, h, w) in patches, flat [n·3] */
  readonly grids?: Int32Array;
  /** [N] window ids, checked against the grids' windows (window attention) */
  readonly windowSegments?: Int32Array;
  /** the placeholder id the text uses; must equal the model's (default: the model's) */
  readonly imageTokenId?: number;
  /**
   * 1 where the label is a caption token, for a caption-loss metric (fills a `caption_mask` data
   * input when the program has one); derived from the labels (2–25) when absent. getMicrobatch
   * always returns it.
   */
  readonly captionMask?: Uint8Array;
}

export interface NativeParamInit {
  /** checkpoint name (PlanParam.name) */
  readonly name: string;
  /** `normal(std)`, `zeros` or `ones` */
  readonly init: string;
  /** the global (unsharded) shape */
  readonly shape: readonly number[];
  /** if given, must equal the program's shard of this parameter */
  readonly shard?: readonly (readonly [number, number])[];
  /** a piece of a whole tensor: the whole tensor's checkpoint name (the initializer's key) */
  readonly key?: string;
  /** …and per dim, the global index of each local index */
  readonly index?: readonly (readonly number[])[];
}

export interface NativeSynthOptions {
  readonly seqLength: number;
  readonly vocab: number;
  /** stop adding samples past this many visual tokens (default: the slot's patches bound) */
  readonly maxVisualTokens?: number;
}

export interface NativeStepOptions {
  readonly lr: number;
  /** AdamW step t, from 1 */
  readonly step: number;
  /** the forward phase alone: the loss of the set microbatches, no gradient, no update */
  readonly forwardOnly?: boolean;
}

export interface NativeStepResult {
  /** the program's outputs (loss, ce_loss, aux_loss per microbatch) */
  readonly outputs: readonly {
    readonly name: string;
    readonly microbatch: number;
    readonly value: number;
  }[];
  /** every scalar of the program after the step (loss_tokens, grad_norm_sq, clip_coef, …) */
  readonly scalars: Readonly<Record<string, number>>;
  readonly instructionsRun: number;
  readonly stepMs: number;
  /** with options.timing: per instruction, ms since the step started */
  readonly perInstruction?: readonly { readonly start: number; readonly end: number }[];
  /** with options.timing: the instant perInstruction counts from, ms since the epoch (system
   * clock) */
  readonly startWallMs?: number;
  /** what the step's memory held (bytes) */
  readonly memory: NativeStepMemory;
}

/**
 * The runtime's memory during a step. Regions are allocated whole at the program's sizes, so what
 * they hold is their sizes; scratch is counted as used: per stream, the most bytes one of its
 * instructions held at once.
 */
export interface NativeStepMemory {
  /** every region but host and scratch */
  readonly regionBytes: number;
  /** the host region (offloaded activations; pinned host memory on a GPU) */
  readonly hostBytes: number;
  readonly scratchHighBytes: Readonly<Record<StreamName, number>>;
  /** regionBytes + Σ scratchHighBytes: the most device bytes the step held, to compare with the
   * plan's device total at the bounds (compiler/report/memory.ts) */
  readonly deviceHighBytes: number;
}

export interface NativeProgramInfo {
  readonly id: string;
  /** microbatch slots: 1 + the largest microbatch index of the program */
  readonly slots: number;
  readonly buffers: number;
  readonly instructions: number;
  readonly events: number;
  /** streams that have instructions (one executor thread each) */
  readonly streams: readonly string[];
  readonly regions: Readonly<Record<ProgramRegion, number>>;
  /** once connected: each communicator and how its collectives move data ('local' for one
   * rank, 'tcp', or 'shared memory' when every member is on this machine) */
  readonly communicators?: readonly NativeCommunicatorInfo[];
}

export interface NativeCommunicatorInfo {
  /** group/stream, e.g. dp[0]/comm */
  readonly name: string;
  readonly size: number;
  readonly transport: 'local' | 'tcp' | 'shared memory';
  /** shared memory that reads its peers' inputs in place, one copy (runtime-native/src/comm/shm.h) */
  readonly direct: boolean;
}

/** What a failed step rejects with. */
export interface NativeStepError extends Error {
  /** the step failed in a collective: the run's failure, not lfc's */
  readonly collective?: boolean;
}

export interface NativeRuntime {
  /**
   * The memory of a region, without a copy (the ArrayBuffer keeps it alive; 'data' holds every
   * microbatch slot's buffers at their offsets). Do not write to it while a step runs.
   */
  region(
    name: 'param' | 'grad' | 'optim' | 'scalar' | 'arena' | 'data' | 'host' | 'scratch',
  ): ArrayBuffer;
  /** Every parameter from its init string, a pure function of (seed, name, global index); zeroes
   * the optimizer state. Every ProgramParam needs an entry. */
  initParams(seed: number, params: readonly NativeParamInit[]): void;
  /** Fills the data buffers of a microbatch slot; checks placeholders = visual tokens and bounds. */
  setMicrobatch(slot: number, mb: NativeMicrobatch): void;
  /** The synthetic task's microbatch for (seed, step, global microbatch), set into the slot. */
  synthesize(
    slot: number,
    seed: number,
    step: number,
    globalMicrobatch: number,
    options: NativeSynthOptions,
  ): NativeMicrobatch;
  /** A copy of the microbatch last set into the slot. */
  getMicrobatch(slot: number): NativeMicrobatch;
  /** 1 where the label is a caption token (2–25). */
  captionMask(slot: number): Uint8Array;
  /** A step scalar by name (the program's `scalars`), e.g. loss_tokens. */
  setScalar(name: string, value: number): void;
  getScalar(name: string): number;
  /** A copy of a buffer's bytes at its microbatch's sizes (planned bytes when none are set). */
  readBuffer(id: number): ArrayBuffer;
  info(): NativeProgramInfo;
  /** Zeroes the gradients and runs the program on worker threads; rejects with the failing
   * instruction's index, op and scope. One step at a time. A failure in a collective (its own
   * check, or another rank's failure, which the error names) rejects with `collective: true` on
   * the error (NativeStepError), and the runtime refuses every later step. */
  step(options: NativeStepOptions): Promise<NativeStepResult>;
  /** Opens this rank's communicators: resolves once every member of each group has arrived;
   * rejects after the config's timeout. Once, before the first step. */
  connect(config: NativeCommConfig): Promise<void>;
  /** Σ over every rank of the values, elementwise (between steps; every rank must call it). */
  worldSum(values: Float64Array): Promise<Float64Array>;
}

export interface NativeAddon {
  readonly Runtime: new (programJson: string, options?: NativeRuntimeOptions) => NativeRuntime;
  /** schema.h: the plan version the runtime reads */
  readonly planVersion: number;
  /** the kernels OpenBLAS runs (openblas_get_corename: 'SkylakeX', 'Prescott', …) */
  readonly blasCore: string;
  /** the best GFLOP/s of `reps` cblas_sgemm calls at n×n×n on `threads` threads (bench/mfu.ts) */
  sgemmGflops(n: number, threads: number, reps: number): number;
  /**
   * The memory floor of the shared-memory all-reduce and reduce-scatter (bench/collectives.ts):
   * `ranks` threads, each with a buffer of `bytes`, sum their blocks in place with the collectives'
   * kernel (a reduce-scatter's work), then copy every other block from the buffer that summed it
   * (what an all-reduce adds); the medians of `reps` in ms, the inputs cold each time.
   */
  collectiveFloor(bytes: number, ranks: number, reps: number): { sumMs: number; copyMs: number };
  /** schema.h: the op kinds, in ir/ops.ts order */
  readonly opNames: readonly string[];
  readonly streams: readonly string[];
  readonly regions: readonly string[];
  /**
   * M-RoPE position ids [3, S] (rows t, h, w) as Hugging Face's get_rope_index makes them, per
   * packed sample (docs/qwen-vl.md): grids flat [n·3] in patches; throws when the placeholders
   * and the grids disagree
   */
  ropeIndex(
    tokens: Int32Array,
    segments: Int32Array,
    grids: Int32Array,
    imageTokenId: number,
    mergeSize: number,
  ): Int32Array;
  /** a microbatch's images cut into the contract's patches (merge-block order, (c, t, row, col)) */
  patchify(
    mb: NativeMicrobatch,
    patchSize: number,
    mergeSize: number,
    temporalPatch: number,
  ): { pixelValues: Float32Array; grids: Int32Array };
  /** each patch's attention window [N] (merge-block order), windows windowMerged merged tokens a side */
  windowSegments(grids: Int32Array, mergeSize: number, windowMerged: number): Int32Array;
}

export const NATIVE_ADDON_RELATIVE = 'runtime-native/build/Release/lfc_native.node';

/** The addon's path: LFC_NATIVE_ADDON, or the build output of the repository this file is in. */
export function nativeAddonPath(): string {
  const override = process.env.LFC_NATIVE_ADDON;
  if (override) return override;
  // runtime/native.ts (tsx, vitest) or dist/runtime/native.js (compiled)
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let up = 0; up < 4; up++) {
    const candidate = join(dir, NATIVE_ADDON_RELATIVE);
    if (existsSync(candidate)) return candidate;
    dir = dirname(dir);
  }
  return join(dirname(dirname(fileURLToPath(import.meta.url))), NATIVE_ADDON_RELATIVE);
}

let cached: NativeAddon | undefined;

/** Loads the addon once; throws a clear error when it is not built. */
export function loadNative(): NativeAddon {
  if (cached) return cached;
  const path = nativeAddonPath();
  if (!existsSync(path)) {
    throw new EnvironmentError(
      `the native runtime is not built (no ${path}): lfc run, lfc demo and npm test build it ` +
        'on first use, or run npm run build:native',
    );
  }
  // OpenBLAS reads OPENBLAS_CORETYPE once, as the addon loads it
  chooseOpenblasKernel();
  const require = createRequire(import.meta.url);
  cached = require(path) as NativeAddon;
  return cached;
}

/** Whether the addon is built (for callers that can do without it). */
export function nativeAvailable(): boolean {
  return existsSync(nativeAddonPath());
}
