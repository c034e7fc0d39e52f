// The search of `lfc tune`, in two passes over the space (space.ts):
//
//   1. every layout through the analytic bounds and the cheaper model. A layout whose weights
//      and optimizer state alone are past the device (bounds.ts) is skipped; one the layout rules
//      refuse is counted with the rule's message; every other is estimated (estimate.ts: its
//      step and memory without emission or simulation, from priced pieces of a reduced model).
//   2. the candidates compiled and simulated, best estimate first: those estimated to fit
//      (within the estimate's margin, ESTIMATE_MEMORY_MARGIN, so that a layout the estimate
//      overstates is still tried), then those estimated just past the device. A candidate is
//      compiled unless `top` layouts that fit have been priced and its estimate is below the
//      k-th best's priced tokens/s by more than the estimate's error (ESTIMATE_SLACK): it cannot
//      win. The figures the tuner prints are the priced ones, so a printed line compiles to them.
//
// Each priced layout goes through the same parse as an `lfc compile` command line (the caller's
// optionsOf) and the compiler itself: memory off the plan (compiler/report/memory.ts), the step
// off the simulator (compiler/sim). One that fails is named with its error, never dropped. The
// ranking is by tokens/s, then by the layout's name, so the result does not depend on the order
// of pricing; `exhaustive` prices every layout the rules allow (the test of search quality does).
// A layout left when the time budget runs out is reported as such. With `verify`, the best k are
// compiled once more with the plan verifier.

import type { Precision } from '../frontend/precision.js';
import { layerParams, staticBytesLowerBound } from './bounds.js';
import { UserError } from '../errors.js';
import type { CompileOptions, CompileResult } from '../pipeline.js';
import { checkLayout, compile } from '../pipeline.js';
import {
  fitsOn,
  memoryByProgram,
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
  layoutName,
  type Layout,
  type SearchSpaceRequest,
} from './space.js';

/** the estimate's memory may overstate a plan's by this factor: candidates up to it are tried */
export const ESTIMATE_MEMORY_MARGIN = 1.2;
/** the estimate's tokens/s may understate a plan's by this share: below it a layout cannot win */
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
}

