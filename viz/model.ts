// What the `lfc viz` app draws: the data the Node side (viz/bundle.ts) gathers from a plan
// directory, and the browser app (viz/app/) reads, from the local server's /api or from the JSON
// embedded in a self-contained page. Types only, so both sides import it.
//
// Sizes stay in bytes and times in milliseconds from the step's start. Wide tables are columnar
// (one array per field), so a 1024-rank plan's timeline parses fast.

/** A plan, as the app's plan list and compare view show it. */
export interface VizPlanSummary {
  /** index in the app's plan list (the order of `lfc viz DIR…`) */
  readonly index: number;
  /** the plan directory, as given */
  readonly dir: string;
  /** e.g. `qwen3-vl-30b-a3b on 32 ranks` */
  readonly title: string;
  /** one line: tp, pp, dp, ep, encoder level, microbatches, sequence */
  readonly layout: string;
  /** the encoder placement level (1 hetero TP, 2 hetero DP, 3 full separation), or 0 */
  readonly encoderLevel: number;
  readonly worldSize: number;
  readonly forecast: VizForecast | null;
  readonly ranks: readonly VizRank[];
  readonly stages: readonly { readonly stage: number; readonly chunks: readonly string[] }[];
  readonly programs: readonly VizProgram[];
  /** the graph passes whose IR the plan kept (lfc compile --save-ir), in pass order: the graph
   * view shows `ir:<pass>` beside the programs */
  readonly irPasses: readonly string[];
  /** the memory view's device: its memory and reserve (bytes) */
  readonly device: { readonly name: string; readonly bytes: number; readonly reserveBytes: number };
}

/** The simulated step's figures (the report's forecast), or the measured trace's step. */
export interface VizForecast {
  readonly source: string;
  readonly stepMs: number;
  readonly tokensPerSecond: number | null;
  readonly tokensPerSecondPerGpu: number | null;
  readonly mfu: number | null;
}

export interface VizRank {
  readonly rank: number;
  readonly program: string;
  readonly stage: number;
  /** its groups by kind: tp → 'tp[3]' */
  readonly groups: Readonly<Record<string, string>>;
}

export interface VizProgram {
  readonly id: string;
  readonly ranks: readonly number[];
  readonly stages: readonly number[];
  readonly instructions: number;
  /** device bytes per rank: at the bounds, and at expected sizes; and pinned host bytes */
  readonly boundBytes: number;
  readonly expectedBytes: number;
  readonly hostBytes: number;
}

// ---- graph: /api/plans/:i/graph/:program (a program's id, or ir:<pass>) ------------------------

/**
 * One program's dataflow, with its microbatches folded together: a node is an instruction of
 * one microbatch (every microbatch runs the same ones: `count` says how many times the step runs
 * it), an edge a buffer one node writes and another reads. Scopes give the module tree the view
 * folds (`model.layers.3.mlp` under `model.layers.3` under `model`).
 */
export interface VizGraph {
  readonly program: string;
  readonly nodes: readonly VizNode[];
  /** [from node index, to node index, bytes of the buffers between them] */
  readonly edges: readonly (readonly [number, number, number])[];
}

export interface VizNode {
  readonly op: string;
  readonly scope: string;
  /** forward, backward, recompute, optimizer, … (the instruction's phase) */
  readonly phase: string;
  readonly stream: string;
  /** how many instructions of the step it stands for (one per microbatch that runs it) */
  readonly count: number;
  /** the pipeline stage its program is on (a decoder layer's virtual stage chunk·pp + stage
   * where vpp > 1), or -1 (the IR) */
  readonly stage: number;
  /** where it runs: 'encoder', 'projector', 'decoder' or 'step' (gradients, optimizer) */
  readonly part: 'encoder' | 'projector' | 'decoder' | 'step';
  /** a collective or p2p: its group (`tp[0]`, `enc.mp[1]`), the group's ranks, and its root */
  readonly collective?: {
    readonly group: string;
    readonly ranks: readonly number[];
    readonly root?: number;
    readonly peer?: number;
  };
  /** output shapes, as the plan writes them ('4096', 'visual_tokens') */
  readonly shapes: readonly (readonly string[])[];
  readonly dtypes: readonly string[];
  /** FLOPs of one instance at expected sizes (0 for data movement) */
  readonly flops: number;
  /** bytes it reads and writes, one instance, expected sizes */
  readonly bytes: number;
}

// ---- timeline: /api/plans/:i/timeline?rank=r ----------------------------------------------------

/** The step's timeline of some ranks, one lane per (rank, stream). Columnar events. */
export interface VizTimeline {
  /** 'simulated on a800 (…)' or 'measured (trace.json)' */
  readonly source: string;
  readonly endMs: number;
  readonly lanes: readonly {
    readonly rank: number;
    readonly program: string;
    readonly stream: string;
  }[];
  /** names the event columns refer to by index */
  readonly ops: readonly string[];
  /** [op] whether it moves data between ranks (the op table's collectives, p2p included) */
  readonly opIsCollective: readonly boolean[];
  readonly phases: readonly string[];
  readonly scopes: readonly string[];
  readonly events: {
    readonly lane: readonly number[];
    readonly start: readonly number[];
    /** the whole span, waiting included */
    readonly dur: readonly number[];
    /** the part of the span spent waiting for peers (collectives, p2p) before data moves */
    readonly wait: readonly number[];
    readonly op: readonly number[];
    readonly phase: readonly number[];
    readonly scope: readonly number[];
    readonly microbatch: readonly number[];
    readonly bytes: readonly number[];
    /** index of the instruction in its program */
    readonly instruction: readonly number[];
  };
  /**
   * Marked windows per rank: the phases of full separation ('encoder forward', 'decoder
   * pipeline', 'encoder backward'), the optimizer step, and the pipeline bubbles (the compute
   * stream idle between its first and last kernel).
   */
  readonly marks: readonly {
    readonly rank: number;
    readonly kind: 'phase' | 'bubble';
    readonly label: string;
    readonly startMs: number;
    readonly endMs: number;
  }[];
}

// ---- memory: /api/plans/:i/memory/:program -----------------------------------------------------

/** One program's device bytes over its step, from the memory plan's buffer lifetimes. */
export interface VizMemory {
  readonly program: string;
  /** what does not change over the step: parameters, gradients, optimizer state, batch, scratch */
  readonly staticBytes: number;
  /**
   * sampled points: x the instruction index (and ms on the simulated/measured timeline where
   * there is one), activations live at the bounds and at expected sizes
   */
  readonly points: {
    readonly instruction: readonly number[];
    readonly ms: readonly number[] | null;
    readonly boundBytes: readonly number[];
    readonly expectedBytes: readonly number[];
  };
  /** the device total at its peak (bound, and expected), and where the bound peaks */
  readonly peak: {
    readonly boundBytes: number;
    readonly expectedBytes: number;
    readonly instruction: number;
  };
  /** the device's memory less its reserve: what the plan may use */
  readonly limitBytes: number;
}

/** Everything a self-contained page embeds (lfc viz --output): the server's answers, precomputed. */
export interface VizEmbedded {
  readonly plans: readonly VizPlanSummary[];
  readonly graphs: Readonly<Record<string, VizGraph>>; // key `${plan}/${program}`
  readonly timelines: Readonly<Record<string, VizTimeline>>; // key `${plan}/${rank}`
  readonly memory: Readonly<Record<string, VizMemory>>; // key `${plan}/${program}`
}
