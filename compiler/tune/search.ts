// The search of `lfc tune`, in two passes over the space (space.ts):
//
//   1. every layout through the analytic bounds and the cheaper model. A layout whose weights
//      and optimizer state alone are past the device (bounds.ts) is skipped; one the layout rules
//      refuse is counted with the rule's message; every other is estimated (estimate.ts: its
//      step and memory without emission or simulation, from priced pieces of a reduced model).
//   2. the candidates compiled and simulated, best estimate first: those estimated to fit, or
//      past the device by less than the estimate's error (ESTIMATE_MEMORY_MARGIN), so that a
//      layout the estimate overstates is still tried. Once `top` layouts that fit have been
//      priced, a candidate whose estimate is below the k-th best's priced tokens/s by more than
//      the estimate's error (ESTIMATE_SLACK) cannot win, nor can any after it: the search stops.
//      Candidates go in rounds of PRICE_ROUND, each decided from the rounds before it, so the
//      result is the same whatever the number of worker threads (Pricer: this thread, or
//      cli/tune-pool.ts). A candidate whose compiled plan is past the device is not simulated:
//      its step cannot rank it (PastDeviceLayout). The figures the tuner prints are the priced
//      ones, so a printed line compiles to them.
//
// A layout's compile options are the request's with its flags applied (space.ts layoutOptions,
// held equal to the parse of its `lfc compile` line by a test); the compiler itself prices it:
// memory off the plan (compiler/report/memory.ts), the step off the simulator (compiler/sim). One
// that fails is named with its error, never dropped. When none fits, the closest (by memory) are
// simulated after the search, to be printed. The ranking is by tokens/s, then by the layout's
// name; `exhaustive` prices every layout the rules allow (the test of search quality does). A
// layout left when the time budget runs out is reported as such. With `verify`, the best k are
// compiled once more with the plan verifier.

import { loadModelConfig, type ModelConfig } from '../frontend/config.js';
import type { Precision } from '../frontend/precision.js';
import { layerParams, staticBytesLowerBound } from './bounds.js';
import { UserError } from '../errors.js';
import type { CompileOptions, CompileResult } from '../pipeline.js';
import { checkLayout, compile, CompileStopped } from '../pipeline.js';
import type { ProgramFile } from '../plan/format.js';
import {
  fitsOn,
  memoryByProgram,
  programDeviceBytes,
  type DeviceMemory,
  type ProgramMemory,
} from '../report/memory.js';
import {
  EFFICIENCY_FAMILIES,
  scaleEfficiency,
  type EfficiencyFamily,
  type HardwareProfile,
} from '../sim/hardware.js';
import { forecastStep, type StepForecast } from '../sim/report.js';
import { Estimator, type Estimate } from './estimate.js';
import {
  enumerateLayouts,
  flagsOf,
  layoutOptions,
  layoutName,
  type Layout,
  type SearchSpaceRequest,
} from './space.js';

/**
 * the estimate's memory may overstate a plan's by this factor: candidates up to it are tried
 * (measured at most 1.14 on the test's small presets and 1.08 on the article's 30B search;
 * test/tune/estimate.test.ts holds it under this)
 */
export const ESTIMATE_MEMORY_MARGIN = 1.15;
/**
 * the estimate's tokens/s may understate a plan's by this share: below it a layout cannot win
 * (the step measured within 0.88–1.05 of the simulated on the test's presets on the GPU's side
 * alone, 0.85–1.05 with the framework's host: test/tune/estimate.test.ts)
 */
export const ESTIMATE_SLACK = 0.15;

export interface PricedLayout {
  readonly layout: Layout;
  readonly name: string;
  /** the layout's own flags (beside the request's) */
  readonly flags: readonly string[];
  readonly forecast: StepForecast;
  /** per distinct program, the largest device total first */
  readonly memory: readonly ProgramMemory[];
  /** the largest program's device bytes at the bounds, and at expected sizes */
  readonly peakBound: number;
  readonly peakExpected: number;
  readonly fits: boolean;
  /** whether the plan verifier has checked it (the top k, with TuneRequest.verify) */
  readonly verified: boolean;
  /** what the cheaper model estimated for it */
  readonly estimate: Estimate;
  /**
   * priced from two compiles at a fraction of the global batch, the step and peak memory
   * extrapolated to the whole batch (sketchSizes); the search compiles what it prints whole
   */
  readonly sketched?: boolean;
}

