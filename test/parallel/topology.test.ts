// Rank grids and process groups against lists written out by hand from Megatron's order
// (decoder: rank = tp + T·(cp + C·(dp + D·pp)); experts: rank = etp + E·(ep + X·(edp + F·pp));
// instance j of a kind fixes the other coordinates to their j-th setting, first one fastest).
// None of the expected lists below is computed by the code under test.
import { describe, expect, it } from 'vitest';
import { UserError } from '../../compiler/errors.js';
import {
  buildTopology,
  GROUP_KINDS,
  type GroupKind,
  type ParallelSizes,
  type RankCoords,
  type Topology,
} from '../../compiler/parallel/topology.js';

function sizes(s: Partial<ParallelSizes>): ParallelSizes {
  return { nnodes: 1, nprocPerNode: 8, tp: 1, pp: 1, vpp: 1, ep: 1, cp: 1, ...s };
}

function lists(t: Topology, kind: GroupKind): number[][] {
  return t.groupsOf(kind).map((g) => [...g.ranks]);
}

/** rank lists written as text: groups separated by '|', ranks by spaces */
function g(text: string): number[][] {
  return text.split('|').map((group) => group.trim().split(/\s+/).map(Number));
}

/** every rank alone: the groups of a kind whose size is 1 */
function singles(n: number): number[][] {
  return Array.from({ length: n }, (_, r) => [r]);
}

interface Layout {
  readonly why: string;
  readonly sizes: ParallelSizes;
  readonly dp: number;
  readonly edp: number;
  readonly groups: Partial<Record<GroupKind, number[][]>>;
  readonly coords: Record<number, Omit<RankCoords, 'cp'>>;
}

