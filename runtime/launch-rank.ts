// What one rank of a multi-rank run knows about the job: its rank and the world size, where the
// ranks meet (the rendezvous store), and from the plan the communicators it opens.
//
// A rank learns who it is from its environment, set by lfc's launcher (`lfc run --nproc-per-node`)
// or a cluster manager: torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, or
// Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (with MASTER_ADDR / MASTER_PORT for the
// store). lfc's launcher adds LFC_STORE (the store it hosts), LFC_RUN_ID and
// LFC_COLLECTIVE_TIMEOUT; without LFC_STORE, rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.

import { createSocket } from 'node:dgram';
import { UserError } from '../compiler/errors.js';
import type { PlanFile, ProgramFile } from '../compiler/plan/format.js';
import { COLLECTIVE_OPS } from '../ir/ops.js';
import type { NativeCommConfig, NativeCommContext } from './native.js';

/** torchrun's default store port */
export const DEFAULT_MASTER_PORT = 29500;
export const DEFAULT_COLLECTIVE_TIMEOUT_S = 300;

export interface RankContext {
  readonly rank: number;
  readonly worldSize: number;
  readonly localRank: number;
  /** `tcp:HOST:PORT` or `file:DIR` */
  readonly store: string;
  /** store keys of this run start with it */
  readonly prefix: string;
  /** the address the ranks connect to this one at */
  readonly host: string;
  readonly timeoutMs: number;
  /** rank 0 hosts the store (no lfc launcher started the ranks) */
  readonly hostsStore: boolean;
  /** an lfc launcher is the parent: report steps and failures to it over IPC */
  readonly launched: boolean;
}

type Env = Readonly<Record<string, string | undefined>>;

function intVar(env: Env, name: string): number | undefined {
  const v = env[name];
  if (v === undefined || v === '') return undefined;
  if (!/^\d+$/.test(v)) throw new UserError(`${name}=${v} is not a non-negative integer`);
  return Number(v);
}

/** This process's place in a multi-rank run, or undefined when it runs alone. */
export async function rankFromEnv(env: Env = process.env): Promise<RankContext | undefined> {
  const torch = intVar(env, 'RANK') !== undefined;
  const rank = intVar(env, 'RANK') ?? intVar(env, 'SLURM_PROCID');
  const worldSize = intVar(env, torch ? 'WORLD_SIZE' : 'SLURM_NTASKS');
  if (rank === undefined || worldSize === undefined || worldSize <= 1) return undefined;
  if (rank >= worldSize)
    throw new UserError(`rank ${rank} is out of range for world size ${worldSize}`);
  const localRank = intVar(env, torch ? 'LOCAL_RANK' : 'SLURM_LOCALID') ?? 0;
  const multiNode = (intVar(env, 'SLURM_NNODES') ?? 1) > 1;
  if (env.MASTER_ADDR === undefined && multiNode && !env.LFC_STORE)
    throw new UserError(
      'a multi-node run needs MASTER_ADDR (the address of the node of rank 0) and MASTER_PORT',
    );
  const masterAddr = env.MASTER_ADDR ?? '127.0.0.1';
  const masterPort = intVar(env, 'MASTER_PORT') ?? DEFAULT_MASTER_PORT;
  const timeoutS = Number(env.LFC_COLLECTIVE_TIMEOUT ?? DEFAULT_COLLECTIVE_TIMEOUT_S);
  if (!(timeoutS > 0))
    throw new UserError(`LFC_COLLECTIVE_TIMEOUT=${env.LFC_COLLECTIVE_TIMEOUT} is not positive`);
  return {
    rank,
    worldSize,
    localRank,
    store: env.LFC_STORE ?? `tcp:${masterAddr}:${masterPort}`,
    prefix: env.LFC_RUN_ID ?? env.SLURM_JOB_ID ?? 'lfc',
    host: env.LFC_HOST ?? (await localAddressToward(masterAddr)),
    timeoutMs: Math.round(timeoutS * 1000),
    hostsStore: env.LFC_STORE === undefined && rank === 0,
    launched: env.LFC_LAUNCHED === '1' && typeof process.send === 'function',
  };
}

/** The local address whose route reaches `host` (loopback for a local host). */
export async function localAddressToward(host: string): Promise<string> {
  if (host === 'localhost' || host.startsWith('127.')) return '127.0.0.1';
  const sock = createSocket(host.includes(':') ? 'udp6' : 'udp4');
  try {
    // a UDP "connect" sends nothing; it only picks the route
    await new Promise<void>((resolve, reject) => {
      sock.once('error', reject);
      sock.connect(9, host, () => resolve());
    });
    return sock.address().address;
  } catch {
    return '127.0.0.1';
  } finally {
    sock.close();
  }
}

/**
 * The communicators of a run: every (group, stream) that some rank's collectives use. Every rank
 * computes the same list from the plan, and opens those of its groups.
 */
export function commContexts(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
): NativeCommContext[] {
  const collective = new Set<string>(COLLECTIVE_OPS);
  const seen = new Map<string, NativeCommContext>();
  plan.rankPrograms.forEach((id, rank) => {
    for (const ins of programs.get(id)!.instructions) {
      if (!collective.has(ins.op)) continue;
      const kind = ins.attrs.group as string;
      const group = plan.rankGroups[kind]?.[rank];
      if (group === undefined)
        throw new UserError(
          `program ${id}: a ${ins.op} names group kind '${kind}', which plan.json's rankGroups lacks`,
        );
      const stream = ins.stream as NativeCommContext['stream'];
      seen.set(`${group}/${stream}`, { group, stream });
    }
  });
  return [...seen.values()].sort((a, b) => a.group - b.group || a.stream.localeCompare(b.stream));
}

export function commConfig(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  r: RankContext,
): NativeCommConfig {
  return {
    rank: r.rank,
    worldSize: r.worldSize,
    store: r.store,
    prefix: r.prefix,
    host: r.host,
    groups: plan.groups,
    rankGroups: plan.rankGroups,
    contexts: commContexts(plan, programs),
    timeoutMs: r.timeoutMs,
  };
}

/**
 * Whether this rank speaks for its data-parallel index in a sum over the global batch: the lowest
 * rank with that index whose program `has` the thing summed (data inputs, a loss output). Sums of
 * loss tokens and losses then add each microbatch once, whatever the replication inside a
 * data-parallel index (tensor-parallel replicas, pipeline stages without a loss).
 */
export function speaksForItsData(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  rank: number,
  has: (program: ProgramFile) => boolean,
): boolean {
  const dp = plan.dataParallel.rankIndex;
  const first = plan.rankPrograms.findIndex(
    (id, r) => dp[r] === dp[rank] && has(programs.get(id)!),
  );
  return first === rank;
}
