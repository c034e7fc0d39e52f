// The plan digests: for each compile line, a SHA-256 of what `lfc compile -o DIR --json` writes —
// plan.json, every program file, and the simulated forecast — so that a redesign of the compiler
// can be held to "behaviour unchanged" byte for byte (test/plan/digests.test.ts). A digest changes
// only in a commit of its own that says why (LFC_RECORD_DIGESTS=1 records them).
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ARTICLE_30B, ARTICLE_7B, argvOf } from '../examples/article-launch-lines.js';
import { cli } from './helpers.js';
import { BATCH, LAYOUTS } from './layouts.js';

export interface DigestLine {
  readonly name: string;
  /** `lfc compile` arguments, without -o */
  readonly argv: readonly string[];
}

const Q30 = [
  'qwen3-vl-30b-a3b',
  ...['--nnodes', '4', '--nproc-per-node', '8', '--seq-length', '32768'],
  ...['--micro-batch-size', '1', '--global-batch-size', '64'],
];
const one = (model: string, flags: readonly string[] = []) => [model, ...BATCH, ...flags];

export const DIGEST_LINES: readonly DigestLine[] = [
  // the equivalence matrix: every layout, and the one-rank plans it is held to
  ...LAYOUTS.map((l) => ({
    name: `eq/${l.name}`,
    argv: [l.model, ...BATCH, '--nproc-per-node', String(l.ranks), ...l.flags],
  })),
  { name: 'eq/one/tiny-vlm-moe', argv: one('tiny-vlm-moe') },
  { name: 'eq/one/tiny-vlm', argv: one('tiny-vlm') },
  ...[
    ...new Map(
      LAYOUTS.filter((l) => l.baseline).map((l) => [l.baseline!.join(' '), l] as const),
    ).values(),
  ].map((l) => ({ name: `eq/one/${l.name}`, argv: one(l.model, l.baseline) })),
  // the article's two launch lines
  { name: 'article/7b', argv: argvOf(ARTICLE_7B) },
  { name: 'article/30b', argv: argvOf(ARTICLE_30B) },
  // the 30B layouts of the parallel tests, and the encoder levels of the tuner issue's table
  {
    name: '30b/tp1-pp2-ep8-vpp2',
    argv: [...Q30, '--tp', '1', '--pp', '2', '--ep', '8', '--vpp', '2'],
  },
  { name: '30b/tp4-pp2-ep4', argv: [...Q30, '--tp', '4', '--pp', '2', '--ep', '4'] },
  {
    name: '30b/tp1-pp2-ep8-vpp2-distopt',
    argv: [
      ...Q30,
      '--tp',
      '1',
      '--pp',
      '2',
      '--ep',
      '8',
      '--vpp',
      '2',
      '--use-distributed-optimizer',
    ],
  },
  {
    name: '30b/tp4-pp2-ep4-level2',
    argv: [...Q30, '--tp', '4', '--pp', '2', '--ep', '4', '--enable-encoder-hetero-dp'],
  },
  {
    name: '30b/tp4-pp2-ep4-level3',
    argv: [...Q30, '--tp', '4', '--pp', '2', '--ep', '4', '--enable-full-hetero-dp'],
  },
  // bench/compile.ts's 1024-rank layout
  {
    name: '235b/tp4-pp8-vpp2-ep16',
    argv: [
      'qwen3-vl-235b-a22b',
      ...['--nnodes', '128', '--nproc-per-node', '8', '--seq-length', '32768'],
      ...['--micro-batch-size', '1', '--global-batch-size', '1024'],
      ...['--tp', '4', '--pp', '8', '--vpp', '2', '--ep', '16'],
    ],
  },
];

/** The digest of one line: compiled in-process into a scratch directory, removed after. */
export async function planDigest(argv: readonly string[]): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'lfc-digest-'));
  try {
    const out = join(dir, 'plan');
    const r = await cli('compile', ...argv, '-o', out, '--json');
    if (r.code !== 0) throw new Error(`lfc compile ${argv.join(' ')}: ${r.err}`);
    const hash = createHash('sha256');
    hash.update(readFileSync(join(out, 'plan.json')));
    for (const name of readdirSync(join(out, 'programs')).sort()) {
      hash.update(`\0${name}\0`);
      hash.update(readFileSync(join(out, 'programs', name)));
    }
    const forecast = (JSON.parse(r.out) as { forecast?: unknown }).forecast;
    hash.update(`\0forecast\0${JSON.stringify(forecast ?? null)}`);
    return hash.digest('hex');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
