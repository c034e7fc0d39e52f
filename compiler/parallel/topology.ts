// Parallel topology: the rank grid of a layout and every process group as data.
//
// Ranks follow Megatron-LM's RankGenerator with order "tp-cp-ep-dp-pp", so a layout maps ranks
// exactly as Megatron would. Two grids share the ranks (the first dimension varies fastest):
//
//   decoder  rank = tp + T·(cp + C·(dp + D·pp))      T·C·D·P = world
//   expert   rank = etp + E·(ep + X·(edp + F·pp))    E·X·F·P = world  (MoE layers)
//
// A group of one kind is the set of ranks that differ only in that kind's coordinates. Groups are
// enumerated as Megatron's generate_masked_orthogonal_rank_groups does: instance j fixes the other
// coordinates to the j-th setting (first dimension fastest), and members are ordered by the
// group's own coordinates (first dimension fastest). `tp[3]` names instance 3 of the tp groups.
// Rank lists that two names share become one group with both names, so a runtime creates each
// communicator once.

import { resolveSizes, type ParallelSizes, type ResolvedSizes } from './sizes.js';
import { validateSizes } from './validate.js';

export type { ParallelSizes, ResolvedSizes } from './sizes.js';

/**
 * tp, cp, dp, pp: decoder grid; dp_cp: data and context together (gradient reduction);
 * mp: model-parallel ranks sharing a dp index (tp·cp·pp of them; Megatron's own mp group leaves cp
 * out, which only differs once cp > 1 is built); embd: first and last stage of each pipeline
 * (tied embeddings); etp, ep, edp: expert grid; world: every rank (the gradient norm and, under
 * full separation, the encoder's gradients); enc_tp: the vision encoder's TP groups, blocks of
 * encoderTp consecutive ranks inside each tp group (hetero TP; the tp groups themselves when the
 * encoder shares the decoder's TP); tp_dp_cp: every rank of one pipeline stage (the encoder's
 * gradients under hetero DP, where each TP rank encodes its own microbatches).
 */
export const GROUP_KINDS = [
  'tp',
  'cp',
  'dp',
  'dp_cp',
  'pp',
  'mp',
  'embd',
  'etp',
  'ep',
  'edp',
  'world',
  'enc_tp',
  'tp_dp_cp',
] as const;
export type GroupKind = (typeof GROUP_KINDS)[number];

export interface ProcessGroup {
  /** index in Topology.groups */
  readonly id: number;
  /** every name this rank list has, first-built first: ['dp[0]', 'dp_cp[0]', 'edp[0]'] */
  readonly names: readonly string[];
  /** the ranks in group order: ranks[i] is rank i of the group */
  readonly ranks: readonly number[];
}

export interface DecoderCoords {
  readonly tp: number;
  readonly cp: number;
  readonly dp: number;
  readonly pp: number;
}

export interface RankCoords extends DecoderCoords {
  readonly etp: number;
  readonly ep: number;
  readonly edp: number;
}

export interface Topology {
  readonly sizes: ResolvedSizes;
  readonly worldSize: number;
  /** decoder data parallelism: world / (tp · cp · pp) */
  readonly dp: number;
  /** expert data parallelism: world / (etp · ep · pp) */
  readonly edp: number;
  /** every distinct group, in build order (kinds in GROUP_KINDS order, instances in order) */
  readonly groups: readonly ProcessGroup[];
  coords(rank: number): RankCoords;
  /** the rank at decoder coordinates */
  rankOf(c: DecoderCoords): number;
  /** the group of this kind that holds the rank; middle pipeline stages have no embd group */
  groupOf(kind: 'embd', rank: number): ProcessGroup | undefined;
  groupOf(kind: Exclude<GroupKind, 'embd'>, rank: number): ProcessGroup;
  /** the instances of a kind in order: groupsOf('tp')[3] is tp[3] */
  groupsOf(kind: GroupKind): readonly ProcessGroup[];
  /** a group by any of its names ('tp[3]') */
  group(name: string): ProcessGroup | undefined;
}

interface Grids {
  /** sizes of [tp, cp, dp, pp] */
  readonly decoder: readonly number[];
  /** sizes of [etp, ep, edp, pp] */
  readonly expert: readonly number[];
  /** sizes of [encoder tp, tp / encoder tp, cp, dp, pp]: the decoder grid with tp cut in two */
  readonly encoder: readonly number[];
}

/**
 * How each kind's rank lists are made: the grid dimensions (by index) that vary inside a group,
 * or, for embd, the first and last rank of each pipeline group.
 */
const KIND_GROUPS = {
  tp: (g) => orthogonalGroups(g.decoder, [0]),
  cp: (g) => orthogonalGroups(g.decoder, [1]),
  dp: (g) => orthogonalGroups(g.decoder, [2]),
  dp_cp: (g) => orthogonalGroups(g.decoder, [1, 2]),
  pp: (g) => orthogonalGroups(g.decoder, [3]),
  mp: (g) => orthogonalGroups(g.decoder, [0, 1, 3]),
  embd: (_, built) =>
    built('pp').map(({ ranks }) =>
      ranks.length === 1 ? [ranks[0]] : [ranks[0], ranks[ranks.length - 1]],
    ),
  etp: (g) => orthogonalGroups(g.expert, [0]),
  ep: (g) => orthogonalGroups(g.expert, [1]),
  edp: (g) => orthogonalGroups(g.expert, [2]),
  world: (g) => orthogonalGroups(g.decoder, [0, 1, 2, 3]),
  enc_tp: (g) => orthogonalGroups(g.encoder, [0]),
  tp_dp_cp: (g) => orthogonalGroups(g.decoder, [0, 1, 2]),
} satisfies Record<
  GroupKind,
  (grids: Grids, built: (kind: GroupKind) => readonly ProcessGroup[]) => number[][]