/** What a layout is estimated and priced with: what a worker thread rebuilds for itself. */
export interface PricingRequest {
  readonly space: SearchSpaceRequest;
  /**
   * the request's own compile options (model, cluster, batch, precision, data profile, hardware),
   * as `lfc compile` parses them; each layout's are these with its flags (space.ts layoutOptions)
   */
  readonly baseOptions: CompileOptions;
  readonly hardware: HardwareProfile;
  readonly device: DeviceMemory;
  /** the request's precision: the static-memory bound's bytes per parameter */
  readonly precision: Precision;
  /** fit at the bounds (what a rank can need) or at expected sizes (a typical step) */
  readonly fit: 'bound' | 'expected';
}

/**
 * A candidate compiled and found past the device (at the search's --fit): its memory, without a
 * simulated step (PriceMode.simulatePastDevice false), which would not rank it.
 */
export interface PastDeviceLayout {
  readonly pastDevice: true;
  readonly layout: Layout;
  readonly name: string;
  /** the plan's largest program at the bounds and at expected sizes; where the compile stopped
   * early (`stoppedAt`), that program's: lower bounds of the plan's */
  readonly peakBound: number;
  readonly peakExpected: number;
  readonly estimate: Estimate;
  /** the program past the device after which the compile stopped (CompileOptions.stopAfter) */
  readonly stoppedAt?: string;
  /** its memory extrapolated from two compiles at a fraction of the batch (sketchSizes) */
  readonly sketched?: boolean;
}

export type EstimateOutcome =
  { readonly estimate: Estimate } | { readonly refused: string } | { readonly error: string };
export type PriceOutcome =
  PricedLayout | PastDeviceLayout | { readonly refused: string } | { readonly error: string };

/** How a candidate is priced. */
export interface PriceMode {
  /** with the plan verifier (the top k, with TuneRequest.verify) */
  readonly verify?: boolean;
  /** from two compiles at a fraction of the batch where the layout has many microbatches
   * (sketchSizes) */
  readonly sketch?: boolean;
  /** simulate a plan past the device too (default true); false: a PastDeviceLayout */
  readonly simulatePastDevice?: boolean;
}

/**
 * Where layouts are estimated and priced: this thread (LocalPricer) or a pool of worker threads
 * (cli/tune-pool.ts). Outcomes come back in the order asked, whoever computed them.
 */
export interface Pricer {
  /** threads it runs on: estimate takes a part for each */
  readonly threads: number;
  /** part i on thread i (its cached graphs are that thread's): outcomes per part, in order */
  estimate(parts: readonly (readonly Layout[])[]): Promise<EstimateOutcome[][]>;
  /** compile and simulate, as `mode` says */
  price(
    items: readonly { readonly layout: Layout; readonly estimate: Estimate }[],
    mode: PriceMode,
  ): Promise<PriceOutcome[]>;
  /** graph-pass runs of the cheaper model so far (reduced models), over all threads */
  readonly graphs: number;
}

export interface TuneRequest extends PricingRequest {
  readonly top: number;
  /** seconds of search after which the rest is reported unpriced */
  readonly timeBudgetS: number;
  readonly onProgress?: (p: TuneProgress) => void;
  /** re-simulate the best with each efficiency family ×0.8 and ×1.2 (the plan fixed) */
  readonly sensitivity?: boolean;
  /** compile the best k again with the plan verifier */
  readonly verify?: boolean;
  /** price every layout the rules allow with the full compiler, whatever its estimate */
  readonly exhaustive?: boolean;
  /** where the work runs (default: this thread) */
  readonly pricer?: Pricer;
}

export interface TuneProgress {
  readonly phase: 'estimate' | 'price';
  /** layouts through this phase so far, of `total` */
  readonly done: number;
  readonly total: number;
  readonly seconds: number;
  readonly best?: PricedLayout;
}

