// Shared by tests: every preset's forward graph, built once per test file.
import { buildForwardGraph } from '../compiler/frontend/build.js';
import { listPresets, loadModelConfig } from '../compiler/frontend/config.js';
import type { Graph } from '../ir/graph.js';
import { run, type CliIO } from '../cli/index.js';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { projectRoot } from '../compiler/paths.js';

export const PRESETS = listPresets().map((p) => p.name);

/** lfc demo's layout (on 4 ranks): pp 2 × vpp 2, ep 2, full separation, the A2A overlap */
export const DEMO_LAYOUT: readonly string[] = [
  '--pp',
  '2',
  '--vpp',
  '2',
  '--ep',
  '2',
  '--enable-full-hetero-dp',
  '--overlap-moe-expert-parallel-comm',
  '--delay-wgrad-compute',
];

const cache = new Map<string, Graph>();
export function presetGraph(name: string): Graph {
  let g = cache.get(name);
  if (!g) {
    g = buildForwardGraph(loadModelConfig(name));
    cache.set(name, g);
  }
  return g;
}

/** Runs the CLI in-process; returns exit code and captured output. */
export async function cli(...argv: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const io: CliIO = { out: (t) => (out += t), err: (t) => (err += t) };
  const code = await run(argv, io);
  return { code, out, err };
}

/** ‖a − b‖ / ‖b‖ (relative L2 error of a against b) */
export function relL2(a: Float32Array, b: Float32Array): number {
  let d = 0;
  let n = 0;
  for (let i = 0; i < a.length; i++) {
    d += (a[i] - b[i]) ** 2;
    n += b[i] ** 2;
  }
  return Math.sqrt(d) / Math.max(Math.sqrt(n), 1e-30);
}

/**
 * A file of GPU profile `name` (configs/hardware) without its `host:` section, for tests of the
 * GPU's side: a model this small is bound by the framework's host on a GPU (docs/simulation.md),
 * the same on every card and layout. Written under the test run's temporary directory.
 */
export function gpuSideProfile(name: string): string {
  const yaml = readFileSync(join(projectRoot(), 'configs/hardware', `${name}.yaml`), 'utf8');
  if (!/^host: /m.test(yaml)) throw new Error(`configs/hardware/${name}.yaml has no host section`);
  const file = join(mkdtempSync(join(tmpdir(), 'lfc-gpu-side-')), `${name}.yaml`);
  writeFileSync(file, yaml.replace(/^host: .*$/m, ''));
  return file;
}
