// The plan verifier at scale: 1024 ranks of ~10k instructions each, 128 distinct programs
// (4 pipeline stages × 32 blocks of 8 ranks; each block all_reduces per layer and exchanges
// activations all-to-all with the next stage's block). The time is printed, not asserted.
import { expect, it } from 'vitest';
import { analyzePlan } from '../../compiler/verify/plan-verifier.js';
import { generatePlan } from './plan-gen.js';

it('verifies a 1024-rank plan', () => {
  let t = performance.now();
  const { plan, programs } = generatePlan({
    seed: 7,
    pp: 4,
    dp: 256,
    block: 8,
    microbatches: 32,
    layers: 36,
  });
  const genMs = performance.now() - t;
  t = performance.now();
  const { problems, stats } = analyzePlan(plan, programs);
  const ms = performance.now() - t;
  const stages = Object.entries(stats.ms)
    .map(([k, v]) => `${k} ${v.toFixed(0)}`)
    .join(', ');
  console.log(
    `1024-rank plan: ${stats.ranks} ranks, ${stats.programs} programs, ` +
      `${stats.instructions} instructions (${(stats.instructions / stats.ranks).toFixed(0)} per rank), ` +
      `${stats.p2pPairs} send/recv pairs; generated in ${genMs.toFixed(0)} ms, ` +
      `verified in ${ms.toFixed(0)} ms (${stages} ms)`,
  );
  expect(problems).toEqual([]);
  expect(stats.simulated).toBe(stats.instructions);
  expect(stats.programs).toBe(128);
}, 300_000);