>;

/**
 * Megatron's generate_masked_orthogonal_rank_groups over a grid (first dimension fastest): one
 * group per setting of the dimensions not in `dims`, members ordered by the dimensions in `dims`.
 */
export function orthogonalGroups(shape: readonly number[], dims: readonly number[]): number[][] {
  const stride: number[] = [];
  let world = 1;
  for (const n of shape) {
    stride.push(world);
    world *= n;
  }
  const outside = shape.map((_, i) => i).filter((i) => !dims.includes(i));
  // offsets of the members relative to the group's first rank, first masked dimension fastest
  let offsets = [0];
  for (const d of dims) {
    const next: number[] = [];
    for (let c = 0; c < shape[d]; c++) for (const o of offsets) next.push(o + c * stride[d]);
    offsets = next;
  }
  const groups: number[][] = [];
  for (let g = 0; g < world / offsets.length; g++) {
    let base = 0;
    let rest = g;
    for (const d of outside) {
      base += (rest % shape[d]) * stride[d];
      rest = Math.floor(rest / shape[d]);
    }
    const ranks = new Array<number>(offsets.length);
    for (let i = 0; i < offsets.length; i++) ranks[i] = base + offsets[i];
    groups.push(ranks);
  }
  return groups;
}

/** Builds the rank grids and every group; bad sizes are a UserError naming the layout rule. */
export function buildTopology(s: ParallelSizes): Topology {
  validateSizes(s);
  const sizes = resolveSizes(s);
  const { world } = sizes;
  const grids: Grids = {
    decoder: [sizes.tp, sizes.cp, sizes.dp, sizes.pp],
    expert: [sizes.etp, sizes.ep, sizes.edp, sizes.pp],
    encoder: [sizes.encoderTp, sizes.tp / sizes.encoderTp, sizes.cp, sizes.dp, sizes.pp],
  };

  const groups: { id: number; names: string[]; ranks: number[] }[] = [];
  /** dedup buckets by (first rank, size); rank lists are compared element by element within one */
  const buckets = new Map<number, number[]>();
  const instances = new Map<GroupKind, ProcessGroup[]>();
  /** per kind: rank → instance index (−1: in none) */
  const instanceOfRank = new Map<GroupKind, Int32Array>();

  const sameRanks = (a: readonly number[], b: readonly number[]): boolean => {
    if (a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
    return true;
  };
  const add = (kind: GroupKind, lists: number[][]): void => {
    const index = new Int32Array(world).fill(-1);
    const list: ProcessGroup[] = [];
    for (let i = 0; i < lists.length; i++) {
      const ranks = lists[i];
      const key = ranks[0] * (world + 1) + ranks.length;
      let bucket = buckets.get(key);
      if (!bucket) buckets.set(key, (bucket = []));
      const found = bucket.find((id) => sameRanks(groups[id].ranks, ranks));
      let group = found === undefined ? undefined : groups[found];
      if (!group) {
        group = { id: groups.length, names: [], ranks };
        groups.push(group);
        bucket.push(group.id);
      }
      group.names.push(`${kind}[${i}]`);
      for (const r of ranks) index[r] = i;
      list.push(group);
    }
    instances.set(kind, list);
    instanceOfRank.set(kind, index);
  };

  const built = (kind: GroupKind): readonly ProcessGroup[] => instances.get(kind)!;
  for (const kind of GROUP_KINDS) add(kind, KIND_GROUPS[kind](grids, built));

  const checkRank = (rank: number): void => {
    if (!Number.isInteger(rank) || rank < 0 || rank >= world) {
      throw new RangeError(`rank ${rank} is outside the world of ${world} ranks`);
    }
  };

  function groupOf(kind: 'embd', rank: number): ProcessGroup | undefined;
  function groupOf(kind: Exclude<GroupKind, 'embd'>, rank: number): ProcessGroup;
  function groupOf(kind: GroupKind, rank: number): ProcessGroup | undefined {
    checkRank(rank);
    const i = instanceOfRank.get(kind)![rank];
    return i < 0 ? undefined : instances.get(kind)![i];
  }

  return {
    sizes,
    worldSize: world,
    dp: sizes.dp,
    edp: sizes.edp,
    groups,
    coords(rank) {
      checkRank(rank);
      const { tp, cp, dp, etp, ep, edp } = sizes;
      return {
        tp: rank % tp,
        cp: Math.floor(rank / tp) % cp,
        dp: Math.floor(rank / (tp * cp)) % dp,
        pp: Math.floor(rank / (tp * cp * dp)),
        etp: rank % etp,
        ep: Math.floor(rank / etp) % ep,
        edp: Math.floor(rank / (etp * ep)) % edp,
      };
    },
    rankOf(c) {
      const { tp, cp, dp, pp } = sizes;
      const within = (n: number, size: number): boolean =>
        Number.isInteger(n) && n >= 0 && n < size;
      if (!within(c.tp, tp) || !within(c.cp, cp) || !within(c.dp, dp) || !within(c.pp, pp)) {
        throw new RangeError(`coordinates ${JSON.stringify(c)} are outside the decoder grid`);
      }
      return c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp));
    },
    groupOf,
    groupsOf: (kind) => instances.get(kind)!,
    group(name) {
      const m = /^([a-z_]+)\[(\d+)\]$/.exec(name);
      return m ? instances.get(m[1] as GroupKind)?.[Number(m[2])] : undefined;
    },
  };
}
