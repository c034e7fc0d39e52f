// The launcher of `lfc run --nproc-per-node N`, torchrun-like: it hosts the rendezvous store (on
// node 0), spawns this node's ranks (each a rank-main.ts process that finds its place in the job
// in its environment, launch-rank.ts, and trains with the options the launcher hands it), merges
// their step reports into one progress line and one metrics file, and writes each rank's output
// to DIR/logs/rank-<r>.log.
//
// Faults: a rank that exits before the end (an error, a signal, kill -9) ends the run — its
// launcher posts the failure to the store, every launcher stops its ranks (SIGTERM, SIGKILL
// after KILL_GRACE_MS) and fails with an error naming the rank and its last message. Ctrl-C stops
// every rank; a rank whose launcher dies loses its IPC channel and exits.

import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdtempSync, type WriteStream } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeDirs } from '../compiler/files.js';
import { UserError } from '../compiler/errors.js';
import type { PlanFile } from '../compiler/plan/format.js';
import { DEFAULT_MASTER_PORT, localAddressToward } from './launch-rank.js';
import { StoreClient, StoreServer } from './store.js';
import type { EvalMetrics, StepMetrics } from './metrics.js';
import type { TrainOptions } from './train.js';
import type { DataCounts } from './data/loader.js';

/** How long a rank may take to end after SIGTERM before SIGKILL. */
export const KILL_GRACE_MS = 3_000;
const FAILURE_KEY = 'lfc/failure';

export interface LaunchOptions {
  readonly planDir: string;
  readonly plan: PlanFile;
  readonly nnodes: number;
  readonly nprocPerNode: number;
  readonly nodeRank: number;
  readonly masterAddr: string;
  /** the store's port; unset: torchrun's 29500 on several nodes, any free port on one */
  readonly masterPort?: number;
  readonly collectiveTimeoutS: number;
  /** tcp: the store this launcher hosts; file: Gloo's FileStore in a directory (one node) */
  readonly rendezvous: 'tcp' | 'file';
  /** what every rank trains with (threads unset: this node's cores shared among its ranks) */
  readonly rankOptions: RankTrainOptions;
  readonly logDir: string;
  readonly onStep?: (m: MergedStep) => void;
  /** a run on datasets: what a rank's loader met, once it is done (rank 0's plans the whole
   * global batch, so its counts of packed, bad and dropped samples are the run's) */
  readonly onData?: (rank: number, counts: DataCounts, position: number) => void;
  /** an evaluation (rank 0 reports it: its figures are global), after its step's onStep */
  readonly onEval?: (e: EvalMetrics) => void;
}

/**
 * A rank's training options as its launcher hands them over (JSON, rank-main.ts): plain data. The
 * plan directory is the launch's; the rank's place in the job comes from its environment.
 */
export type RankTrainOptions = Omit<
  TrainOptions,
  'planDir' | 'rank' | 'onStep' | 'onConnected' | 'onTiming' | 'onEval'
>;

/** A step as the launcher reports it: the global figures, the slowest rank's time. */
export interface MergedStep extends StepMetrics {
  /** per local rank, in rank order */
  readonly ranks: readonly {
    readonly rank: number;
    readonly stepMs: number;
    readonly peakRssBytes: number;
    readonly deviceHighBytes: number;
    readonly scratchHighBytes: number;
  }[];
}

/** A rank ended the run: the message names it; exit code 1 (2 when the rank's was a user error). */
export class RankFailure extends UserError {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}

/** Messages a launched rank sends its launcher over IPC. */
export type RankMessage =
  | { readonly type: 'step'; readonly rank: number; readonly metrics: StepMetrics }
  | { readonly type: 'eval'; readonly rank: number; readonly eval: EvalMetrics }
  | {
      readonly type: 'data';
      readonly rank: number;
      readonly counts: DataCounts;
      readonly position: number;
    };

/** The entry a rank runs (rank-main.ts): this checkout's, compiled or through tsx. */
function rankCommand(): { execArgv: string[]; entry: string } {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith('.ts')) {
    const tsx = createRequire(import.meta.url).resolve('tsx');
    return {
      execArgv: ['--import', tsx],
      entry: fileURLToPath(new URL('./rank-main.ts', import.meta.url)),
    };
  }
  return {
    execArgv: [],
    entry: fileURLToPath(new URL('./rank-main.js', import.meta.url)),
  };
}

