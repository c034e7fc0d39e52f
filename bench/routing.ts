// The routing imbalance an expert-parallel layout will see, measured before it runs: a one-rank
// plan of the same model and global batch trains the steps a layout's run will on the synthetic data in this
// process (the layouts route alike: test/multirank/equivalence.test.ts), with every forward
// moe_permute's per-expert counts kept readable. For an expert-parallel group of `ep` ranks, each
// holding E/ep experts, the global microbatches a group routes together at one all-to-all are
// those runtime/train.ts gives its data-parallel ranks at the same local index (d·m + j, d < ep);
// a rank receives the rows routed to its experts. The figure is the mean, over steps, layers and
// local microbatches, of the busiest rank's rows over the group's mean: what
// --moe-expected-imbalance takes, so that the simulator prices each rank's dispatch at the rank
// the others wait for.

import { loadNative } from '../runtime/native.js';
import { readPlan } from '../runtime/plan-io.js';

interface Instruction {
  op: string;
  scope: string;
  phase: string;
  microbatch: number;
  outputs: number[];
}

/**
 * The mean busiest-rank imbalance of `ep`-way expert parallelism over steps `from`…`to` (the
 * router drifts as it trains: on the bench's model, 1.25 at step 1 and 1.35 over steps 1-3 at ep 2).
 */
export async function measuredImbalance(
  onePlanDir: string,
  ep: number,
  from: number,
  to: number,
  seed = 1234,
): Promise<number> {
  const loaded = readPlan(onePlanDir);
  const plan = loaded.plan;
  const program = JSON.parse(loaded.programTexts.get('p0')!) as {
    regions: { arena: number };
    buffers: { offset: number; bytes: number }[];
    instructions: Instruction[];
  };
  // the counts get arena bytes of their own past the planned arena, so that they outlive the step
  const kept = program.instructions.filter((x) => x.op === 'moe_permute' && x.phase === 'forward');
  if (!kept.length) throw new Error(`${onePlanDir}: no moe_permute to measure routing with`);
  let top = Math.ceil(program.regions.arena / 64) * 64;
  for (const x of kept) {
    const b = program.buffers[x.outputs[1]];
    b.offset = top;
    top += Math.ceil(b.bytes / 64) * 64;
  }
  program.regions.arena = top;
  const rt = new (loadNative().Runtime)(JSON.stringify(program), { symbols: plan.symbols });
  rt.initParams(seed, plan.params);
  const M = plan.training.numMicrobatches;
  if (M % ep) throw new Error(`${M} microbatches do not split over ${ep} ranks`);
  const m = M / ep;
  const vocab = (plan.model.config as { text_decoder: { vocab_size: number } }).text_decoder
    .vocab_size;
  const ratios: number[] = [];
  for (let step = 1; step <= to; step++) {
    let lossTokens = 0;
    let captionTokens = 0;
    for (let g = 0; g < M; g++) {
      const mb = rt.synthesize(g, seed, step - 1, g, {
        seqLength: plan.training.seqLength * plan.training.microBatchSize,
        vocab,
        maxVisualTokens: plan.training.maxVisualTokens,
      });
      lossTokens += mb.lossMask.reduce((a, b) => a + b, 0);
      captionTokens += rt.captionMask(g).reduce((a, b) => a + b, 0);
    }
    rt.setScalar('loss_tokens', lossTokens);
    rt.setScalar('caption_tokens', Math.max(1, captionTokens));
    await rt.step({ lr: plan.training.optimizer.lr, step });
    if (step < from) continue;
    // per layer (scope): each global microbatch's rows per expert
    const counts = new Map<string, Int32Array[]>();
    for (const x of kept) {
      const per = counts.get(x.scope) ?? [];
      per[x.microbatch] = new Int32Array(rt.readBuffer(x.outputs[1]));
      counts.set(x.scope, per);
    }
    for (const per of counts.values())
      for (let j = 0; j < m; j++) {
        const E = per[j].length;
        const loads = Array<number>(ep).fill(0);
        for (let d = 0; d < ep; d++)
          per[d * m + j].forEach((rows, e) => (loads[Math.floor((e * ep) / E)] += rows));
        const mean = loads.reduce((a, b) => a + b, 0) / ep;
        if (mean > 0) ratios.push(Math.max(...loads) / mean);
      }
  }
  return ratios.reduce((a, b) => a + b, 0) / ratios.length;
}