export interface TuneResult {
  /** the best `top` that fit, best first */
  readonly layouts: readonly PricedLayout[];
  /** the best that do not fit, when none fits (closest first) */
  readonly closest: readonly PricedLayout[];
  readonly enumerated: number;
  /** estimated by the cheaper model */
  readonly estimated: number;
  /** compiled (and simulated, but for those past the device) */
  readonly priced: number;
  /** of those, past the device once compiled: not simulated */
  readonly pastDevice: number;
  readonly fitting: number;
  /** skipped without compiling: their static memory alone is past the device (bounds.ts) */
  readonly cannotFit: number;
  /** estimated past the device by more than ESTIMATE_MEMORY_MARGIN: not compiled */
  readonly estimatedPastDevice: number;
  /** estimated below the k-th best priced by more than ESTIMATE_SLACK: not compiled */
  readonly cannotWin: number;
  /** refused by a layout rule: how many, and each rule message's count */
  readonly refused: number;
  readonly refusedBy: readonly { readonly reason: string; readonly layouts: number }[];
  /** failed otherwise: each named with its error */
  readonly failed: readonly { readonly name: string; readonly error: string }[];
  /** left when the time budget ran out (not estimated, or estimated but not priced) */
  readonly unpriced: readonly string[];
  /** graph-pass runs of the cheaper model (reduced models) */
  readonly estimateGraphs: number;
  readonly seconds: number;
  /** the best layout's tokens/s with one efficiency family moved (TuneRequest.sensitivity) */
  readonly sensitivity?: readonly {
    readonly family: EfficiencyFamily;
    readonly factor: number;
    readonly tokensPerSecond: number;
  }[];
}

/** layouts a call of Pricer.estimate takes: the status line moves and the budget is checked between */
const ESTIMATE_CHUNK = 512;
/**
 * candidates a round of pricing takes. Which to price is decided at a round's start from the
 * rounds before it, so the result is the same whatever the number of workers (up to this many
 * run at once).
 */
export const PRICE_ROUND = 4;

/** the estimator's graphs are cached by these: a chunk of neighbours builds few of them */
const estimateOrder = (a: Layout, b: Layout) =>
  a.tp - b.tp ||
  a.ep - b.ep ||
  a.etp - b.etp ||
  a.mbs - b.mbs ||
  a.level - b.level ||
  a.encoderTp - b.encoderTp;
/** layouts of one reduced decoder model (estimate.ts caches its pieces by these) */
const sameModel = (a: Layout, b: Layout) =>
  a.tp === b.tp && a.ep === b.ep && a.etp === b.etp && a.mbs === b.mbs;

/**
 * The layouts' indices dealt to `threads` threads: whole groups of one reduced decoder model
 * (neighbours in estimateOrder), largest first, each to the thread with the fewest so far, so that
 * each thread builds few reduced models and the threads get about as many layouts.
 */
function sharesOf(layouts: readonly Layout[], threads: number): number[][] {
  const order = [...layouts.keys()].sort((i, j) => estimateOrder(layouts[i], layouts[j]) || i - j);
  const groups: number[][] = [];
  for (const i of order) {
    const last = groups[groups.length - 1];
    if (last && sameModel(layouts[last[0]], layouts[i])) last.push(i);
    else groups.push([i]);
  }
  const shares: number[][] = Array.from({ length: Math.max(1, threads) }, () => []);
  for (const g of [...groups].sort((a, b) => b.length - a.length || a[0] - b[0])) {
    let w = 0;
    for (let v = 1; v < shares.length; v++) if (shares[v].length < shares[w].length) w = v;
    shares[w].push(...g);
  }
  return shares;
}