export interface TuneRequest {
  readonly space: SearchSpaceRequest;
  /** a layout's compile options from its flags: the parse `lfc compile` applies to them */
  readonly optionsOf: (flags: readonly string[]) => CompileOptions;
  readonly hardware: HardwareProfile;
  readonly device: DeviceMemory;
  /** the request's precision: the static-memory bound's bytes per parameter */
  readonly precision: Precision;
  /** fit at the bounds (what a rank can need) or at expected sizes (a typical step) */
  readonly fit: 'bound' | 'expected';
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
  /** compiled and simulated */
  readonly priced: number;
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

export function tune(r: TuneRequest): TuneResult {
  const start = performance.now();
  const seconds = () => (performance.now() - start) / 1000;
  const all = enumerateLayouts(r.space);
  const presetEncoderTp = r.space.config.model.image_encoder.tensor_model_parallel_size;
  const params = layerParams(r.space.config);
  const world = r.space.nnodes * r.space.nprocPerNode;
  const estimator = new Estimator({
    space: r.space,
    hardware: r.hardware,
    precision: r.precision,
  });
  const refusedBy = new Map<string, number>();
  const failed: { name: string; error: string }[] = [];
  const unpriced: string[] = [];
  let refused = 0;
  let cannotFit = 0;
  const refuse = (message: string) => {
    refused++;
    const reason = message.replace(/\d+/g, 'N');
    refusedBy.set(reason, (refusedBy.get(reason) ?? 0) + 1);
  };

  // 1. the bounds, the layout rules and the cheaper model, every layout
  const estimated: { layout: Layout; name: string; estimate: Estimate }[] = [];
  for (let k = 0; k < all.length; k++) {
    const layout = all[k];
    if (seconds() > r.timeBudgetS) {
      unpriced.push(...all.slice(k).map(layoutName));
      break;
    }
    r.onProgress?.({ phase: 'estimate', done: k, total: all.length, seconds: seconds() });
    if (!fitsOn(staticBytesLowerBound(params, layout, world, r.precision), r.device)) {
      cannotFit++;
      continue;
    }
    const name = layoutName(layout);
    try {
      const options = r.optionsOf(flagsOf(layout, presetEncoderTp));
      checkLayout(options);
      estimated.push({ layout, name, estimate: estimator.estimate(layout, options) });
    } catch (e) {
      if (e instanceof UserError) refuse(e.message);
      else failed.push({ name, error: e instanceof Error ? e.message : String(e) });
    }
  }

  // 2. the candidates compiled and simulated, best estimate first
  const need = (x: { peakBound: number; peakExpected: number }) =>
    r.fit === 'bound' ? x.peakBound : x.peakExpected;
  const band = (e: Estimate) =>
    fitsOn(need(e), r.device) ? 0 : fitsOn(need(e) / ESTIMATE_MEMORY_MARGIN, r.device) ? 1 : 2;
  const candidates = estimated
    .map((x) => ({ ...x, band: r.exhaustive ? 0 : band(x.estimate) }))
    .filter((x) => x.band < 2)
    .sort(
      (a, b) =>
        a.band - b.band ||
        b.estimate.tokensPerSecond - a.estimate.tokensPerSecond ||
        (a.name < b.name ? -1 : a.name > b.name ? 1 : 0),
    );
  const estimatedPastDevice = estimated.length - candidates.length;
  const priced: PricedLayout[] = [];
  const fitting: PricedLayout[] = [];
  let best: PricedLayout | undefined;
  let cannotWin = 0;
  for (let k = 0; k < candidates.length; k++) {
    const c = candidates[k];
    if (seconds() > r.timeBudgetS) {
      unpriced.push(...candidates.slice(k).map((x) => x.name));
      break;
    }
    r.onProgress?.({
      phase: 'price',
      done: k,
      total: candidates.length,
      seconds: seconds(),
      best,
    });
    const kth = fitting.length >= r.top ? fitting[r.top - 1] : undefined;
    if (
      !r.exhaustive &&
      kth &&
      c.estimate.tokensPerSecond < kth.forecast.tokensPerSecond * (1 - ESTIMATE_SLACK)
    ) {
      cannotWin++;
      continue;
    }
    const outcome = price(r, c.layout, c.estimate, true);
    if ('refused' in outcome) refuse(outcome.refused);
    else if ('error' in outcome) failed.push({ name: c.name, error: outcome.error });
    else {
      priced.push(outcome);
      if (outcome.fits) {
        fitting.push(outcome);
        fitting.sort((a, b) => (better(a, b) ? -1 : 1));
        best = fitting[0];
      }
    }
  }
  // the best k, once more with the plan verifier when asked: a plan it refuses is a bug
  const layouts = fitting.slice(0, r.top).map((p) => {
    if (!r.verify) return p;
    const again = price(r, p.layout, p.estimate, false);
    if (!('forecast' in again))
      throw new Error(
        `${p.name}: the verified compile failed: ${'error' in again ? again.error : again.refused}`,
      );
    return again;
  });
  const sensitivity =
    r.sensitivity && layouts.length ? sensitivityOf(r, layouts[0].layout) : undefined;
  const closest = fitting.length
    ? []
    : [...priced].sort((a, b) => need(a) - need(b) || (better(a, b) ? -1 : 1)).slice(0, r.top);
  return {
    layouts,
    closest,
    enumerated: all.length,
    estimated: estimated.length,
    priced: priced.length,
    fitting: fitting.length,
    cannotFit,
    estimatedPastDevice,
    cannotWin,
    refused,
    refusedBy: [...refusedBy]
      .map(([reason, n]) => ({ reason, layouts: n }))
      .sort((a, b) => b.layouts - a.layouts),
    failed,
    unpriced,
    estimateGraphs: estimator.graphs,
    seconds: seconds(),
    ...(sensitivity ? { sensitivity } : {}),
  };
}

/** A layout's plan re-simulated with each efficiency family ×0.8 and ×1.2. */
function sensitivityOf(r: TuneRequest, layout: Layout): NonNullable<TuneResult['sensitivity']> {
  const flags = flagsOf(layout, r.space.config.model.image_encoder.tensor_model_parallel_size);
  const result = compile({ ...r.optionsOf(flags), skipVerify: true });
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

function price(
  r: TuneRequest,
  layout: Layout,
  estimate: Estimate,
  skipVerify: boolean,
): PricedLayout | { refused: string } | { error: string } {
  const flags = flagsOf(layout, r.space.config.model.image_encoder.tensor_model_parallel_size);
  let result: CompileResult;
  try {
    result = compile({ ...r.optionsOf(flags), skipVerify });
  } catch (e) {
    if (e instanceof UserError) return { refused: e.message };
    return { error: e instanceof Error ? e.message : String(e) };
  }
  const memory = memoryByProgram(result, r.device);
  const peakBound = Math.max(...memory.map((m) => m.bound.deviceBytes));
  const peakExpected = Math.max(...memory.map((m) => m.expected.deviceBytes));
  const programs = new Map(result.programs.map((p) => [p.id, p]));
  let forecast: PricedLayout['forecast'];
  try {
    ({ forecast } = forecastStep(result.modelForwardFlops, result.plan, programs, r.hardware));
  } catch (e) {
    // a plan the simulator cannot replay (unverified: a compiler bug): named, not fatal
    return { error: e instanceof Error ? e.message : String(e) };
  }
  return {
    layout,
    name: layoutName(layout),
    flags,
    forecast,
    memory,
    peakBound,
    peakExpected,
    fits: fitsOn(r.fit === 'bound' ? peakBound : peakExpected, r.device),
    verified: !skipVerify,
    estimate,
  };
}
