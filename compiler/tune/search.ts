// The search of `lfc tune`: every layout of the space (space.ts) compiled and simulated, ranked by
// predicted tokens/s among those that fit, the best k compiled again with the plan verifier.
//
// Each layout is priced by the compiler itself: its flags go through the same parse as an
// `lfc compile` command line (the caller's optionsOf), the plan is built without the verifier,
// its memory is read off the plan (compiler/report/memory.ts) and its step off the simulator
// (compiler/sim). The figures the tuner prints for a layout are therefore the ones `lfc compile`
// of its line gives. A layout the layout rules refuse is counted with the rule's message; one
// that fails in any other way is named with its error, never dropped silently.
//
// Order: while no layout priced fits, the most memory-saving come first (recompute, offload, the
// distributed optimizer, wider tp, smaller micro-batches); once one fits, the cheapest-looking
// (fewest pipeline bubbles, then least recompute; ties in enumeration order), so that a time
// budget cuts the least promising ones. Without a cut the result does not depend on the order:
// the ranking is by tokens/s, then by the layout's name. A layout not priced within the budget
// is reported as such.

import type { Precision } from '../frontend/precision.js';
import { layerParams, staticBytesLowerBound } from './bounds.js';
import { UserError } from '../errors.js';
import type { CompileOptions, CompileResult } from '../pipeline.js';
import { compile } from '../pipeline.js';
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
import {
  enumerateLayouts,
  flagsOf,
  layoutName,
  type Layout,
  type SearchSpaceRequest,
} from './space.js';

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
  /** whether the plan verifier has checked it (the top k) */
  readonly verified: boolean;
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
  /** seconds of pricing after which the rest is reported unpriced */
  readonly timeBudgetS: number;
  readonly onProgress?: (p: TuneProgress) => void;
  /** re-simulate the best with each efficiency family ×0.8 and ×1.2 (the plan fixed) */
  readonly sensitivity?: boolean;
}

export interface TuneProgress {
  readonly priced: number;
  readonly total: number;
  readonly seconds: number;
  readonly best?: PricedLayout;
}

export interface TuneResult {
  /** the best `top` that fit, best first, each verified */
  readonly layouts: readonly PricedLayout[];
  /** the best that do not fit, when none fits (closest first) */
  readonly closest: readonly PricedLayout[];
  readonly enumerated: number;
  readonly priced: number;
  readonly fitting: number;
  /** skipped without compiling: their static memory alone is past the device (bounds.ts) */
  readonly cannotFit: number;
  /** refused by a layout rule: how many, and each rule message's count */
  readonly refused: number;
  readonly refusedBy: readonly { readonly reason: string; readonly layouts: number }[];
  /** failed otherwise: each named with its error */
  readonly failed: readonly { readonly name: string; readonly error: string }[];
  /** left when the time budget ran out */
  readonly unpriced: readonly string[];
  readonly seconds: number;
  /** the best layout's tokens/s with one efficiency family moved (TuneRequest.sensitivity) */
  readonly sensitivity?: readonly {
    readonly family: EfficiencyFamily;
    readonly factor: number;
    readonly tokensPerSecond: number;
  }[];
}

/** Priority under a time budget: fewer bubbles first, then less recompute. */
function promise(l: Layout, req: SearchSpaceRequest): number {
  const dp = (req.nnodes * req.nprocPerNode) / (l.tp * l.pp);
  const m = req.globalBatchSize / (l.mbs * dp);
  const bubble = (l.pp - 1) / (l.vpp * m);
  const recompute = { none: 1, selective: 1.1, full: 1.33 }[l.recompute];
  return (1 + bubble) * recompute;
}

/** Most memory-saving first: recompute, offload, the distributed optimizer, tp, mbs, pp · ep. */
function memoryKey(l: Layout): number[] {
  const recompute = { full: 0, selective: 1, none: 2 }[l.recompute];
  return [recompute, l.offload ? 0 : 1, l.distopt ? 0 : 1, -l.tp, l.mbs, -l.pp * l.ep];
}