export async function tune(r: TuneRequest): Promise<TuneResult> {
  const start = performance.now();
  const seconds = () => (performance.now() - start) / 1000;
  const pricer = r.pricer ?? new LocalPricer(r);
  const all = enumerateLayouts(r.space);
  const params = layerParams(r.space.config);
  const world = r.space.nnodes * r.space.nprocPerNode;
  const refusedBy = new Map<string, number>();
  const failed: { name: string; error: string }[] = [];
  const unpriced: string[] = [];
  let refused = 0;
  const refuse = (message: string) => {
    refused++;
    const reason = message.replace(/\d+/g, 'N');
    refusedBy.set(reason, (refusedBy.get(reason) ?? 0) + 1);
  };

  // 1. the bounds, the layout rules and the cheaper model, every layout
  const possible = all.filter((l) =>
    fitsOn(staticBytesLowerBound(params, l, world, r.precision), r.device),
  );
  const cannotFit = all.length - possible.length;
  const shares = sharesOf(possible, pricer.threads);
  const size = Math.max(...shares.map((x) => x.length));
  const step = Math.ceil(ESTIMATE_CHUNK / shares.length);
  const outcomes: (EstimateOutcome | undefined)[] = new Array(possible.length);
  for (let k = 0, done = 0; k < size; k += step) {
    r.onProgress?.({ phase: 'estimate', done, total: possible.length, seconds: seconds() });
    if (seconds() > r.timeBudgetS) break;
    const parts = shares.map((share) => share.slice(k, k + step));
    const got = await pricer.estimate(parts.map((part) => part.map((i) => possible[i])));
    parts.forEach((part, w) => part.forEach((i, j) => (outcomes[i] = got[w][j])));
    done += parts.reduce((n, part) => n + part.length, 0);
  }
  const estimated: { layout: Layout; name: string; estimate: Estimate }[] = [];
  possible.forEach((layout, i) => {
    const o = outcomes[i];
    const name = layoutName(layout);
    if (o === undefined) unpriced.push(name);
    else if ('estimate' in o) estimated.push({ layout, name, estimate: o.estimate });
    else if ('refused' in o) refuse(o.refused);
    else failed.push({ name, error: o.error });
  });

  // 2. the candidates compiled and simulated, best estimate first, in rounds
  const need = (x: Peaks) => needAt(r.fit, x);
  const tryable = (e: Estimate) => fitsOn(need(e) / ESTIMATE_MEMORY_MARGIN, r.device);
  const candidates = estimated
    .filter((x) => r.exhaustive || tryable(x.estimate))
    .sort(
      (a, b) =>
        b.estimate.tokensPerSecond - a.estimate.tokensPerSecond ||
        (a.name < b.name ? -1 : a.name > b.name ? 1 : 0),
    );
  const estimatedPastDevice = estimated.length - candidates.length;
  // a candidate compiled either fits (and was simulated) or is past the device (and was not)
  const fitting: PricedLayout[] = [];
  const pastDevice: PastDeviceLayout[] = [];
  let cannotWin = 0;
  for (let k = 0; k < candidates.length;) {
    r.onProgress?.({
      phase: 'price',
      done: k,
      total: candidates.length,
      seconds: seconds(),
      best: fitting[0],
    });
    if (seconds() > r.timeBudgetS) {
      unpriced.push(...candidates.slice(k).map((x) => x.name));
      break;
    }
    // this round: the next candidates that can still win against the k-th best priced so far
    const kth = fitting.length >= r.top ? fitting[r.top - 1] : undefined;
    const round: typeof candidates = [];
    const canWin = (c: (typeof candidates)[number]) =>
      r.exhaustive ||
      !kth ||
      c.estimate.tokensPerSecond >= kth.forecast.tokensPerSecond * (1 - ESTIMATE_SLACK);
    while (k < candidates.length && round.length < PRICE_ROUND && canWin(candidates[k]))
      round.push(candidates[k++]);
    if (!round.length) {
      // best estimate first: none after this one can win either
      cannotWin = candidates.length - k;
      break;
    }
    const got = await pricer.price(round, { sketch: true, simulatePastDevice: false });
    got.forEach((outcome, j) => {
      if ('refused' in outcome) refuse(outcome.refused);
      else if ('error' in outcome) failed.push({ name: round[j].name, error: outcome.error });
      else if ('pastDevice' in outcome) pastDevice.push(outcome);
      else fitting.push(outcome);
    });
    fitting.sort((a, b) => (better(a, b) ? -1 : 1));
  }
  // what the search prints is compiled whole where it was sketched
  const whole = wholeOf(pricer, failed);
  let layouts = await topWhole(fitting, r.top, whole);
  // the best k, once more with the plan verifier when asked: a plan it refuses is a bug
  if (r.verify && layouts.length) {
    const again = await pricer.price(layouts, { verify: true });
    layouts = again.map((a, j) => {
      if (!('forecast' in a))
        throw new Error(`${layouts[j].name}: the verified compile failed: ${whyNotPriced(a)}`);
      return a;
    });
  }
  const sensitivity =
    r.sensitivity && layouts.length ? sensitivityOf(r, layouts[0].layout) : undefined;
  const byNeed = (a: PricedLayout, b: PricedLayout) => need(a) - need(b) || (better(a, b) ? -1 : 1);
  const closest = layouts.length
    ? []
    : (await whole(await nearestOf([...fitting, ...pastDevice], r.top, need, pricer))).sort(byNeed);
  return {
    layouts,
    closest,
    enumerated: all.length,
    estimated: estimated.length,
    priced: fitting.length + pastDevice.length,
    pastDevice: pastDevice.length,
    fitting: fitting.length,
    cannotFit,
    estimatedPastDevice,
    cannotWin,
    refused,
    refusedBy: [...refusedBy]
      .map(([reason, n]) => ({ reason, layouts: n }))
      .sort((a, b) => b.layouts - a.layouts || (a.reason < b.reason ? -1 : 1)),
    failed,
    unpriced,
    estimateGraphs: pricer.graphs,
    seconds: seconds(),
    ...(sensitivity ? { sensitivity } : {}),
  };
}

