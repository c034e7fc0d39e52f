// lfc tune <model> --nnodes N --nproc-per-node G --hardware X: the best layouts of a model on a
// cluster, each compiled and simulated (compiler/tune), printed with the `lfc compile` line that
// gives its figures.

import { Command, Option } from 'commander';
import { UserError } from '../compiler/errors.js';
import { loadDataProfile } from '../compiler/frontend/data-profile.js';
import {
  ESTIMATE_MEMORY_MARGIN,
  ESTIMATE_SLACK,
  tune,
  type PricedLayout,
  type TuneResult,
} from '../compiler/tune/search.js';
import { FEATURES, KNOBS, parseExclude, parseFix } from '../compiler/tune/space.js';
import { simulatedOn } from '../compiler/sim/report.js';
import { defaultWorkers, pricingRequestOf, TunePool, type TuneSpec } from './tune-pool.js';
import { join } from 'node:path';
import { addCompileCommand, dispatcherType, mib } from './compile.js';
import type { CliIO } from './io.js';
import { atLeastOne, positiveInt, positiveNumber } from './options.js';

interface TuneFlags {
  nnodes?: number;
  nprocPerNode?: number;
  hardware?: string;
  attentionKernel?: string;
  seqLength?: number;
  globalBatchSize?: number;
  bf16?: boolean;
  dataProfile?: string;
  moeTokenDispatcherType?: 'alltoall' | 'flex';
  moeExpectedImbalance?: number;
  moeRoutingImbalance?: number;
  top: number;
  fix: string[];
  exclude: string[];
  timeBudget: number;
  fit: 'bound' | 'expected';
  json?: boolean;
  sensitivity?: boolean;
  verify?: boolean;
  exhaustive?: boolean;
  workers?: number;
  plans?: string;
}

const ENCODER_TP = 'model.image_encoder.tensor_model_parallel_size';