const LAYOUTS: readonly Layout[] = [
  {
    why: '8 ranks, tp 2, pp 2 → dp 2',
    sizes: sizes({ tp: 2, pp: 2 }),
    dp: 2,
    edp: 2,
    groups: {
      tp: g('0 1 | 2 3 | 4 5 | 6 7'),
      dp: g('0 2 | 1 3 | 4 6 | 5 7'),
      pp: g('0 4 | 1 5 | 2 6 | 3 7'),
      mp: g('0 1 4 5 | 2 3 6 7'),
      embd: g('0 4 | 1 5 | 2 6 | 3 7'),
      etp: g('0 1 | 2 3 | 4 5 | 6 7'),
      ep: singles(8),
      edp: g('0 2 | 1 3 | 4 6 | 5 7'),
    },
    coords: {
      5: { tp: 1, dp: 0, pp: 1, etp: 1, ep: 0, edp: 0 },
      6: { tp: 0, dp: 1, pp: 1, etp: 0, ep: 0, edp: 1 },
    },
  },
  {
    why: '8 ranks, tp 2, pp 1 → dp 4',
    sizes: sizes({ tp: 2 }),
    dp: 4,
    edp: 4,
    groups: {
      tp: g('0 1 | 2 3 | 4 5 | 6 7'),
      dp: g('0 2 4 6 | 1 3 5 7'),
      pp: singles(8),
      mp: g('0 1 | 2 3 | 4 5 | 6 7'),
      embd: singles(8),
      etp: g('0 1 | 2 3 | 4 5 | 6 7'),
      ep: singles(8),
      edp: g('0 2 4 6 | 1 3 5 7'),
    },
    coords: {
      7: { tp: 1, dp: 3, pp: 0, etp: 1, ep: 0, edp: 3 },
      2: { tp: 0, dp: 1, pp: 0, etp: 0, ep: 0, edp: 1 },
    },
  },
  {
    why: '8 ranks, tp 1, pp 2, ep 4 → dp 4, edp 1',
    sizes: sizes({ pp: 2, ep: 4 }),
    dp: 4,
    edp: 1,
    groups: {
      tp: singles(8),
      dp: g('0 1 2 3 | 4 5 6 7'),
      pp: g('0 4 | 1 5 | 2 6 | 3 7'),
      mp: g('0 4 | 1 5 | 2 6 | 3 7'),
      embd: g('0 4 | 1 5 | 2 6 | 3 7'),
      etp: singles(8),
      ep: g('0 1 2 3 | 4 5 6 7'),
      edp: singles(8),
    },
    coords: {
      6: { tp: 0, dp: 2, pp: 1, etp: 0, ep: 2, edp: 0 },
      3: { tp: 0, dp: 3, pp: 0, etp: 0, ep: 3, edp: 0 },
    },
  },
  {
    why: '2 nodes × 8, tp 2, pp 2, vpp 2, ep 2, etp 2 → dp 4, edp 2',
    sizes: sizes({ nnodes: 2, tp: 2, pp: 2, vpp: 2, ep: 2, etp: 2 }),
    dp: 4,
    edp: 2,
    groups: {
      tp: g('0 1 | 2 3 | 4 5 | 6 7 | 8 9 | 10 11 | 12 13 | 14 15'),
      dp: g('0 2 4 6 | 1 3 5 7 | 8 10 12 14 | 9 11 13 15'),
      pp: g('0 8 | 1 9 | 2 10 | 3 11 | 4 12 | 5 13 | 6 14 | 7 15'),
      mp: g('0 1 8 9 | 2 3 10 11 | 4 5 12 13 | 6 7 14 15'),
      embd: g('0 8 | 1 9 | 2 10 | 3 11 | 4 12 | 5 13 | 6 14 | 7 15'),
      etp: g('0 1 | 2 3 | 4 5 | 6 7 | 8 9 | 10 11 | 12 13 | 14 15'),
      ep: g('0 2 | 1 3 | 4 6 | 5 7 | 8 10 | 9 11 | 12 14 | 13 15'),
      edp: g('0 4 | 1 5 | 2 6 | 3 7 | 8 12 | 9 13 | 10 14 | 11 15'),
    },
    coords: {
      13: { tp: 1, dp: 2, pp: 1, etp: 1, ep: 0, edp: 1 },
      6: { tp: 0, dp: 3, pp: 0, etp: 0, ep: 1, edp: 1 },
    },
  },
  {
    why: '8 ranks, tp 2, ep 2, etp 1 → dp 4, edp 4 (ep groups fall on tp groups)',
    sizes: sizes({ tp: 2, ep: 2, etp: 1 }),
    dp: 4,
    edp: 4,
    groups: {
      tp: g('0 1 | 2 3 | 4 5 | 6 7'),
      dp: g('0 2 4 6 | 1 3 5 7'),
      pp: singles(8),
      mp: g('0 1 | 2 3 | 4 5 | 6 7'),
      embd: singles(8),
      etp: singles(8),
      ep: g('0 1 | 2 3 | 4 5 | 6 7'),
      edp: g('0 2 4 6 | 1 3 5 7'),
    },
    coords: {
      5: { tp: 1, dp: 2, pp: 0, etp: 0, ep: 1, edp: 2 },
    },
  },
  {
    why: '8 ranks, tp 4, ep 2, etp 1 → dp 2, edp 4',
    sizes: sizes({ tp: 4, ep: 2, etp: 1 }),
    dp: 2,
    edp: 4,
    groups: {
      tp: g('0 1 2 3 | 4 5 6 7'),
      dp: g('0 4 | 1 5 | 2 6 | 3 7'),
      pp: singles(8),
      mp: g('0 1 2 3 | 4 5 6 7'),
      embd: singles(8),
      etp: singles(8),
      ep: g('0 1 | 2 3 | 4 5 | 6 7'),
      edp: g('0 2 4 6 | 1 3 5 7'),
    },
    coords: {
      6: { tp: 2, dp: 1, pp: 0, etp: 0, ep: 0, edp: 3 },
    },
  },
  {
    why: 'the Qwen3-VL line: 4 nodes × 8, tp 1, pp 2, ep 8, vpp 2 → dp 16, edp 2',
    sizes: sizes({ nnodes: 4, pp: 2, ep: 8, vpp: 2 }),
    dp: 16,
    edp: 2,
    groups: {
      tp: singles(32),
      dp: g(`0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 |
             16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31`),
      pp: g(`0 16 | 1 17 | 2 18 | 3 19 | 4 20 | 5 21 | 6 22 | 7 23 |
             8 24 | 9 25 | 10 26 | 11 27 | 12 28 | 13 29 | 14 30 | 15 31`),
      mp: g(`0 16 | 1 17 | 2 18 | 3 19 | 4 20 | 5 21 | 6 22 | 7 23 |
             8 24 | 9 25 | 10 26 | 11 27 | 12 28 | 13 29 | 14 30 | 15 31`),
      embd: g(`0 16 | 1 17 | 2 18 | 3 19 | 4 20 | 5 21 | 6 22 | 7 23 |
               8 24 | 9 25 | 10 26 | 11 27 | 12 28 | 13 29 | 14 30 | 15 31`),
      etp: singles(32),
      ep: g(
        '0 1 2 3 4 5 6 7 | 8 9 10 11 12 13 14 15 | 16 17 18 19 20 21 22 23 | 24 25 26 27 28 29 30 31',
      ),
      edp: g(`0 8 | 1 9 | 2 10 | 3 11 | 4 12 | 5 13 | 6 14 | 7 15 |
              16 24 | 17 25 | 18 26 | 19 27 | 20 28 | 21 29 | 22 30 | 23 31`),
    },
    coords: {
      27: { tp: 0, dp: 11, pp: 1, etp: 0, ep: 3, edp: 1 },
      9: { tp: 0, dp: 9, pp: 0, etp: 0, ep: 1, edp: 1 },
    },
  },
  {
    why: '6 ranks, pp 3 → dp 2: embd holds the first and last stage only',
    sizes: sizes({ nprocPerNode: 6, pp: 3 }),
    dp: 2,
    edp: 2,
    groups: {
      tp: singles(6),
      dp: g('0 1 | 2 3 | 4 5'),
      pp: g('0 2 4 | 1 3 5'),
      mp: g('0 2 4 | 1 3 5'),
      embd: g('0 4 | 1 5'),
      etp: singles(6),
      ep: singles(6),
      edp: g('0 1 | 2 3 | 4 5'),
    },
    coords: {
      3: { tp: 0, dp: 1, pp: 1, etp: 0, ep: 0, edp: 1 },
    },
  },
];