/**
 * The k nearest the device of `list` by `need`. A compile that stopped early knows a lower bound
 * of its need: such layouts are compiled whole until the k nearest are all exact (each round
 * makes one at least exact, so it ends); one that then fails to compile is left out.
 */
async function nearestOf(
  list: readonly (PricedLayout | PastDeviceLayout)[],
  k: number,
  need: (x: Peaks) => number,
  pricer: Pricer,
): Promise<(PricedLayout | PastDeviceLayout)[]> {
  const nearest = (a: PricedLayout | PastDeviceLayout, b: PricedLayout | PastDeviceLayout) =>
    need(a) - need(b) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
  let pool = [...list];
  for (;;) {
    pool.sort(nearest);
    const head = pool.slice(0, k);
    const inexact = head.filter((x) => 'stoppedAt' in x);
    if (!inexact.length) return head;
    const got = await pricer.price(inexact, {});
    pool = pool.flatMap((x) => {
      const j = inexact.indexOf(x);
      if (j < 0) return [x];
      const w = got[j];
      return 'forecast' in w || 'pastDevice' in w ? [w] : [];
    });
  }
}

/**
 * `list` with each sketched layout priced again whole, and each not simulated (past the device)
 * priced with its simulation; one that then fails is named in `failed`.
 */
function wholeOf(
  pricer: Pricer,
  failed: { name: string; error: string }[],
): (list: readonly (PricedLayout | PastDeviceLayout)[]) => Promise<PricedLayout[]> {
  return async (list) => {
    const again = list.filter((x) => x.sketched || 'pastDevice' in x);
    const got = again.length ? await pricer.price(again, {}) : [];
    const out: PricedLayout[] = [];
    for (const x of list) {
      const w = again.includes(x) ? got[again.indexOf(x)] : x;
      if ('forecast' in w) out.push(w);
      else failed.push({ name: x.name, error: whyNotPriced(w) });
    }
    return out;
  };
}

/** The best `top` of `fitting` (best first) that still fit once compiled whole. */
async function topWhole(
  fitting: readonly PricedLayout[],
  top: number,
  whole: (list: readonly PricedLayout[]) => Promise<PricedLayout[]>,
): Promise<PricedLayout[]> {
  const out: PricedLayout[] = [];
  for (let i = 0; out.length < top && i < fitting.length;) {
    const next = fitting.slice(i, i + top - out.length);
    i += next.length;
    out.push(...(await whole(next)).filter((x) => x.fits));
  }
  return out.sort((a, b) => (better(a, b) ? -1 : 1));
}

