// bench/encoder-memory: what level 3's memory options do to stage 0's planned memory on the
// article's second launch line (qwen3-vl-30b-a3b, 32 ranks, tp 1, pp 2 × vpp 2, ep 4, full
// separation, A2A overlap, selective recompute, fine-grained offload; issue: parallel compilation
// part 2, item 4). The line is parsed as `lfc compile` parses it, then compiled four ways:
// as written, with --full-hetero-dp-cpu-offload, with --full-hetero-dp-encoder-recompute, and
// with both; and again at a larger global batch, where more encoder outputs wait.
//
//   npx tsx bench/encoder-memory.ts [--gbs 64,256]
//
// Printed per variant, for stage 0's program (p0): the liveness lower bound (the most arena bytes
// live at once: the planned peak), the packed arena, the bytes the encoder offload copies to the
// host, the peak's drop against the line as written, and the compile time.

import { performance } from 'node:perf_hooks';
import { parseCompileArgs } from '../cli/compile.js';
import { compile, type CompileOptions } from '../compiler/pipeline.js';
import type { ProgramFile } from '../compiler/plan/format.js';
import { ARTICLE_30B, argvOf } from '../examples/article-launch-lines.js';

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
}

const GiB = 2 ** 30;
const aligned = (bytes: number) => Math.ceil(Math.max(bytes, 1) / 64) * 64;
const offloadedBytes = (p: ProgramFile) =>
  p.instructions
    .filter((x) => x.op === 'offload')
    .reduce((a, x) => a + aligned(p.buffers[x.inputs[0]].bytes), 0);

/** each variant, and the one its drop is measured against */
const VARIANTS: [string, { cpuOffload?: boolean; recompute?: boolean }, string][] = [
  ['as written', {}, 'as written'],
  ['+ cpu offload', { cpuOffload: true }, 'as written'],
  ['+ encoder recompute', { recompute: true }, 'as written'],
  ['+ both', { cpuOffload: true, recompute: true }, '+ encoder recompute'],
];

const line = parseCompileArgs(argvOf(ARTICLE_30B)).options;
for (const gbs of arg('gbs', '64,256').split(',').map(Number)) {
  console.log(`\nglobal batch ${gbs}: stage 0 (p0)`);
  console.log(
    '| variant | peak (bound) GiB | packed arena GiB | encoder offload GiB | against | peak drop GiB | drop / offloaded | compile s |',
  );
  console.log('|---|---|---|---|---|---|---|---|');
  const done = new Map<string, ProgramFile>();
  for (const [name, enc, against] of VARIANTS) {
    const opts: CompileOptions = {
      ...line,
      globalBatchSize: gbs,
      encoder: { ...line.encoder, ...enc },
    };
    const t0 = performance.now();
    const r = compile(opts);
    const secs = (performance.now() - t0) / 1000;
    const p = r.programs.find((x) => x.id === 'p0')!;
    done.set(name, p);
    const plain = done.get('as written')!;
    const base = done.get(against)!;
    // the fine-grained activation offload of the line copies the same in every variant
    const enc0 = offloadedBytes(p) - offloadedBytes(plain);
    const drop = base.arenaLowerBoundBytes - p.arenaLowerBoundBytes;
    const gib = (b: number) => (b / GiB).toFixed(2);
    console.log(
      `| ${name} | ${gib(p.arenaLowerBoundBytes)} | ${gib(p.regions.arena)} | ${gib(enc0)} | ${against} | ${gib(drop)} | ${enc0 ? (drop / enc0).toFixed(3) : '–'} | ${secs.toFixed(1)} |`,
    );
  }
}