export function checkWorldSize(o: {
  planDir: string;
  plan: PlanFile;
  nnodes: number;
  nprocPerNode: number;
}): void {
  const want = o.plan.topology.worldSize;
  const got = o.nnodes * o.nprocPerNode;
  if (want !== got) {
    const t = o.plan.topology;
    throw new UserError(
      `${o.planDir} is a plan for ${want} rank${want === 1 ? '' : 's'} (compiled for --nnodes ${t.nnodes} × --nproc-per-node ${t.nprocPerNode}); this launch starts ${got} (--nnodes ${o.nnodes} × --nproc-per-node ${o.nprocPerNode})`,
    );
  }
}

interface Rank {
  readonly rank: number;
  readonly child: ChildProcess;
  readonly log: WriteStream;
  lastLine: string;
  exited: boolean;
}

/** where node 0's launcher publishes the run's key prefix */
const RUN_ID_KEY = 'lfc/run_id';

export async function launch(o: LaunchOptions): Promise<MergedStep[]> {
  checkWorldSize(o);
  if (o.nodeRank < 0 || o.nodeRank >= o.nnodes)
    throw new UserError(`--node-rank ${o.nodeRank} is out of range for --nnodes ${o.nnodes}`);
  if (o.rendezvous === 'file' && o.nnodes > 1)
    throw new UserError('--rdzv-backend file needs one node (a shared directory is not assumed)');
  makeDirs(o.logDir);
  const world = o.nnodes * o.nprocPerNode;

  // 1. the store: hosted here on node 0, reached over TCP by every launcher and rank
  let server: StoreServer | undefined;
  const local = o.nnodes === 1;
  const port = o.masterPort ?? (local ? 0 : DEFAULT_MASTER_PORT);
  if (o.nodeRank === 0) {
    try {
      server = await StoreServer.listen(port, local ? '127.0.0.1' : '0.0.0.0');
    } catch (e) {
      throw new UserError(`cannot host the store on port ${port}: ${(e as Error).message}`);
    }
  }
  const masterPort = server?.port ?? port;
  const masterHost = local ? '127.0.0.1' : o.masterAddr;
  const store = await StoreClient.connect(masterHost, masterPort, 60_000).catch(
    async (e: Error) => {
      await server?.close();
      throw new UserError(e.message);
    },
  );
  // the run's key prefix: node 0's, published in the store for the other nodes' launchers
  let runId: string;
  if (o.nodeRank === 0) {
    runId = `lfc-${process.pid}-${Date.now()}`;
    await store.set(RUN_ID_KEY, runId);
  } else {
    await store.wait([RUN_ID_KEY]);
    runId = (await store.get(RUN_ID_KEY))!.toString('utf8');
  }
  const storeAddress =
    o.rendezvous === 'file'
      ? `file:${mkdtempSync(join(o.logDir, 'rdzv-'))}`
      : `tcp:${masterHost}:${masterPort}`;
  const host = local ? '127.0.0.1' : await localAddressToward(o.masterAddr);

  // 2. the ranks of this node
  const { execArgv, entry } = rankCommand();
  const threads = Math.max(1, Math.floor(cpus().length / o.nprocPerNode));
  const ranks: Rank[] = [];
  const steps = new Map<number, Map<number, StepMetrics>>();
  const heldEvals = new Map<number, EvalMetrics>();
  const merged: MergedStep[] = [];
  let failure: RankFailure | undefined;
  let settle: () => void = () => {};
  const finished = new Promise<void>((resolve) => (settle = resolve));

  const stopAll = (): void => {
    for (const r of ranks) if (!r.exited) r.child.kill('SIGTERM');
    const timer = setTimeout(() => {
      for (const r of ranks) if (!r.exited) r.child.kill('SIGKILL');
    }, KILL_GRACE_MS);
    timer.unref();
  };
  const fail = (f: RankFailure, post: boolean): void => {
    if (failure) return;
    failure = f;
    if (post) void store.set(FAILURE_KEY, f.message).catch(() => {});
    stopAll();
    settle();
  };

  // another node's failure, or node 0's launcher gone
  void store
    .wait([FAILURE_KEY])
    .then(async () => {
      const msg = (await store.get(FAILURE_KEY))?.toString('utf8') ?? 'another node failed';
      fail(new RankFailure(msg, 1), false);
    })
    .catch(() => {});
  store.whenClosed(() => {
    if (failure || ranks.every((r) => r.exited)) return;
    // node 0 ends its store when its ranks are done; ours should be done soon after
    setTimeout(() => {
      if (!failure && !ranks.every((r) => r.exited))
        fail(
          new RankFailure(`the store at ${storeAddress} went away (node 0's launcher ended)`, 1),
          false,
        );
    }, 30_000).unref();
  });

  const onSignal = (sig: NodeJS.Signals): void => {
    fail(new RankFailure(`interrupted (${sig}): stopped every rank`, 130), true);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  for (let i = 0; i < o.nprocPerNode; i++) {
    const rank = o.nodeRank * o.nprocPerNode + i;
    const options: RankTrainOptions & { planDir: string } = {
      ...o.rankOptions,
      planDir: o.planDir,
      threads: o.rankOptions.threads ?? threads,
    };
    const child = spawn(process.execPath, [...execArgv, entry, JSON.stringify(options)], {
      env: {
        ...process.env,
        RANK: String(rank),
        WORLD_SIZE: String(world),
        LOCAL_RANK: String(i),
        LOCAL_WORLD_SIZE: String(o.nprocPerNode),
        MASTER_ADDR: masterHost,
        MASTER_PORT: String(masterPort),
        LFC_STORE: storeAddress,
        LFC_RUN_ID: runId,
        LFC_HOST: host,
        LFC_COLLECTIVE_TIMEOUT: String(o.collectiveTimeoutS),
        LFC_LAUNCHED: '1',
      },
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    });
    const r: Rank = {
      rank,
      child,
      log: createWriteStream(join(o.logDir, `rank-${rank}.log`)),
      lastLine: '',
      exited: false,
    };
    ranks.push(r);
    const keep = (chunk: Buffer): void => {
      r.log.write(chunk);
      r.lastLine = lastMessage(chunk.toString('utf8')) ?? r.lastLine;
    };
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    child.on('message', (m: RankMessage) => {
      if (m?.type === 'data') o.onData?.(m.rank, m.counts, m.position);
      if (m?.type === 'eval') {
        // after its step's line: held while that step waits on a rank
        if (steps.has(m.eval.step)) heldEvals.set(m.eval.step, m.eval);
        else o.onEval?.(m.eval);
      }
      if (m?.type !== 'step') return;
      let byRank = steps.get(m.metrics.step);
      if (!byRank) steps.set(m.metrics.step, (byRank = new Map()));
      byRank.set(m.rank, m.metrics);
      if (byRank.size === ranks.length) {
        const step = mergeStep([...byRank.entries()].sort(([a], [b]) => a - b));
        steps.delete(step.step);
        merged.push(step);
        o.onStep?.(step);
        const held = heldEvals.get(step.step);
        if (held) {
          heldEvals.delete(step.step);
          o.onEval?.(held);
        }
      }
    });
    child.on('error', (e) =>
      fail(new RankFailure(`rank ${rank} did not start: ${e.message}`, 1), true),
    );
    // 'close', not 'exit': the rank's last output (its error) has been read by then
    child.on('close', (code, signal) => {
      r.exited = true;
      r.log.end();
      if (code === 0) {
        if (ranks.every((x) => x.exited)) settle();
        return;
      }
      if (failure) {
        if (ranks.every((x) => x.exited)) settle();
        return;
      }
      const how = signal ? `was killed by ${signal}` : `exited with code ${code}`;
      const last = r.lastLine ? `; its last message: ${r.lastLine}` : '';
      fail(
        new RankFailure(
          `rank ${rank} ${how}${last} (log: ${join(o.logDir, `rank-${rank}.log`)})`,
          code === 2 ? 2 : 1,
        ),
        true,
      );
    });
  }

  // 3. the end: every rank done, or a failure and every rank stopped
  await finished;
  while (failure && !ranks.every((r) => r.exited)) await new Promise((r) => setTimeout(r, 50));
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  store.close();
  await server?.close();
  if (failure) throw failure;
  return merged;
}

/**
 * The last line of a rank's output that says something, without lfc's prefix; the frames of a
 * stack trace say where, not what, so the message is the line above them.
 */
export function lastMessage(text: string): string | undefined {
  const lines = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !/^at /.test(l));
  return lines.length ? lines[lines.length - 1].replace(/^lfc: (error: )?/, '') : undefined;
}

function mergeStep(byRank: readonly [number, StepMetrics][]): MergedStep {
  // the global figures are the same on every rank (summed over ranks); the time is the slowest's
  const [, first] = byRank[0];
  const stepMs = Math.max(...byRank.map(([, m]) => m.stepMs));
  return {
    ...first,
    stepMs,
    tokensPerSecond: (first.tokens * 1000) / Math.max(stepMs, 1e-3),
    peakRssBytes: Math.max(...byRank.map(([, m]) => m.peakRssBytes)),
    deviceHighBytes: Math.max(...byRank.map(([, m]) => m.deviceHighBytes)),
    scratchHighBytes: Math.max(...byRank.map(([, m]) => m.scratchHighBytes)),
    ranks: byRank.map(([rank, m]) => ({
      rank,
      stepMs: m.stepMs,
      peakRssBytes: m.peakRssBytes,
      deviceHighBytes: m.deviceHighBytes,
      scratchHighBytes: m.scratchHighBytes,
    })),
  };
}