/** The estimates and prices of layouts on this thread (and in each worker of the pool). */
export class LocalPricer implements Pricer {
  private readonly estimator: Estimator;
  private readonly presetEncoderTp: number;
  private readonly configs = new Map<string, ModelConfig>();

  constructor(private readonly r: PricingRequest) {
    this.estimator = new Estimator({
      space: r.space,
      hardware: r.hardware,
      precision: r.precision,
    });
    this.presetEncoderTp = r.space.config.model.image_encoder.tensor_model_parallel_size;
  }

  get graphs(): number {
    return this.estimator.graphs;
  }

  estimateOne(layout: Layout): EstimateOutcome {
    try {
      const options = layoutOptions(this.r.baseOptions, layout, this.presetEncoderTp);
      // the model of each set of overrides (the encoder's TP) loaded once, not per layout
      const key = JSON.stringify(options.overrides ?? []);
      let config = this.configs.get(key);
      if (!config) {
        config = loadModelConfig(options.model, options.overrides ?? []);
        this.configs.set(key, config);
      }
      checkLayout(options, config);
      return { estimate: this.estimator.estimate(layout, options) };
    } catch (e) {
      if (e instanceof UserError) return { refused: e.message };
      return { error: e instanceof Error ? e.message : String(e) };
    }
  }

  priceOne(layout: Layout, estimate: Estimate, mode: PriceMode): PriceOutcome {
    const sizes = mode.sketch && !mode.verify ? sketchSizes(this.r, layout) : undefined;
    const simulatePastDevice = mode.simulatePastDevice ?? true;
    return sizes
      ? sketchOf(this.r, layout, estimate, sizes, simulatePastDevice)
      : price(this.r, layout, estimate, { skipVerify: !mode.verify, simulatePastDevice });
  }

  readonly threads = 1;

  estimate(parts: readonly (readonly Layout[])[]): Promise<EstimateOutcome[][]> {
    return Promise.resolve(parts.map((part) => part.map((l) => this.estimateOne(l))));
  }

  price(
    items: readonly { readonly layout: Layout; readonly estimate: Estimate }[],
    mode: PriceMode,
  ): Promise<PriceOutcome[]> {
    return Promise.resolve(items.map((x) => this.priceOne(x.layout, x.estimate, mode)));
  }
}

/** A layout's plan re-simulated with each efficiency family ×0.8 and ×1.2. */
function sensitivityOf(r: TuneRequest, layout: Layout): NonNullable<TuneResult['sensitivity']> {
  const presetEncoderTp = r.space.config.model.image_encoder.tensor_model_parallel_size;
  const result = compile({
    ...layoutOptions(r.baseOptions, layout, presetEncoderTp),
    skipVerify: true,
  });
  const programs = new Map(result.programs.map((p) => [p.id, p]));
  return EFFICIENCY_FAMILIES.flatMap((family) =>
    [0.8, 1.2].map((factor) => ({
      family,
      factor,
      tokensPerSecond: forecastStep(
        result.modelForwardFlops,
        result.plan,
        programs,
        scaleEfficiency(r.hardware, family, factor),
      ).forecast.tokensPerSecond,
    })),
  );
}

const better = (a: PricedLayout, b: PricedLayout) =>
  a.forecast.tokensPerSecond > b.forecast.tokensPerSecond ||
  (a.forecast.tokensPerSecond === b.forecast.tokensPerSecond && a.name < b.name);

/**
 * Microbatches per pipeline from which a candidate of the search is sketched: priced from two
 * compiles at 1/8 and 1/4 of the global batch, its step and peak memory extrapolated linearly to
 * the whole batch. A step is linear in the microbatches once the schedule is in its steady state:
 * measured, Qwen3-VL-235B-A22B at tp 4, pp 8, vpp 4, ep 8 on 256 H100 simulates 2.2568 s at 32
 * microbatches and 4.1422 s at 64, which give 15.4546 s at 256, where compiled whole it is 15.4541
 * s (docs/tune.md). The two compiles took 14.2 s, the whole one 35.4 s.
 */
