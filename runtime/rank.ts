// One rank of a multi-rank run, in this process: it trains as the rank its environment names
// (launch-rank.ts). Under lfc's launcher (rank-main.ts, spawned by launch.ts) it reports each step
// over IPC and writes only its collectives' transports, into its log; started by a cluster manager
// (`lfc run DIR` under Slurm or torchrun), rank 0 hosts the store when no launcher does, and shows
// the progress line and the final step.

import { StoreServer } from './store.js';
import { describeEval, describeStep, progressBar } from './progress.js';
import { train, type TrainOptions } from './train.js';
import type { RankContext } from './launch-rank.js';
import type { RankMessage } from './launch.js';
import type { NativeCommunicatorInfo } from './native.js';

/**
 * How long, at most, a rank that hosts the store keeps it after its run failed, waiting for the
 * other ranks' connections to close.
 */
const STORE_GRACE_MS = 10_000;

/** Where a rank writes its output and its messages (the CLI's CliIO is one). */
export interface RankIO {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
}

/** "world/control, dp[0]/comm over shared memory (direct reads); pp[0]/compute over tcp" */
export function describeTransports(comms: readonly NativeCommunicatorInfo[]): string {
  const by = new Map<string, string[]>();
  for (const c of comms) {
    const how = c.direct ? `${c.transport} (direct reads)` : c.transport;
    by.set(how, [...(by.get(how) ?? []), c.name]);
  }
  return [...by].map(([t, names]) => `${names.join(', ')} over ${t}`).join('; ') || 'none';
}

/** This process is one rank of a launched (or cluster-managed) run. */
export async function runRank(
  opts: TrainOptions,
  rank: RankContext,
  io: RankIO,
  quiet: boolean,
  isTTY: boolean,
): Promise<void> {
  // the launcher gone: nothing will collect this rank's work, and a peer may wait forever
  const orphaned = (): void => void process.kill(process.pid, 'SIGKILL');
  if (rank.launched) process.on('disconnect', orphaned);
  const port = Number(rank.store.split(':').pop());
  const server = rank.hostsStore ? await StoreServer.listen(port) : undefined;
  let failed = false;
  try {
    const bar = progressBar(opts.trainIters, io.err, isTTY);
    const talk = !rank.launched && rank.rank === 0 && !quiet;
    const r = await train({
      ...opts,
      rank,
      // under a launcher, it merges the metrics; otherwise rank 0 writes the global ones
      metricsPath: rank.launched ? undefined : opts.metricsPath,
      // into the rank's log under a launcher
      onConnected: (comms) => {
        if (rank.launched || talk)
          io.err(`rank ${rank.rank} collectives: ${describeTransports(comms)}\n`);
      },
      onStep: (m) => {
        if (rank.launched)
          process.send!({ type: 'step', rank: rank.rank, metrics: m } satisfies RankMessage);
        else if (talk) bar.update(m.step, describeStep(m));
      },
      // every rank has the same global figures: rank 0 reports them
      onEval: (e) => {
        if (rank.launched && rank.rank === 0)
          process.send!({ type: 'eval', rank: rank.rank, eval: e } satisfies RankMessage);
        else if (talk) bar.note(describeEval(e));
      },
    });
    if (talk) bar.done();
    const last = r.steps[r.steps.length - 1];
    if (rank.launched && r.data)
      process.send!({
        type: 'data',
        rank: rank.rank,
        counts: r.data,
        position: last?.dataPosition ?? 0,
      } satisfies RankMessage);
    if (last && talk)
      io.out(`trained ${r.plan.model.name} to step ${last.step}: ${describeStep(last)}\n`);
  } catch (e) {
    failed = true;
    throw e;
  } finally {
    // a failed step left its reason in the store for the other ranks, which look it up as soon
    // as their connections with this rank close (runtime-native/src/comm/comm.h): the store
    // stays until they have gone, however loaded the machine (a fixed second was not enough)
    if (failed && server) await server.drain(String(rank.rank), STORE_GRACE_MS);
    await server?.close();
    if (rank.launched) {
      // the IPC channel would keep this process alive
      process.off('disconnect', orphaned);
      process.disconnect();
    }
  }
}