export function addTuneCommand(program: Command, io: CliIO, isTTY: () => boolean): void {
  program
    .command('tune')
    .description(
      'search the layouts of a model on a cluster: each compiled and simulated, the best that fit ranked by predicted tokens/s',
    )
    .argument('<model>', 'preset name, LoongForge alias or YAML file')
    .argument('[overrides...]', 'Hydra-style overrides: key=value, +key=value, ~key')
    .requiredOption('--nnodes <n>', 'nodes in the cluster', positiveInt('--nnodes'))
    .requiredOption('--nproc-per-node <n>', 'GPUs per node', positiveInt('--nproc-per-node'))
    .option('--hardware <name|file>', 'the hardware profile (default h800)')
    .option(
      '--attention-kernel <name>',
      "the attention kernel layouts are priced with, one the profile has figures for (default: the profile's)",
    )
    .option(
      '--seq-length <n>',
      "tokens per sequence (default: the preset's)",
      positiveInt('--seq-length'),
    )
    .option(
      '--global-batch-size <n>',
      'sequences per step (default: the ranks)',
      positiveInt('--global-batch-size'),
    )
    .option('--bf16', 'bf16 mixed precision')
    .option('--data-profile <name|file>', 'what a packed microbatch holds (configs/data)')
    .option(
      '--moe-token-dispatcher-type <type>',
      "the MoE token dispatcher of every layout: alltoall (default), or flex (DeepEP's, priced with its node deduplication)",
      dispatcherType,
    )
    .option(
      '--moe-expected-imbalance <f>',
      "the busiest expert-parallel rank's rows as a multiple of balanced routing's, for every layout (default: the model's, else 1: balanced). The model zoo's dropless Qwen3-235B-A22B run at tp 4, ep 8 matches 1.49 (docs/tune.md)",
      atLeastOne('--moe-expected-imbalance'),
    )
    .option(
      '--moe-routing-imbalance <f>',
      "plan every layout's expert dispatch for up to f times balanced routing's rows, as lfc compile does (default: the model's, else the dropless worst case, which few large MoE layouts fit at the bounds)",
      atLeastOne('--moe-routing-imbalance'),
    )
    .option('--top <k>', 'layouts to print', positiveInt('--top'), 5)
    .option(
      '--fix <knob=value...>',
      `pin knobs (${KNOBS.join(', ')}); values may be listed with |: level=1|3`,
      (v: string, prev: string[]) => [...prev, v],
      [],
    )
    .option(
      '--exclude <feature...>',
      `leave features out: ${Object.keys(FEATURES).join(', ')}`,
      (v: string, prev: string[]) => [...prev, v],
      [],
    )
    .option(
      '--time-budget <s>',
      'seconds of search; what is left is named, not priced',
      positiveNumber('--time-budget'),
      600,
    )
    .addOption(
      new Option('--fit <where>', 'memory must fit at the bounds or at expected sizes')
        .choices(['bound', 'expected'])
        .default('bound'),
    )
    .option(
      '--sensitivity',
      "re-simulate the best layout with each of the profile's efficiency families moved ±20%, one at a time",
    )
    .option('--verify', 'compile the best k again with the plan verifier')
    .option(
      '--exhaustive',
      'compile and simulate every layout the rules allow, not only those the estimate ranks first',
    )
    .option(
      '--workers <n>',
      `worker threads that estimate and compile layouts; 1: this thread (default: a core each, at most 8; here ${defaultWorkers()})`,
      positiveInt('--workers'),
    )
    .option(
      '--plans <dir>',
      'compile the printed layouts into DIR/1, DIR/2, … (plans with their reports), to see them side by side with lfc viz or lfc compare',
    )
    .option('--json', 'print the result as JSON')
    .action(async (model: string, overrides: string[], f: TuneFlags) => {
      if (overrides.some((o) => o.replace(/^\+/, '').startsWith(`${ENCODER_TP}=`)))
        throw new UserError(
          `tune: the encoder's TP is a knob of the search: use --fix encoder-tp=N, not ${ENCODER_TP}`,
        );
      const fix = parseFix(f.fix);
      const exclude = parseExclude(f.exclude.flatMap((e) => e.split(',')));
      const hardware = f.hardware ?? 'h800';
      const world = f.nnodes! * f.nprocPerNode!;
      const globalBatchSize = f.globalBatchSize ?? world;
      const base = [
        model,
        ...overrides,
        '--nnodes',
        String(f.nnodes),
        '--nproc-per-node',
        String(f.nprocPerNode),
        ...(f.seqLength ? ['--seq-length', String(f.seqLength)] : []),
        '--global-batch-size',
        String(globalBatchSize),
        ...(f.bf16 ? ['--bf16'] : []),
        ...(f.dataProfile ? ['--data-profile', f.dataProfile] : []),
        ...(f.moeTokenDispatcherType
          ? ['--moe-token-dispatcher-type', f.moeTokenDispatcherType]
          : []),
        ...(f.moeExpectedImbalance
          ? ['--moe-expected-imbalance', String(f.moeExpectedImbalance)]
          : []),
        ...(f.moeRoutingImbalance
          ? ['--moe-routing-imbalance', String(f.moeRoutingImbalance)]
          : []),
        // the pipeline split balances priced seconds on it: part of the layout's line
        ...['--hardware', hardware],
        ...(f.attentionKernel ? ['--attention-kernel', f.attentionKernel] : []),
      ];
      const tty = isTTY() && !f.json;
      const spec: TuneSpec = {
        model,
        overrides,
        base,
        bf16: f.bf16 ?? false,
        nnodes: f.nnodes!,
        nprocPerNode: f.nprocPerNode!,
        globalBatchSize,
        fit: f.fit,
      };
      // the hardware and the model load here: a bad one is the request's user error
      const request = pricingRequestOf(spec);
      // a bad profile too, not every layout's refusal
      if (f.dataProfile) loadDataProfile(f.dataProfile);
      const workers = f.workers ?? defaultWorkers();
      const pool = workers > 1 ? new TunePool(spec, workers) : undefined;
      const result = await tune({
        ...request,
        space: { ...request.space, fix, exclude },
        pricer: pool,
        top: f.top,
        timeBudgetS: f.timeBudget,
        sensitivity: f.sensitivity,
        verify: f.verify,
        exhaustive: f.exhaustive,
        onProgress: tty
          ? (p) =>
              io.err(
                `\r\x1b[2Klfc tune: ${p.phase === 'estimate' ? 'estimated' : 'compiled'} ${p.done} of ${p.total} layouts (${p.seconds.toFixed(0)} s)${p.best ? `; best ${kilo(p.best.forecast.tokensPerSecond)} tokens/s: ${p.best.name}` : ''}`,
              )
          : undefined,
      }).finally(() => pool?.close());
      if (tty) io.err('\r\x1b[2K');
      const line = (p: PricedLayout) =>
        ['lfc compile', ...[...base, ...p.flags].map(quote), '-o', 'plan'].join(' ');
      if (f.json) {
        io.out(JSON.stringify(jsonOf(result, line), null, 2) + '\n');
      } else
        io.out(
          describe(result, line, {
            model: request.space.config.name,
            world,
            hardware: simulatedOn({
              hardware: request.hardware.name,
              attentionKernel: f.attentionKernel,
            }),
            fit: f.fit,
            top: f.top,
          }),
        );
      if (f.plans) await writePlans(f.plans, base, result, io, tty, !f.json);
    });
}