describe.each(LAYOUTS.map((l) => [l.why, l] as const))('%s', (_, l) => {
  const t = buildTopology(l.sizes);

  it('derives world, dp and edp', () => {
    expect(t.worldSize).toBe(l.sizes.nnodes * l.sizes.nprocPerNode);
    expect([t.dp, t.edp]).toEqual([l.dp, l.edp]);
    expect(t.sizes.vpp).toBe(l.sizes.vpp);
  });

  it.each(Object.keys(l.groups) as GroupKind[])('%s groups', (kind) => {
    expect(lists(t, kind)).toEqual(l.groups[kind]);
    t.groupsOf(kind).forEach((g, i) => expect(t.group(`${kind}[${i}]`)).toBe(g));
  });

  it('without context parallelism, cp groups are single ranks and dp_cp is dp', () => {
    expect(lists(t, 'cp')).toEqual(singles(t.worldSize));
    expect(lists(t, 'dp_cp')).toEqual(l.groups.dp);
  });

  it('coords and groupOf agree with the hand-derived coordinates', () => {
    for (const [rank, c] of Object.entries(l.coords)) {
      const r = Number(rank);
      expect(t.coords(r)).toEqual({ ...c, cp: 0 });
      expect(t.rankOf({ ...c, cp: 0 })).toBe(r);
      expect(t.groupOf('tp', r).ranks).toEqual(l.groups.tp![Math.floor(r / l.sizes.tp)]);
      expect(t.groupOf('ep', r).ranks).toContain(r);
      expect(t.groupOf('edp', r).ranks).toContain(r);
    }
  });

  it('has each distinct rank list once', () => {
    const keys = t.groups.map((g) => g.ranks.join(','));
    expect(new Set(keys).size).toBe(keys.length);
    t.groups.forEach((g, i) => expect(g.id).toBe(i));
  });
});

describe('deduplication', () => {
  // tp 2, pp 1, ep 2, etp 1 on 8 ranks: mp, etp… fall onto the same rank lists as other kinds
  const t = buildTopology(sizes({ tp: 2, ep: 2, etp: 1 }));

  it('one group per distinct rank list, with every name as an alias', () => {
    // [2i, 2i+1]: tp, mp, ep; [r]: cp, pp, embd, etp; the dp halves: dp, dp_cp, edp; world
    expect(t.groups.length).toBe(4 + 8 + 2 + 1);
    expect(t.group('world[0]')!.ranks).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(t.group('tp[1]')!.names).toEqual(['tp[1]', 'mp[1]', 'ep[1]', 'enc_tp[1]']);
    expect(t.group('world[0]')!.names).toEqual(['world[0]', 'tp_dp_cp[0]']);
    expect(t.group('etp[3]')!.names).toEqual(['cp[3]', 'pp[3]', 'embd[3]', 'etp[3]']);
    expect(t.group('edp[0]')!.names).toEqual(['dp[0]', 'dp_cp[0]', 'edp[0]']);
    expect(t.group('ep[1]')).toBe(t.group('tp[1]'));
    expect(t.groupOf('edp', 5)).toBe(t.groupOf('dp', 5));
    expect(t.groupOf('ep', 5).ranks).toEqual([4, 5]);
  });

  it('rank lists in a different order stay distinct groups', () => {
    // tp 2, pp 2: mp[0] is [0, 1, 4, 5]; no other kind has those ranks, and dp [0, 2] ≠ tp [0, 1]
    const u = buildTopology(sizes({ tp: 2, pp: 2 }));
    expect(u.group('mp[0]')!.names).toEqual(['mp[0]']);
    expect(u.group('dp[0]')).not.toBe(u.group('tp[0]'));
  });

  it('unknown names and middle stages have no group', () => {
    expect(t.group('tp[4]')).toBeUndefined();
    expect(t.group('xp[0]')).toBeUndefined();
    const u = buildTopology(sizes({ nprocPerNode: 6, pp: 3 }));
    expect(u.groupOf('embd', 2)).toBeUndefined();
    expect(u.groupOf('embd', 4)!.ranks).toEqual([0, 4]);
  });
});

