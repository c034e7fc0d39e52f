// The flex token dispatcher (DeepEP's, --moe-token-dispatcher-type flex): the plan moves the same
// rows as the all-to-all dispatcher and marks its expert exchanges, and the cost model prices
// them with DeepEP's node deduplication (compiler/sim/cost.ts). The deduplicated share is held to
// a count over every way a token's experts can fall on the nodes; the step to the plain one.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import type { PlanInstruction, ProgramFile } from '../../compiler/plan/format.js';
import { flexNodeShare, groupCollectiveSeconds } from '../../compiler/sim/cost.js';
import { loadHardware } from '../../compiler/sim/hardware.js';
import { simulatePlan } from '../../compiler/sim/simulate.js';
import { cli } from '../helpers.js';

/**
 * Over every assignment of a token's k rows to N nodes (each row's node uniform and independent,
 * balanced routing), the other nodes it reaches over the rows it sends off its node (node 0).
 */
function countedShare(nodes: number, k: number): number {
  let reached = 0;
  let offNode = 0;
  const total = nodes ** k;
  for (let a = 0; a < total; a++) {
    const hit = new Set<number>();
    for (let r = 0, x = a; r < k; r++, x = Math.floor(x / nodes)) {
      const node = x % nodes;
      if (node !== 0) {
        offNode++;
        hit.add(node);
      }
    }
    reached += hit.size;
  }
  return reached / offNode;
}

describe('the flex dispatcher: DeepEP node deduplication', () => {
  it.each([
    [2, 1],
    [2, 2],
    [3, 4],
    [4, 8],
    [8, 4],
  ])('over %i nodes with top-%i, the share the NIC carries is the counted one', (nodes, k) => {
    expect(flexNodeShare(nodes, k)).toBeCloseTo(countedShare(nodes, k), 12);
  });

  it('one node, or top-1: nothing to merge', () => {
    expect(flexNodeShare(1, 8)).toBe(1);
    expect(flexNodeShare(4, 1)).toBe(1);
  });

  const links = {
    intraNode: { gbps: 200, latencyUs: 4 },
    interNode: { gbps: 12.5, latencyUs: 8 },
  };
  const GiB = 2 ** 30;
  it('a dispatch over 4 nodes of 8: the NIC carries the merged off-node rows, NVLink the local and forwarded ones', () => {
    const g = { size: 32, nodes: 4, local: 8 };
    const plain = groupCollectiveSeconds('all_to_all_v', g, GiB, links);
    const flex = groupCollectiveSeconds('all_to_all_v', g, GiB, links, 1, 8);
    const off = (24 / 32) * GiB;
    const nic = (off * flexNodeShare(4, 8)) / 12.5e9;
    const nvlink = ((7 / 32) * GiB + (off * 7) / 8) / 200e9;
    expect(flex).toBeCloseTo(31 * 8e-6 + Math.max(nic, nvlink), 12);
    expect(plain).toBeCloseTo(31 * 8e-6 + Math.max(off / 12.5e9, ((7 / 32) * GiB) / 200e9), 12);
    expect(flex / plain).toBeGreaterThan(0.4);
    expect(flex / plain).toBeLessThan(0.5);
    // inside one node DeepEP runs on NVLink alone: priced as the plain exchange
    const node = { size: 8, nodes: 1, local: 8 };
    expect(groupCollectiveSeconds('all_to_all_v', node, GiB, links, 1, 8)).toBe(
      groupCollectiveSeconds('all_to_all_v', node, GiB, links),
    );
  });

  // tiny-vlm-moe (8 experts, top-2) with ep 4 over 2 nodes of 2 ranks
  const base: CompileOptions = {
    model: 'tiny-vlm-moe',
    nnodes: 2,
    nprocPerNode: 2,
    parallel: { ep: 4 },
    globalBatchSize: 8,
    microBatchSize: 1,
  };
  // the GPU's side alone: a model this small is bound by the framework's host on a GPU
  const h100 = { ...loadHardware('h100'), host: undefined };
  const compiled = (o: CompileOptions) => {
    const r = compile({ ...o, hardware: h100 });
    const programs = new Map<string, ProgramFile>(r.programs.map((p) => [p.id, p]));
    return { r, programs, step: simulatePlan(r.plan, programs, h100).stepSeconds };
  };
  const plain = compiled(base);
  const flex = compiled({ ...base, moeTokenDispatcher: 'flex' });
  const exchanges = (p: ProgramFile) => p.instructions.filter((x) => x.op === 'all_to_all_v');
  const strip = (x: PlanInstruction) => {
    const attrs = { ...x.attrs };
    delete attrs.dispatcher;
    delete attrs.top_k;
    return { ...x, attrs };
  };

  it('marks the rows exchanges of dispatch, combine and their gradients with the top-k, not the counts', () => {
    const p = flex.r.programs[0];
    const marked = exchanges(p).filter((x) => x.attrs.dispatcher === 'flex');
    // per MoE layer and microbatch: dispatch and combine forward, their two gradients
    expect(marked.length).toBeGreaterThan(0);
    expect(new Set(marked.map((x) => x.phase))).toEqual(new Set(['forward', 'backward']));
    for (const x of marked) expect(x.attrs.top_k).toBe(2);
    for (const x of exchanges(p).filter((y) => y.attrs.dispatcher === undefined))
      expect(x.attrs.out_rows).toEqual(['4']); // the counts: one row from each rank
    expect(exchanges(plain.r.programs[0]).every((x) => x.attrs.dispatcher === undefined)).toBe(
      true,
    );
  });

  it('moves the same rows as the all-to-all dispatcher: the programs differ only in those attributes', () => {
    expect(flex.r.programs.map((p) => p.instructions.map(strip))).toEqual(
      plain.r.programs.map((p) => p.instructions),
    );
  });

  it('prices the step below the plain dispatcher across nodes, and alike inside one node', () => {
    expect(flex.step).toBeLessThan(plain.step);
    const oneNode = { ...base, nnodes: 1, nprocPerNode: 4 };
    expect(compiled({ ...oneNode, moeTokenDispatcher: 'flex' }).step).toBe(compiled(oneNode).step);
  });

  const dir = mkdtempSync(join(tmpdir(), 'lfc-flex-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  it('lfc compile says which dispatcher it priced, and report.json lists the flag', async () => {
    const r = await cli(
      'compile',
      ...['tiny-vlm-moe', '--nnodes', '2', '--nproc-per-node', '2', '--ep', '4'],
      ...['--moe-token-dispatcher-type', 'flex', '--hardware', 'h100', '-o', dir],
    );
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/\n {2}MoE dispatcher: flex \(DeepEP's\)/);
    const report = JSON.parse(readFileSync(join(dir, 'report.json'), 'utf8')) as {
      features: string[];
    };
    expect(report.features).toContain('--moe-token-dispatcher-type flex');
  });
});