/**
 * Compiles the layouts the search printed (those that fit, else the closest) into DIR/1, DIR/2, …
 * as `lfc compile` of their lines writes them (plan, programs, report.json), and says how to
 * look at them.
 */
async function writePlans(
  dir: string,
  base: readonly string[],
  result: TuneResult,
  io: CliIO,
  tty: boolean,
  say: boolean,
): Promise<void> {
  const layouts = result.layouts.length ? result.layouts : result.closest;
  const quiet: CliIO = { out: () => {}, err: (t) => io.err(t) };
  const written: string[] = [];
  for (const [k, p] of layouts.entries()) {
    const out = join(dir, String(k + 1));
    if (tty) io.err(`\r\x1b[2Klfc tune: compiling ${out} (${k + 1} of ${layouts.length})…`);
    const compile = new Command().exitOverride();
    addCompileCommand(compile, quiet, () => false);
    await compile.parseAsync(['compile', ...base, ...p.flags, '--no-advice', '-o', out], {
      from: 'user',
    });
    written.push(out);
  }
  if (tty) io.err('\r\x1b[2K');
  if (say && written.length)
    io.out(
      `\nwrote ${written.length} plan${written.length > 1 ? 's' : ''}: ${written.join(', ')}\nsee them with: lfc viz ${written.slice(0, 4).join(' ')}\n`,
    );
}

/** seconds or milliseconds, three figures */
const duration = (s: number) =>
  s >= 1 ? `${s.toPrecision(3)} s` : `${(s * 1e3).toPrecision(3)} ms`;