export function tune(r: TuneRequest): TuneResult {
  const start = performance.now();
  const seconds = () => (performance.now() - start) / 1000;
  const all = enumerateLayouts(r.space);
  // two orders of the same layouts: the most memory-saving first while none priced fits, the
  // fewest bubbles first once one does
  const keyed = all.map((layout, i) => ({ layout, i, p: promise(layout, r.space) }));
  const byPromise = [...keyed].sort((a, b) => a.p - b.p || a.i - b.i);
  const byMemory = [...keyed].sort((a, b) => {
    const m = memoryKey(a.layout);
    const n = memoryKey(b.layout);
    for (let j = 0; j < m.length; j++) if (m[j] !== n[j]) return m[j] - n[j];
    return a.p - b.p || a.i - b.i;
  });
  const done = new Uint8Array(all.length);
  const cursor = { promise: 0, memory: 0 };
  const next = (fits: boolean): (typeof keyed)[number] | undefined => {
    const [list, at] = fits ? [byPromise, 'promise' as const] : [byMemory, 'memory' as const];
    while (cursor[at] < list.length && done[list[cursor[at]].i]) cursor[at]++;
    return list[cursor[at]];
  };
  const priced: PricedLayout[] = [];
  const refusedBy = new Map<string, number>();
  const failed: { name: string; error: string }[] = [];
  const unpriced: string[] = [];
  let refused = 0;
  let cannotFit = 0;
  let best: PricedLayout | undefined;
  const params = layerParams(r.space.config);
  const world = r.space.nnodes * r.space.nprocPerNode;
  for (let k = 0; k < all.length; k++) {
    const item = next(best !== undefined)!;
    if (seconds() > r.timeBudgetS) {
      unpriced.push(...byPromise.filter((x) => !done[x.i]).map((x) => layoutName(x.layout)));
      break;
    }
    done[item.i] = 1;
    const layout = item.layout;
    const floor = staticBytesLowerBound(params, layout, world, r.precision);
    if (!fitsOn(floor, r.device)) {
      cannotFit++;
      continue;
    }
    const outcome = price(r, layout, true);
    if ('refused' in outcome) {
      refused++;
      const reason = outcome.refused.replace(/\d+/g, 'N');
      refusedBy.set(reason, (refusedBy.get(reason) ?? 0) + 1);
    } else if ('error' in outcome) failed.push({ name: layoutName(layout), error: outcome.error });
    else {
      priced.push(outcome);
      if (outcome.fits && (!best || better(outcome, best))) best = outcome;
    }
    r.onProgress?.({ priced: k + 1, total: all.length, seconds: seconds(), best });
  }
  const fitting = priced.filter((p) => p.fits).sort((a, b) => (better(a, b) ? -1 : 1));
  // the best k once more, with the plan verifier: a plan it refuses is a bug, not a ranking
  const layouts = fitting.slice(0, r.top).map((p) => {
    const again = price(r, p.layout, false);
    if (!('forecast' in again))
      throw new Error(
        `${p.name}: the verified compile failed: ${'error' in again ? again.error : again.refused}`,
      );
    return again;
  });
  const sensitivity =
    r.sensitivity && layouts.length ? sensitivityOf(r, layouts[0].layout) : undefined;
  const need = (p: PricedLayout) => (r.fit === 'bound' ? p.peakBound : p.peakExpected);
  const closest = fitting.length
    ? []
    : [...priced].sort((a, b) => need(a) - need(b) || (better(a, b) ? -1 : 1)).slice(0, r.top);
  return {
    layouts,
    closest,
    enumerated: all.length,
    priced: priced.length,
    fitting: fitting.length,
    cannotFit,
    refused,
    refusedBy: [...refusedBy]
      .map(([reason, n]) => ({ reason, layouts: n }))
      .sort((a, b) => b.layouts - a.layouts),
    failed,
    unpriced,
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
  };
}