export const SKETCH_MIN_MICROBATCHES = 64;

/** A candidate's microbatches per pipeline `m` and the two counts it is sketched at, or
 * undefined: priced whole. */
interface SketchSizes {
  readonly m: number;
  readonly m1: number;
  readonly m2: number;
}
function sketchSizes(r: PricingRequest, l: Layout): SketchSizes | undefined {
  const world = r.space.nnodes * r.space.nprocPerNode;
  const m = (r.space.globalBatchSize * l.tp * l.pp) / (l.mbs * world);
  if (!Number.isInteger(m) || m < SKETCH_MIN_MICROBATCHES || m % 8) return undefined;
  const [m1, m2] = [m / 8, m / 4];
  // whole pipeline rounds, and level 3's encoding rounds without mock slots
  if (m1 % (l.tp * l.pp) || m1 < 2 * l.pp * l.vpp) return undefined;
  return { m, m1, m2 };
}

/**
 * A layout priced from compiles at m1 and m2 microbatches per pipeline (sketchSizes); without
 * `simulatePastDevice`, one whose extrapolated memory is past the device is not simulated.
 */
function sketchOf(
  r: PricingRequest,
  layout: Layout,
  estimate: Estimate,
  { m, m1, m2 }: SketchSizes,
  simulatePastDevice: boolean,
): PriceOutcome {
  const batch = (k: number) => (r.space.globalBatchSize * k) / m;
  // compiled whole (not stopped early): the extrapolation needs both plans' peaks
  const ca = compiled(r, layout, true, batch(m1));
  if (!('result' in ca)) return ca;
  const cb = compiled(r, layout, true, batch(m2));
  if (!('result' in cb)) return cb;
  const at = (x1: number, x2: number) => x2 + ((x2 - x1) * (m - m2)) / (m2 - m1);
  const peakBound = at(ca.peakBound, cb.peakBound);
  const peakExpected = at(ca.peakExpected, cb.peakExpected);
  const fits = fitsOn(needAt(r.fit, { peakBound, peakExpected }), r.device);
  if (!fits && !simulatePastDevice)
    return pastDeviceOf(layout, estimate, { peakBound, peakExpected, sketched: true });
  const a = simulated(r, layout, estimate, ca, true);
  if (!('forecast' in a)) return a;
  const b = simulated(r, layout, estimate, cb, true);
  if (!('forecast' in b)) return b;
  const f = b.forecast;
  const stepSeconds = at(a.forecast.stepSeconds, f.stepSeconds);
  const scale = m / m2;
  return {
    ...b,
    forecast: {
      ...f,
      stepSeconds,
      tokensPerStep: f.tokensPerStep * scale,
      tokensPerSecond: (f.tokensPerStep * scale) / stepSeconds,
      modelFlopsPerStep: f.modelFlopsPerStep * scale,
      mfu: (f.mfu * scale * f.stepSeconds) / stepSeconds,
    },
    peakBound,
    peakExpected,
    fits,
    sketched: true,
  };
}

/** why an outcome holds no simulated step */
const whyNotPriced = (o: Exclude<PriceOutcome, PricedLayout>): string =>
  'error' in o ? o.error : 'refused' in o ? o.refused : 'past the device, not simulated';

/** a plan's (or a program's) device bytes per rank, at the bounds and at expected sizes */
interface Peaks {
  readonly peakBound: number;
  readonly peakExpected: number;
}

/** what a search's --fit weighs a plan by */
const needAt = (fit: PricingRequest['fit'], x: Peaks) =>
  fit === 'bound' ? x.peakBound : x.peakExpected;

/** A layout compiled: its plan and its memory against the device. */
interface Compiled {
  readonly result: CompileResult;
  readonly memory: readonly ProgramMemory[];
  readonly peakBound: number;
  readonly peakExpected: number;
  readonly fits: boolean;
}

/**
 * A layout compiled (at `globalBatchSize`, else the request's). `stopAfter` goes to the compiler:
 * the CompileStopped it throws passes through.
 */