const kilo = (x: number) => (x >= 1e4 ? `${(x / 1e3).toFixed(1)}k` : x.toFixed(0));
/** 'best', '2nd best', '11th best', … */
const kthBest = (k: number) => {
  if (k === 1) return 'best';
  const teen = k % 100 >= 11 && k % 100 <= 13;
  const suffix = teen ? 'th' : ({ 1: 'st', 2: 'nd', 3: 'rd' } as Record<number, string>)[k % 10];
  return `${k}${suffix ?? 'th'} best`;
};
const quote = (s: string) => (/^[\w./=:,+-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);

function jsonOf(r: TuneResult, line: (p: PricedLayout) => string) {
  const layout = (p: PricedLayout) => ({
    name: p.name,
    compileLine: line(p),
    layout: p.layout,
    fits: p.fits,
    verified: p.verified,
    forecast: p.forecast,
    estimate: p.estimate,
    memory: {
      peakBoundBytes: p.peakBound,
      peakExpectedBytes: p.peakExpected,
      programs: p.memory,
    },
  });
  return {
    layouts: r.layouts.map(layout),
    closest: r.closest.map(layout),
    enumerated: r.enumerated,
    estimated: r.estimated,
    priced: r.priced,
    pastDevice: r.pastDevice,
    fitting: r.fitting,
    cannotFit: r.cannotFit,
    estimatedPastDevice: r.estimatedPastDevice,
    cannotWin: r.cannotWin,
    estimateGraphs: r.estimateGraphs,
    refused: r.refused,
    refusedBy: r.refusedBy,
    failed: r.failed,
    unpriced: r.unpriced,
    seconds: r.seconds,
    ...(r.sensitivity ? { sensitivity: r.sensitivity } : {}),
  };
}

function describe(
  r: TuneResult,
  line: (p: PricedLayout) => string,
  c: { model: string; world: number; hardware: string; fit: string; top: number },
): string {
  const out = [
    `tuned ${c.model} for ${c.world} ranks on ${c.hardware} (memory at the ${c.fit === 'bound' ? 'bounds' : 'expected sizes'}) in ${r.seconds.toFixed(1)} s: ${r.enumerated} layouts`,
    `  ${r.cannotFit} skipped (their weights and optimizer state alone are past the device), ${r.refused} refused by the layout rules, ${r.estimated} estimated (${r.estimateGraphs} reduced models)`,
    `  ${r.estimatedPastDevice} estimated past the device by over ${Math.round(100 * (ESTIMATE_MEMORY_MARGIN - 1))}%, ${r.cannotWin} estimated over ${Math.round(100 * ESTIMATE_SLACK)}% below the ${kthBest(c.top)}; ${r.priced} compiled, ${r.fitting} fit${r.pastDevice ? ` (the ${r.pastDevice} past the device not simulated)` : ''}`,
  ];
  if (r.unpriced.length)
    out.push(`  not priced within --time-budget: ${r.unpriced.length} layouts (--json lists them)`);
  for (const f of r.failed) out.push(`  could not price ${f.name}: ${f.error}`);
  const table = (ps: readonly PricedLayout[]) => {
    out.push('  #  tokens/s  per GPU       step    MFU  peak memory: bound / expected  layout');
    ps.forEach((p, i) => {
      const f = p.forecast;
      out.push(
        `  ${String(i + 1)}  ${kilo(f.tokensPerSecond).padStart(8)}  ${(f.tokensPerSecond / c.world).toFixed(0).padStart(7)}  ${duration(f.stepSeconds).padStart(9)}  ${(100 * f.mfu).toFixed(1).padStart(4)}%  ${mib(p.peakBound).padStart(14)} / ${mib(p.peakExpected).padEnd(14)}  ${p.name}`,
      );
    });
    ps.forEach((p, i) => out.push(`  ${i + 1}: ${line(p)}`));
  };
  if (r.layouts.length) table(r.layouts);
  else if (r.closest.length) {
    out.push(
      `  no layout priced fits; the smallest at the ${c.fit === 'bound' ? 'bounds' : 'expected sizes'}:`,
    );
    table(r.closest);
    if (c.fit === 'bound')
      out.push(
        "  (the bounds plan every size at its largest: a microbatch's visual tokens up to the data profile's cap, an expert rank's rows up to dropless routing's worst case or --moe-routing-imbalance F times balanced; --fit expected ranks by the memory of a typical step)",
      );
  } else if (r.enumerated === 0) {
    out.push(
      '  no layout of this cluster has the knob values --fix and --exclude leave (each parallel size divides the GPUs as the layout rules ask)',
    );
  } else if (r.estimated === 0 && r.refused === 0 && r.cannotFit > 0) {
    // every layout past the device before any activation: no knob the tuner turns helps
    out.push(
      '  no layout fits: in every one the weights and optimizer state alone are past the device; it takes more GPUs or a device with more memory',
    );
  } else {
    out.push('  no layout could be priced');
    // none estimated: what the static bound left, the rules refused (a flag that no layout
    // allows shows as every one's reason)
    if (r.estimated === 0 && r.refused > 0)
      for (const { reason, layouts } of [...r.refusedBy]
        .sort((a, b) => b.layouts - a.layouts)
        .slice(0, 3))
        out.push(`  refused ${layouts} layouts: ${reason}`);
  }
  if (r.sensitivity && r.layouts.length) {
    const at = r.layouts[0].forecast.tokensPerSecond;
    out.push(
      `  sensitivity of #1 (the plan fixed) to each efficiency family of ${c.hardware}, tokens/s per GPU:`,
    );
    out.push('    family        ×0.8            ×1.2');
    for (const family of [...new Set(r.sensitivity.map((s) => s.family))]) {
      const cell = (factor: number) => {
        const t = r.sensitivity!.find((s) => s.family === family && s.factor === factor)!;
        const pct = 100 * (t.tokensPerSecond / at - 1);
        return `${(t.tokensPerSecond / c.world).toFixed(0).padStart(6)} (${pct >= 0 ? '+' : ''}${pct.toFixed(1)}%)`;
      };
      out.push(`    ${family.padEnd(12)} ${cell(0.8).padEnd(15)} ${cell(1.2)}`);
    }
  }
  return out.join('\n') + '\n';
}
