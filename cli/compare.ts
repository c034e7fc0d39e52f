// lfc compare DIR…: plans compiled earlier, side by side, from the report each `lfc compile -o`
// keeps beside its plan (report.json): layout, simulated step, tokens/s, MFU, memory and fit.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Command } from 'commander';
import { UserError, cannotRead } from '../compiler/errors.js';
import { mib, REPORT_FILE, type CompileReportJson } from './compile.js';
import { simulatedOn } from '../compiler/sim/report.js';
import type { CliIO } from './io.js';

export function addCompareCommand(program: Command, io: CliIO): void {
  program
    .command('compare')
    .description('plans compiled earlier, side by side: layout, step, tokens/s, MFU and memory')
    .argument('<dirs...>', 'plan directories written by lfc compile -o')
    .option('--json', 'print the comparison as JSON')
    .action((dirs: string[], f: { json?: boolean }) => {
      if (dirs.length < 2) throw new UserError('compare: give two plan directories or more');
      const rows = dirs.map(readReport);
      if (f.json) {
        io.out(
          JSON.stringify({ plans: rows.map((r, i) => ({ dir: dirs[i], ...r })) }, null, 2) + '\n',
        );
        return;
      }
      io.out(describe(dirs, rows));
    });
}

function readReport(dir: string): CompileReportJson {
  const path = join(dir, REPORT_FILE);
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    const missing = (e as NodeJS.ErrnoException).code === 'ENOENT';
    throw new UserError(
      missing
        ? `${dir}: no ${REPORT_FILE} (not a plan directory, or compiled by an lfc before lfc compare: compile it again)`
        : cannotRead(path, e),
    );
  }
  let r: CompileReportJson;
  try {
    r = JSON.parse(text) as CompileReportJson;
  } catch (e) {
    throw new UserError(`${path}: malformed JSON (${(e as Error).message})`);
  }
  const ok =
    typeof r === 'object' &&
    r !== null &&
    typeof r.model === 'string' &&
    typeof r.topology?.sizes === 'object' &&
    typeof r.encoder?.level === 'number' &&
    Array.isArray(r.features) &&
    typeof r.training?.globalBatchSize === 'number' &&
    Array.isArray(r.memory?.programs);
  if (!ok) throw new UserError(`${path}: not an lfc compile report`);
  return r;
}

function layoutOf(r: CompileReportJson): string {
  const s = r.topology.sizes;
  return [
    `tp ${s.tp}`,
    `pp ${s.pp}${s.vpp > 1 ? ` × vpp ${s.vpp}` : ''}`,
    `dp ${s.dp}`,
    ...(s.ep > 1 ? [`ep ${s.ep}`] : []),
    `mbs ${r.training.microBatchSize}`,
    ...(r.encoder.level > 0
      ? [
          r.encoder.level === 1
            ? `encoder level 1 (tp ${r.encoder.tp})`
            : `encoder level ${r.encoder.level}`,
        ]
      : []),
  ].join(', ');
}

function describe(dirs: readonly string[], rows: readonly CompileReportJson[]): string {
  const table: string[][] = [
    ['', ...dirs],
    ['model', ...rows.map((r) => r.model)],
    ['ranks', ...rows.map((r) => String(r.topology.worldSize))],
    ['layout', ...rows.map(layoutOf)],
    ['features', ...rows.map((r) => r.features.join(' ') || '–')],
    ['batch', ...rows.map((r) => `${r.training.globalBatchSize} × ${r.training.seqLength} tokens`)],
    [
      'simulated on',
      ...rows.map((r) => (r.forecast ? simulatedOn(r.forecast) : '(not simulated)')),
    ],
    ['step', ...rows.map((r) => (r.forecast ? `${r.forecast.stepSeconds.toPrecision(4)} s` : '–'))],
    ['tokens/s', ...rows.map((r) => (r.forecast ? r.forecast.tokensPerSecond.toFixed(0) : '–'))],
    [
      'per GPU',
      ...rows.map((r) =>
        r.forecast ? (r.forecast.tokensPerSecond / r.topology.worldSize).toFixed(0) : '–',
      ),
    ],
    ['MFU', ...rows.map((r) => (r.forecast ? `${(100 * r.forecast.mfu).toPrecision(3)}%` : '–'))],
  ];
  const base = rows[0].forecast?.tokensPerSecond;
  if (base)
    table.push([
      `vs ${dirs[0]}`,
      ...rows.map((r) => (r.forecast ? `${(r.forecast.tokensPerSecond / base).toFixed(3)}×` : '–')),
    ]);
  const peak = (r: CompileReportJson, k: 'bound' | 'expected') =>
    Math.max(...r.memory.programs.map((m) => m[k].deviceBytes));
  table.push(
    ['memory/rank, bound', ...rows.map((r) => mib(peak(r, 'bound')))],
    ['memory/rank, expected', ...rows.map((r) => mib(peak(r, 'expected')))],
    [
      'fits',
      ...rows.map((r) => {
        const fits = r.memory.programs.every((m) => m.fits !== false);
        return `${fits ? 'yes' : 'NO'} (${r.memory.device.name})`;
      }),
    ],
  );
  const widths = table[0].map((_, c) => Math.max(...table.map((row) => row[c].length)));
  return (
    table
      .map((row) =>
        row
          .map((cell, c) => (c === 0 ? cell.padEnd(widths[c]) : cell.padStart(widths[c])))
          .join('  ')
          .trimEnd(),
      )
      .join('\n') + '\n'
  );
}