function compiled(
  r: PricingRequest,
  layout: Layout,
  skipVerify: boolean,
  globalBatchSize?: number,
  stopAfter?: CompileOptions['stopAfter'],
): Compiled | { refused: string } | { error: string } {
  const presetEncoderTp = r.space.config.model.image_encoder.tensor_model_parallel_size;
  let result: CompileResult;
  try {
    const options = layoutOptions(r.baseOptions, layout, presetEncoderTp);
    result = compile({
      ...options,
      ...(globalBatchSize !== undefined ? { globalBatchSize } : {}),
      skipVerify,
      ...(stopAfter ? { stopAfter } : {}),
    });
  } catch (e) {
    if (e instanceof CompileStopped) throw e;
    if (e instanceof UserError) return { refused: e.message };
    return { error: e instanceof Error ? e.message : String(e) };
  }
  const memory = memoryByProgram(result, r.device);
  const peakBound = Math.max(...memory.map((m) => m.bound.deviceBytes));
  const peakExpected = Math.max(...memory.map((m) => m.expected.deviceBytes));
  const fits = fitsOn(needAt(r.fit, { peakBound, peakExpected }), r.device);
  return { result, memory, peakBound, peakExpected, fits };
}

/** A compiled layout with its simulated step. */
function simulated(
  r: PricingRequest,
  layout: Layout,
  estimate: Estimate,
  c: Compiled,
  skipVerify: boolean,
): PricedLayout | { error: string } {
  const programs = new Map(c.result.programs.map((p) => [p.id, p]));
  let forecast: PricedLayout['forecast'];
  try {
    ({ forecast } = forecastStep(c.result.modelForwardFlops, c.result.plan, programs, r.hardware));
  } catch (e) {
    // a plan the simulator cannot replay (unverified: a compiler bug): named, not fatal
    return { error: e instanceof Error ? e.message : String(e) };
  }
  return {
    layout,
    name: layoutName(layout),
    flags: flagsOf(layout, r.space.config.model.image_encoder.tensor_model_parallel_size),
    forecast,
    memory: c.memory,
    peakBound: c.peakBound,
    peakExpected: c.peakExpected,
    fits: c.fits,
    verified: !skipVerify,
    estimate,
  };
}

const pastDeviceOf = (
  layout: Layout,
  estimate: Estimate,
  x: Peaks & { readonly stoppedAt?: string; readonly sketched?: boolean },
): PastDeviceLayout => ({
  pastDevice: true,
  layout,
  name: layoutName(layout),
  peakBound: x.peakBound,
  peakExpected: x.peakExpected,
  estimate,
  ...(x.stoppedAt !== undefined ? { stoppedAt: x.stoppedAt } : {}),
  ...(x.sketched ? { sketched: true } : {}),
});

/**
 * A layout compiled whole and simulated; without `simulatePastDevice`, the compile stops after the
 * first program past the device (so a compile that finishes fits), and that program's need is
 * what is known of the plan's.
 */
function price(
  r: PricingRequest,
  layout: Layout,
  estimate: Estimate,
  how: { readonly skipVerify: boolean; readonly simulatePastDevice: boolean },
): PriceOutcome {
  const past = (p: ProgramFile) => {
    const bytes = programDeviceBytes(p, r.device);
    return !fitsOn(
      needAt(r.fit, { peakBound: bytes.bound, peakExpected: bytes.expected }),
      r.device,
    );
  };
  let c: ReturnType<typeof compiled>;
  try {
    c = compiled(r, layout, how.skipVerify, undefined, how.simulatePastDevice ? undefined : past);
  } catch (e) {
    if (!(e instanceof CompileStopped)) throw e;
    const bytes = programDeviceBytes(e.program, r.device);
    const stoppedAt = e.program.id;
    return pastDeviceOf(layout, estimate, {
      peakBound: bytes.bound,
      peakExpected: bytes.expected,
      stoppedAt,
    });
  }
  if (!('result' in c)) return c;
  return simulated(r, layout, estimate, c, how.skipVerify);
}