describe('1024 ranks: 128 nodes × 8, tp 4, pp 8, ep 16 → dp 32, edp 2', () => {
  const t = buildTopology(sizes({ nnodes: 128, tp: 4, pp: 8, ep: 16 }));
  /** group size and count of each kind, by hand: tp 4 × 256, ep 16 × 64, edp 1024/(4·16·8) = 2 */
  const expected: Record<GroupKind, [size: number, count: number]> = {
    tp: [4, 256],
    cp: [1, 1024],
    dp: [32, 32],
    dp_cp: [32, 32],
    pp: [8, 128],
    mp: [32, 32],
    embd: [2, 128],
    etp: [4, 256],
    ep: [16, 64],
    edp: [2, 512],
    world: [1024, 1],
    enc_tp: [4, 256],
    tp_dp_cp: [128, 8],
  };

  it('derives dp 32 and edp 2', () => {
    expect([t.worldSize, t.dp, t.edp]).toEqual([1024, 32, 2]);
  });

  it.each(GROUP_KINDS)('%s: sizes, and every rank in exactly one group', (kind) => {
    const [size, count] = expected[kind];
    const groups = t.groupsOf(kind);
    expect(groups.length).toBe(count);
    expect(groups.every((g) => g.ranks.length === size)).toBe(true);
    const seen = new Array<number>(1024).fill(0);
    for (const g of groups) for (const r of g.ranks) seen[r]++;
    // embd holds the first and last pipeline stage (pp coordinate 0 or 7: ranks 0–127 and 896–1023) only
    const expectedSeen = (r: number): number => (kind !== 'embd' || r < 128 || r >= 896 ? 1 : 0);
    expect(seen.every((n, r) => n === expectedSeen(r))).toBe(true);
  });

  it('members of a group differ only in that kind’s coordinates, in order', () => {
    const varies: Partial<Record<GroupKind, (keyof RankCoords)[]>> = {
      tp: ['tp'],
      dp: ['dp'],
      pp: ['pp'],
      etp: ['etp'],
      ep: ['ep'],
      edp: ['edp'],
    };
    const wrong: string[] = [];
    for (const [kind, keys] of Object.entries(varies) as [GroupKind, (keyof RankCoords)[]][]) {
      const grid: (keyof RankCoords)[] = ['etp', 'ep', 'edp'].includes(keys[0])
        ? ['etp', 'ep', 'edp', 'pp']
        : ['tp', 'cp', 'dp', 'pp'];
      for (const g of t.groupsOf(kind)) {
        const first = t.coords(g.ranks[0]);
        g.ranks.forEach((r, i) => {
          const c = t.coords(r);
          for (const k of grid) {
            if (c[k] !== (keys.includes(k) ? i : first[k])) wrong.push(`${g.names[0]}: rank ${r}`);
          }
        });
      }
    }
    expect(wrong).toEqual([]);
  });

  it('rankOf inverts coords', () => {
    const ranks = Array.from({ length: 1024 }, (_, r) => r);
    expect(ranks.map((r) => t.rankOf(t.coords(r)))).toEqual(ranks);
  });
});

describe('refusals', () => {
  it('context parallelism is refused', () => {
    expect(() => buildTopology(sizes({ cp: 2 }))).toThrow(
      new UserError(
        'invalid layout (cp-unsupported): context parallelism (--context-parallel-size 2) is not supported yet',
      ),
    );
  });

  it('a world the grid does not divide is refused', () => {
    expect(() => buildTopology(sizes({ nprocPerNode: 6, tp: 4 }))).toThrow(
      'invalid layout (world-decoder-grid)',
    );
    expect(() => buildTopology(sizes({ pp: 2, ep: 8 }))).toThrow(
      'invalid layout (world-expert-grid)',
    );
  });

  it('ranks outside the world are a programming error', () => {
    const t = buildTopology(sizes({ tp: 2 }));
    expect(() => t.coords(8)).toThrow(RangeError);
    expect(() => t.groupOf('tp', -1)).toThrow(RangeError);
  });
});
